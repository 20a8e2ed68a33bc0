"""cli/entry.py's fast answers (`--version`, cached `--help`, plain `list`) against the Typer app itself.

Each case runs twice as a real process: once through cli/main.py (Click and Typer, as before the fast
paths existed) and once through `python -m metralectl` (cli/entry.py); stdout, stderr and the exit
code must be the same bytes. Speed is measured in benchmarks/cold_start.py, not here.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.recipe_helpers import REPO

FULL = "import sys\nfrom metralectl.cli.main import main\nmain(sys.argv[1:])\n"
LOADED = ("import sys, runpy\n"
          "sys.argv = ['metralectl', *sys.argv[1:]]\n"
          "try:\n    runpy.run_module('metralectl', run_name='__main__')\n"
          "except SystemExit:\n    pass\n"
          "print('LOADED=' + ','.join(m for m in ('click', 'typer', 'yaml') if m in sys.modules), file=sys.stderr)\n")


def run(code: str | None, args: list[str], columns: str = "100") -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "metralectl", *args]
    env = {**os.environ, "COLUMNS": columns}
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=120)


def loaded(args: list[str]) -> str:
    out = run(LOADED, args)
    return out.stderr.rsplit("LOADED=", 1)[1].strip()


def same(left: subprocess.CompletedProcess[str], right: subprocess.CompletedProcess[str]) -> None:
    assert (left.returncode, left.stdout, left.stderr) == (right.returncode, right.stdout, right.stderr)


@pytest.mark.parametrize("args", [
    ["--version"], ["list"], ["list", "--json"], ["list", "--hardware", "hopper", "--only"],
    ["list", "--hardware=hopper", "--tag", "ep2", "--json"], ["list", "--tag=", "--json"],
    ["list", "--hardware", "h100"],  # a MetralError through the shared boundary: its code, the same words
    ["list", "--hardware"], ["list", "--hardware", "--json"], ["list", "--bogus"], ["list", "extra"],
    ["version"], ["ls"], ["ls", "--json", "--tag", "ep2"], ["ls", "--bogus"],  # the aliases docker/ollama users type
    ["tui"], ["tui", "--hardware", "gb10"], ["tui", "--hardware=gb10"],  # no terminal here: the same usage error
])
def test_fast_answers_are_the_apps_answers(args: list[str]) -> None:
    same(run(FULL, args), run(None, args))


def test_help_from_the_cache_is_clicks_help_and_follows_the_width() -> None:
    clicks = run(FULL, ["--help"])
    assert clicks.returncode == 0 and "Usage: metralectl" in clicks.stdout
    same(clicks, run(None, ["--help"]))  # cli/main.py filled the cache: this one was read from it
    assert loaded(["--help"]) == ""  # ... without Click
    same(clicks, run(None, ["-h"]))
    narrow = run(None, ["--help"], columns="60")  # another width: a miss, rendered by Click for 60 columns
    same(run(FULL, ["--help"], columns="60"), narrow)
    assert narrow.stdout != clicks.stdout


def test_a_refused_user_recipe_gives_the_same_exit_and_words(isolated_env: Path) -> None:
    user = isolated_env / "config" / "recipes"
    user.mkdir(parents=True)
    (user / "broken.yaml").write_text("extends: qwen3.5-35b-a3b\nname: broken\nserve:\n  max-seq-len: lots\n")
    fast = run(None, ["list"])
    from metralectl.errors import ExitCode

    assert fast.returncode == ExitCode.DATA and "must be an integer" in fast.stderr
    same(run(FULL, ["list"]), fast)


def test_fast_answers_load_neither_click_nor_typer_nor_yaml() -> None:
    run(None, ["--help"])
    run(None, ["list"])  # the first `list` parses the YAML and fills the catalog cache
    for args in (["--help"], ["--version"], ["version"], ["list"], ["ls"], ["list", "--json", "--hardware", "gb10"]):
        assert loaded(args) == "", args
    assert loaded(["list", "--debug"]) == "click,typer", "anything else goes through the Typer app"


def test_list_options_as_click_reads_them() -> None:
    from metralectl.cli.entry import _list_options

    assert _list_options(["list"]) == {"hardware": None, "tag": [], "only_hardware": False, "as_json": False}
    assert _list_options(["list", "--tag", "a", "--tag=b", "--hardware", "x", "--hardware=y", "--only"]) == \
        {"hardware": "y", "tag": ["a", "b"], "only_hardware": True, "as_json": False}
    for undecided in (["show"], ["list", "--hardware"], ["list", "--tag", "-x"], ["list", "--json=1"],
                      ["list", "--help"], ["list", "-h"], ["list", "--", "x"], ["--debug", "list"]):
        assert _list_options(undecided) is None, undecided


def test_tui_options_as_click_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from metralectl.cli.entry import _tui_options

    assert _tui_options(["tui"]) == {"hardware": None}
    assert _tui_options(["tui", "--hardware", "gb10"]) == _tui_options(["tui", "--hardware=gb10"]) == {"hardware": "gb10"}
    for undecided in (["tui", "--hardware"], ["tui", "--hardware="], ["tui", "--hardware", "-x"], ["tui", "--help"],
                      ["tui", "extra"], ["tui", "--hardware", "a", "--hardware", "b"], ["--debug", "tui"], ["top"]):
        assert _tui_options(undecided) is None, undecided
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    assert _tui_options([]) is None  # no terminal: the root prints its help, through Typer
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    assert _tui_options([]) == {"hardware": None}


def test_help_cache_key_and_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from metralectl.cli import help_cache

    (tmp_path / "a.py").write_text("x = 1\n")
    before = help_cache.key(tmp_path)
    (tmp_path / "a.py").write_text("x = 22\n")
    assert help_cache.key(tmp_path) != before  # a command module changed: its help may have
    monkeypatch.setenv("COLUMNS", "100")
    help_cache.write("wide\n")
    assert help_cache.read() == "wide\n"
    monkeypatch.setenv("COLUMNS", "61")
    assert help_cache.read() is None
    stored = next(Path(os.environ["METRALECTL_CACHE_DIR"]).glob("help-*.txt"))
    monkeypatch.setenv("COLUMNS", "100")
    stored.write_text("someone else's key\nwide\n")  # a file under our name but not our key
    assert help_cache.read() is None


def test_catalog_cache_checks_the_whole_key(tmp_path: Path) -> None:
    from metralectl.core import catalog_cache

    catalog_cache.write("key one", {"x": 1})
    assert catalog_cache.read("key one") == {"x": 1}
    assert catalog_cache.read("key two") is None
    path = catalog_cache._path("key one")
    path.write_bytes(pickle.dumps(("key two", {"x": 2})))  # the right file name, another key inside
    assert catalog_cache.read("key one") is None
    path.write_bytes(pickle.dumps({"x": 3}))  # a file from before the key was stored in it
    assert catalog_cache.read("key one") is None


def test_list_rows_from_the_store_are_the_catalogs_and_weights_are_read_live(isolated_env: Path) -> None:
    import json

    from metralectl.app import library
    from metralectl.core.catalog import load_catalog
    from metralectl.seams.hf import cache as hfcache

    computed = run(None, ["list", "--json"])  # nothing stored yet: from the catalog, then stored
    assert list(Path(os.environ["METRALECTL_CACHE_DIR"]).glob("library-*.pickle"))
    stored = run(None, ["list", "--json"])
    same(computed, stored)
    catalog = load_catalog()
    expected = [json.loads(json.dumps(r.to_json())) for r in library.rows(catalog, library.choose_target(catalog, None))]
    assert json.loads(stored.stdout)["recipes"] == expected  # what app/library.py computes, field for field
    flagship = catalog.recipes["qwen3.5-35b-a3b"].checkpoint.repo
    blobs = hfcache.repo_dir(flagship) / "blobs"
    blobs.mkdir(parents=True)
    (blobs / "x.incomplete").write_bytes(b"")  # a download under way: the weights column must say so now
    weights = {r["name"]: r["weights"] for r in json.loads(run(None, ["list", "--json"]).stdout)["recipes"]}
    assert weights["qwen3.5-35b-a3b"] == "partial" and "partial" not in {
        r["weights"] for r in json.loads(stored.stdout)["recipes"] if r["repo"] == flagship}
    user = isolated_env / "config" / "recipes"
    user.mkdir(parents=True)
    (user / "mine.yaml").write_text("extends: qwen3.5-35b-a3b\nname: mine\n")  # new data: the store misses
    names = [r["name"] for r in json.loads(run(None, ["list", "--json"]).stdout)["recipes"]]
    assert "mine" in names
    same(run(FULL, ["list", "--tag", "ep2"]), run(None, ["list", "--tag", "ep2"]))


def test_list_from_the_store_loads_no_catalog_types() -> None:
    run(None, ["list"])
    code = LOADED.replace("('click', 'typer', 'yaml')", "('click', 'typer', 'yaml', 'metralectl.core.catalog', "
                          "'metralectl.core.recipe', 'metralectl.core.hardware', 'metralectl.app.library')")
    out = run(code, ["list"])
    assert out.stderr.rsplit("LOADED=", 1)[1].strip() == ""


def test_a_reader_that_left_ends_both_paths_alike() -> None:
    """The reader leaves before a byte is written (`list --json` is bigger than a pipe's buffer when it
    is; here the pipe is closed first): the fast answer ends as Click ends the Typer app's."""
    big = ["list", "--json"]
    ends = []
    for argv in ([sys.executable, "-c", FULL, *big], [sys.executable, "-m", "metralectl", *big],
                 [sys.executable, "-c", FULL, "--help"], [sys.executable, "-m", "metralectl", "--help"]):
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        err = proc.stderr.read().decode()
        ends.append((proc.wait(timeout=120), "Traceback" in err, "Exception ignored" in err))
    assert ends[0] == ends[1] and ends[2] == ends[3], ends
