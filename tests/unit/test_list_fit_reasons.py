"""`list` says why FITS is not yes (issue 28, item 6): each `no`/`?` cell carries the mark of its reason and each
distinct reason is one footnote under the table (stderr, with the other notes) — the words of `--json`'s
`fits_reason`, of the dashboard's line and of the page (app/library_words.py). A plain `list` answered from
the stored rows (cli/catalog_list.py, app/library_cache.py) says them too, without loading the catalog."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tests.unit.recipe_helpers import REPO

MARKS = "¹²³⁴⁵⁶⁷⁸⁹⁰"
SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")
FOOTNOTE = re.compile(rf"^(?:FITS|    ) ([{MARKS}]+) (.+)$", re.MULTILINE)
LOADED = ("import sys, runpy\n"
          "sys.argv = ['metralectl', *sys.argv[1:]]\n"
          "try:\n    runpy.run_module('metralectl', run_name='__main__')\n"
          "except SystemExit:\n    pass\n"
          "print('LOADED=' + ','.join(m for m in ('metralectl.core.catalog', 'metralectl.app.library', 'yaml') "
          "if m in sys.modules), file=sys.stderr)\n")


def cli(*args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "metralectl", *args]
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})


def check_table(out: subprocess.CompletedProcess[str], hardware: str) -> int:
    """Every FITS cell against --json: `no`/`?` with the mark of a footnote that is its reason; `yes` bare."""
    assert out.returncode == 0, out.stderr
    notes = {mark: words for mark, words in FOOTNOTE.findall(out.stderr)}
    # ¹, ², … ⁹, ¹⁰, … in order, each once (ten reasons since a tenth engine's recipes)
    assert list(notes) == [str(i + 1).translate(SUPERSCRIPT) for i in range(len(notes))], out.stderr
    assert len(set(notes.values())) == len(notes)  # one footnote per distinct reason
    judged = {r["name"]: r for r in json.loads(cli("list", "--json", "--hardware", hardware).stdout)["recipes"]}
    lines = out.stdout.splitlines()
    header = lines[0].replace("MEM GB", "MEM_GB").replace("TOK/S", "TOK_S").split()
    used = set()
    for line in lines[1:]:
        cells = line.split()
        row = judged[cells[0]]
        fits = cells[header.index("FITS")]  # the columns before it hold no spaces
        if row["fits"] is True:
            assert fits == "yes", line
            continue
        value, mark = fits.rstrip(MARKS), fits[len(fits.rstrip(MARKS)):]
        assert value == ("no" if row["fits"] is False else "?"), line
        assert notes[mark] == row["fits_reason"], (line, notes)
        used.add(mark)
    assert used == set(notes)  # no footnote without a row that points at it
    return len(notes)


def test_every_no_and_question_mark_points_at_its_reason() -> None:
    assert check_table(cli("list", "--hardware", "gb10"), "gb10") >= 3  # two nodes, another class, memory unknown
    hopper = cli("list", "--hardware", "hopper")
    check_table(hopper, "hopper")
    assert "FITS ¹ " in hopper.stderr and "built for gb10, this is hopper" in hopper.stderr


def test_the_stored_rows_say_the_same_without_the_catalog() -> None:
    first = cli("list", "--hardware", "gb10")  # computes the rows from the catalog and stores them
    warm = cli("list", "--hardware", "gb10", code=LOADED)
    assert warm.stderr.rsplit("LOADED=", 1)[1].strip() == ""  # neither the catalog nor YAML nor the row code
    assert warm.stdout == first.stdout
    assert FOOTNOTE.findall(warm.stderr) == FOOTNOTE.findall(first.stderr) != []


def test_the_stored_rows_are_keyed_on_every_module_that_computes_a_row() -> None:
    """A row is built from the hardware class, the model and the image of a recipe (app/library.py); a change
    to the code of any of them must make the stored rows miss, never answer with the old wording."""
    from metralectl.app import library, library_cache
    from metralectl.core import fit, recipe
    from metralectl.core.hardware import HardwareClass
    from metralectl.core.image_info import ImageInfo
    from metralectl.core.model_info import ModelInfo

    package = library_cache._PACKAGE
    computing = {library.__file__, fit.__file__, recipe.__file__,
                 *(sys.modules[t.__module__].__file__ for t in (HardwareClass, ModelInfo, ImageInfo))}
    keyed = {str(package / name) for name in library_cache._CODE}
    assert {str(f) for f in computing} <= keyed
