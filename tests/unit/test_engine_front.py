"""The engine named in every front end: `list` (ENGINE column, `engine` in --json, the table fitted to a narrow
terminal), `show` (the engine line, text and JSON) and `ps` (the served recipe's engine). Real subprocesses;
`list` under a real pseudo-terminal where the terminal's width matters."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from metralectl.core.catalog import load_catalog
from metralectl.present.table import render_table, terminal_width, to_fit
from tests.unit.recipe_helpers import REPO
from tests.unit.test_docker_local import ANSWERS, CONTAINER, FakeDaemon, daemon  # noqa: F401 (the fixture)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=REPO, timeout=120)


def on_terminal(args: list[str], columns: int) -> tuple[str, str]:
    """(what the terminal showed, stderr) of `metralectl ARGS` with stdout on a pseudo-terminal `columns` wide."""
    leader, follower = pty.openpty()
    import fcntl
    import struct
    import termios

    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # the terminal's own size, as a user has it
    proc = subprocess.Popen([sys.executable, "-m", "metralectl", *args], stdout=follower, stderr=subprocess.PIPE,
                            env={**env, "NO_COLOR": "1"}, cwd=REPO, text=True)
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(leader)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return b"".join(chunks).decode().replace("\r\n", "\n"), err


# -- list -----------------------------------------------------------------------------------------------------
def test_list_names_every_recipes_engine_in_the_table_and_json() -> None:
    catalog = load_catalog()
    data = json.loads(cli("list", "--json").stdout)
    assert data["recipes"] and {r["name"]: r["engine"] for r in data["recipes"]} == {
        name: recipe.engine for name, recipe in catalog.recipes.items()}
    table = cli("list").stdout.splitlines()
    assert table[0].split()[:3] == ["RECIPE", "ENGINE", "MODEL"]
    assert {line.split()[0]: line.split()[1] for line in table[1:]} == {
        name: recipe.engine for name, recipe in catalog.recipes.items()}
    assert {"metrale", "llama-cpp"} <= {r["engine"] for r in data["recipes"]}  # both engines' recipes ship


def test_list_fits_an_80_column_terminal_and_says_what_it_left_out() -> None:
    from metralectl.cli.catalog_list import HEADERS, OPTIONAL

    shown, err = on_terminal(["list"], 80)
    lines = [line for line in shown.splitlines() if line.strip()]
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    assert len(lines) == len(load_catalog().recipes) + 1
    [said] = [line for line in err.splitlines() if "left out to fit 80 columns" in line]
    left_out = said.split(" left out")[0].split(", ")
    assert left_out == list(OPTIONAL[:len(left_out)]) and left_out[:2] == ["MODEL", "SOURCE"]  # in order, first ones
    kept = [h for h in HEADERS if h not in left_out]
    assert lines[0].split() == " ".join(kept).split() and kept[:2] == ["RECIPE", "ENGINE"]
    wide, err = on_terminal(["list"], 200)
    assert wide.splitlines()[0].split()[:3] == ["RECIPE", "ENGINE", "MODEL"] and "left out" not in err
    # a pipe gets every column whatever COLUMNS says: the program reading it decides
    piped = cli("list", env={"COLUMNS": "80"})
    assert piped.stdout.splitlines()[0].split()[-1] == "SOURCE" and "left out" not in piped.stderr


def test_to_fit_leaves_out_optional_columns_in_order_until_it_fits() -> None:
    headers = ["NAME", "ENGINE", "MODEL", "NOTE"]
    rows = [["a" * 10, "llama-cpp", "m" * 20, "n" * 8]]
    full = len(render_table(headers, rows).splitlines()[1])  # 10+2+9+2+20+2+8
    assert full == 53
    assert to_fit(headers, rows, None, ["MODEL", "NOTE"]) == []
    assert to_fit(headers, rows, 53, ["MODEL", "NOTE"]) == []
    assert to_fit(headers, rows, 52, ["MODEL", "NOTE"]) == ["MODEL"]
    assert to_fit(headers, rows, 30, ["MODEL", "NOTE"]) == ["MODEL", "NOTE"]
    assert to_fit(headers, rows, 5, ["MODEL", "NOTE"]) == ["MODEL", "NOTE"]  # NAME and ENGINE are never left out
    narrow = render_table(headers, [["x", "metrale", "m", "7"]], right=(3,), hide=["MODEL"]).splitlines()
    assert narrow == ["NAME  ENGINE   NOTE", "x     metrale     7"]  # right alignment follows its column


def test_terminal_width_is_none_for_a_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty:
        def __init__(self, tty: bool) -> None:
            self.tty = tty

        def isatty(self) -> bool:
            return self.tty

        def fileno(self) -> int:
            raise OSError("no terminal here")

    monkeypatch.setenv("COLUMNS", "77")
    assert terminal_width(Tty(True)) == 77  # type: ignore[arg-type]
    assert terminal_width(Tty(False)) is None  # type: ignore[arg-type]
    monkeypatch.delenv("COLUMNS")
    assert terminal_width(Tty(True)) is None  # type: ignore[arg-type]


# -- show -----------------------------------------------------------------------------------------------------
def test_show_names_the_engine_and_its_revision() -> None:
    out = cli("show", "qwen3.5-35b-a3b")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1] == "  engine        Metrale Engine (metrale), revision 2735884"
    data = json.loads(cli("show", "qwen3.5-35b-a3b", "--json").stdout)
    assert data["engine"] == {"name": "metrale", "display_name": "Metrale Engine", "revision": "2735884",
                              "commit": "2735884296e66f284942540c1c0ad8a49cffed92"}
    other = json.loads(cli("show", "gemma-4-31b", "--json").stdout)["engine"]
    assert other["name"] == "metrale" and other["revision"] != "2735884"  # each recipe's own revision
    catalog = load_catalog()
    [llama] = [r for r in catalog.recipes.values() if r.engine == "llama-cpp"][:1]
    contract = catalog.engines["llama-cpp"]
    revision = contract.revision(llama.engine_revision)
    assert revision is not None
    line = cli("show", llama.name).stdout.splitlines()[1]
    assert line.startswith(f"  engine        {contract.display_name} (llama-cpp), revision {revision.label}"), line
    assert json.loads(cli("show", llama.name, "--json").stdout)["engine"] == {
        "name": "llama-cpp", "display_name": contract.display_name, "revision": revision.label,
        "commit": revision.commit}


# -- ps -------------------------------------------------------------------------------------------------------
def test_ps_names_the_served_recipes_engine(daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
                                             isolated_env: Path) -> None:
    served = {**CONTAINER, "Config": {**CONTAINER["Config"], "Labels": {  # type: ignore[dict-item]
        "ai.metrale.metralectl.managed": "true", "ai.metrale.metralectl.recipe": "qwen3.5-35b-a3b"}}}
    gone = {**CONTAINER, "Id": "def456", "Name": "/metralectl-gone", "Config": {**CONTAINER["Config"], "Labels": {  # type: ignore[dict-item]
        "ai.metrale.metralectl.managed": "true", "ai.metrale.metralectl.recipe": "no-such-recipe"}}}
    monkeypatch.setitem(ANSWERS, "/v1.41/containers/json", (200, [{"Id": "abc123"}, {"Id": "def456"}]))
    monkeypatch.setitem(ANSWERS, "/v1.41/containers/abc123/json", (200, served))
    monkeypatch.setitem(ANSWERS, "/v1.41/containers/def456/json", (200, gone))
    env = {"DOCKER_HOST": f"unix://{daemon.server_address}"}
    for attempt in ("the catalog", "the rows `list` stored"):
        data = json.loads(cli("ps", "--json", env=env).stdout)
        assert {s["recipe"]: s["engine"] for s in data["serving"]} == {"qwen3.5-35b-a3b": "metrale",
                                                                      "no-such-recipe": None}, attempt
        table = cli("ps", env=env).stdout.splitlines()
        assert table[0].split()[:3] == ["RECIPE", "ENGINE", "CONTAINER"]
        assert {line.split()[0]: line.split()[1] for line in table[1:]} == {"qwen3.5-35b-a3b": "metrale",
                                                                             "no-such-recipe": "?"}, attempt
        assert cli("list").returncode == 0  # stores the rows the second round reads


def test_ps_reads_the_stored_rows_without_the_catalog(isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from metralectl.app import library_cache
    from metralectl.cli.catalog_list import list_recipes
    from metralectl.core import catalog

    assert library_cache.engines_by_recipe()["qwen3.5-35b-a3b"] == "metrale"  # nothing stored: from the catalog
    list_recipes(None, None, False, True)  # stores the rows

    def no_catalog() -> None:
        raise AssertionError("the catalog was loaded")

    monkeypatch.setattr(catalog, "load_catalog", no_catalog)
    assert library_cache.engines_by_recipe()["qwen3.5-35b-a3b"] == "metrale"
