"""The console script's start: one command line (cli/main.py's root group, commands loaded from the table in
cli/commands.py), and what the commands whose start is timed load and answer.

`--help`, `--version`, `list`, `ps` and `tui` load neither Typer nor YAML nor any command module but their own,
in every spelling Click accepts; their answers to bad command lines are held to golden expectations (the bytes
Click and the boundary give, exit codes included). Speed is measured in benchmarks/cold_start.py, not here.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from metralectl import __version__
from metralectl.errors import ExitCode

from tests.unit.recipe_helpers import REPO

LOADED = ("import sys, runpy\n"
          "sys.argv = ['metralectl', *sys.argv[1:]]\n"
          "try:\n    runpy.run_module('metralectl', run_name='__main__')\n"
          "except SystemExit:\n    pass\n"
          "print('LOADED=' + ','.join(m for m in WATCHED if m in sys.modules), file=sys.stderr)\n")
COMMAND_MODULES = ("metralectl.cli.catalog_cmds", "metralectl.cli.serve_cmds", "metralectl.cli.staging_cmds",
                   "metralectl.cli.habit_cmds", "metralectl.cli.bench_cmds", "metralectl.cli.agent_cmds",
                   "metralectl.cli.doctor_cmd", "metralectl.cli.top_cmd")
HEAVY = ("docker", "textual", "httpx", "huggingface_hub", "pynvml")


def run(args: list[str], columns: str = "100", env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "COLUMNS": columns, **(env or {})}, stdin=subprocess.DEVNULL, timeout=120)


def loaded(args: list[str], watched: tuple[str, ...], env: dict[str, str] | None = None) -> str:
    code = f"WATCHED = {watched!r}\n" + LOADED
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL, timeout=120)
    return out.stderr.rsplit("LOADED=", 1)[1].strip()


def usage(path: str, error: str, usage_line: str = "[OPTIONS]") -> str:
    command = f"metralectl {path}".strip()
    return f"Usage: {command} {usage_line}\nTry '{command} --help' for help.\n\nError: {error}\n"


ROOT_USAGE = "[OPTIONS] [COMMAND] [ARGS]..."
# argv -> (exit code, stdout, stderr): what the Typer app answered before the root became plain Click
GOLDEN: list[tuple[list[str], int, str, str]] = [
    (["--version"], 0, f"metralectl {__version__}\n", ""),
    (["version"], 0, f"metralectl {__version__}\n", ""),
    (["list", "--hardware"], ExitCode.USAGE, "", "Error: Option '--hardware' requires an argument.\n"),
    (["list", "--bogus"], ExitCode.USAGE, "", usage("list", "No such option '--bogus'.")),
    (["list", "extra"], ExitCode.USAGE, "", usage("list", "Got unexpected extra argument (extra)")),
    (["ls", "--bogus"], ExitCode.USAGE, "", usage("ls", "No such option '--bogus'.")),
    (["list", "--hardware", "h100"], ExitCode.USAGE, "",
     "metralectl: unknown hardware class 'h100'\n    hint: known: cpu, gb10, hopper, b200\n"),
    (["list", "--hardware", "--json"], ExitCode.USAGE, "",
     "metralectl: unknown hardware class '--json'\n    hint: known: cpu, gb10, hopper, b200\n"),
    (["tui"], ExitCode.USAGE, "",
     "metralectl: the dashboard needs a terminal (stdin and stdout)\n    hint: the other commands work without one\n"),
    (["tui", "--hardware"], ExitCode.USAGE, "", "Error: Option '--hardware' requires an argument.\n"),
    (["tui", "--bogus"], ExitCode.USAGE, "", usage("tui", "No such option '--bogus'.")),
    (["--bogus"], ExitCode.USAGE, "", usage("", "No such option '--bogus'.", ROOT_USAGE)),
    (["--version", "--bogus"], ExitCode.USAGE, "", usage("", "No such option '--bogus'.", ROOT_USAGE)),
    (["bogus"], ExitCode.USAGE, "", usage("", "No such command 'bogus'. Did you mean 'logs'?", ROOT_USAGE)),
    (["--debug", "lst"], ExitCode.USAGE, "", usage("", "No such command 'lst'. Did you mean 'list'?", ROOT_USAGE)),
    (["show"], ExitCode.USAGE, "", usage("show", "Missing argument 'RECIPE'.", "[OPTIONS] RECIPE")),
    (["ps", "--bogus"], ExitCode.USAGE, "", usage("ps", "No such option '--bogus'.")),
    (["ps", "--json", "--bogus"], ExitCode.USAGE, "", usage("ps", "No such option '--bogus'.")),
]


@pytest.mark.parametrize("args,code,stdout,stderr", GOLDEN, ids=[" ".join(g[0]) for g in GOLDEN])
def test_answers_to_bad_and_plain_command_lines(args: list[str], code: int, stdout: str, stderr: str) -> None:
    out = run(args)
    assert (out.returncode, out.stdout, out.stderr) == (code, stdout, stderr)


@pytest.mark.parametrize("args", [
    ["--help"], ["-h"], ["--version"], [],  # no terminal: the root's help
    ["list"], ["ls"], ["list", "--json", "--hardware", "gb10"], ["list", "--hardware=hopper", "--tag", "ep2", "--only"],
    ["--debug", "list"], ["list", "--bogus"], ["list", "-h"], ["tui", "--help"], ["tui", "--hardware=gb10"], ["bogus"],
])
def test_the_timed_starts_load_no_typer_no_yaml_no_other_command(args: list[str]) -> None:
    run(["list"])  # the first `list` parses the YAML and fills the catalog cache
    assert loaded(args, ("typer", "yaml", *COMMAND_MODULES, *HEAVY)) == "", args


@pytest.mark.parametrize("args", [["--help"], ["-h"], [], ["list", "-h"], ["tui", "--help"]])
def test_help_loads_no_shutil(args: list[str]) -> None:
    # Click imports shutil (with zlib, bz2 and lzma) for the terminal's width when it is given none: ~3 ms of --help
    assert loaded(args, ("shutil", "bz2", "lzma")) == "", args


@pytest.mark.parametrize("columns", ["", "0", "x", "30", "52", "79", "80", "81", "200"])
def test_the_help_width_is_the_one_click_would_take(columns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from metralectl.cli.main import help_width

    monkeypatch.setenv("COLUMNS", columns)
    assert help_width() == max(min(shutil.get_terminal_size().columns, 80) - 2, 50)


@pytest.mark.parametrize("args", [["ps"], ["ps", "--json"], ["--debug", "ps", "--json"], ["ps", "-h"]])
def test_ps_loads_no_typer_no_yaml_no_other_command_and_no_docker_py(args: list[str], tmp_path: Path) -> None:
    watched = ("typer", "yaml", "docker", "requests", "paramiko", "httpx", "metralectl.app.serving", *COMMAND_MODULES)
    assert loaded(args, watched, env={"DOCKER_HOST": f"unix://{tmp_path}/nobody.sock"}) == "", args


def test_a_typer_command_loads_its_own_module_only() -> None:
    assert loaded(["show", "demo-cpu", "--json"], ("typer", *COMMAND_MODULES)) == "typer,metralectl.cli.catalog_cmds"
    assert loaded(["bench", "list", "--help"], COMMAND_MODULES) == "metralectl.cli.bench_cmds"


def test_a_refused_user_recipe_gives_its_exit_and_words(isolated_env: Path) -> None:
    user = isolated_env / "config" / "recipes"
    user.mkdir(parents=True)
    (user / "broken.yaml").write_text("extends: qwen3.5-35b-a3b\nname: broken\nserve:\n  max-seq-len: lots\n")
    out = run(["list"])
    assert out.returncode == ExitCode.DATA and "must be an integer" in out.stderr and "Traceback" not in out.stderr


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


def test_list_rows_from_the_store_are_the_catalogs_and_weights_are_read_live(isolated_env: Path,
                                                                            tmp_path: Path) -> None:
    from metralectl.app import library
    from metralectl.core.catalog import load_catalog
    from metralectl.seams.hf import cache as hfcache

    computed = run(["list", "--json"])  # nothing stored yet: from the catalog, then stored
    assert list(Path(os.environ["METRALECTL_CACHE_DIR"]).glob("library-*"))
    stored = run(["list", "--json"])
    assert (computed.returncode, computed.stdout, computed.stderr) == (stored.returncode, stored.stdout, stored.stderr)
    catalog = load_catalog()
    expected = [json.loads(json.dumps(r.to_json())) for r in library.rows(catalog, library.choose_target(catalog, None))]
    assert json.loads(stored.stdout)["recipes"] == expected  # what app/library.py computes, field for field
    flagship = catalog.recipes["qwen3.5-35b-a3b"].checkpoint.repo
    blobs = hfcache.repo_dir(flagship) / "blobs"
    blobs.mkdir(parents=True)
    (blobs / "x.incomplete").write_bytes(b"")  # a download under way: the weights column must say so now
    weights = {r["name"]: r["weights"] for r in json.loads(run(["list", "--json"]).stdout)["recipes"]}
    assert weights["qwen3.5-35b-a3b"] == "partial" and "partial" not in {
        r["weights"] for r in json.loads(stored.stdout)["recipes"] if r["repo"] == flagship}
    user = isolated_env / "config" / "recipes"
    user.mkdir(parents=True)
    (user / "mine.yaml").write_text("extends: qwen3.5-35b-a3b\nname: mine\n")  # new data: the store misses
    names = [r["name"] for r in json.loads(run(["list", "--json"]).stdout)["recipes"]]
    assert "mine" in names
    from_store = run(["list", "--tag", "ep2"])
    empty = tmp_path / "empty-cache"
    empty.mkdir()
    from_catalog = run(["list", "--tag", "ep2"], env={"METRALECTL_CACHE_DIR": str(empty)})
    assert (from_store.returncode, from_store.stdout, from_store.stderr) == \
        (from_catalog.returncode, from_catalog.stdout, from_catalog.stderr)


def test_list_from_the_store_loads_no_catalog_types() -> None:
    run(["list"])
    watched = ("typer", "yaml", "metralectl.core.catalog", "metralectl.core.recipe", "metralectl.core.hardware",
               "metralectl.app.library")
    assert loaded(["list"], watched) == ""


def test_list_with_nothing_cached_loads_no_cache_reader_and_no_platformdirs(tmp_path: Path) -> None:
    """The config and cache dirs from XDG (no METRALECTL_* overrides) and no weights in the hub: no platformdirs, no
    HF cache readers, no pickle or json for the table (each import is part of what `list` costs before it answers)."""
    env = {k: v for k, v in os.environ.items() if k not in ("METRALECTL_CONFIG_DIR", "METRALECTL_CACHE_DIR")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    watched = ("platformdirs", "pickle", "json", "metralectl.seams.hf.cache", "metralectl.seams.hf.gguf",
               "metralectl.core.catalog")
    for _ in range(2):  # the first stores the rows (and loads the catalog), the second reads them
        out = subprocess.run([sys.executable, "-c", f"WATCHED = {watched!r}\n" + LOADED, "list"], capture_output=True,
                             text=True, cwd=REPO, env=env, stdin=subprocess.DEVNULL, timeout=120)
    assert out.stderr.rsplit("LOADED=", 1)[1].strip() == ""
    assert list((tmp_path / "cache" / "metralectl").glob("library-*"))


@pytest.mark.parametrize("args", [["list", "--json"], ["--help"], ["show", "demo-cpu", "--json"]])
def test_a_reader_that_left_ends_with_failed_and_no_traceback(args: list[str]) -> None:
    """The reader leaves before a byte is written (the pipe is closed first): exit 1, nothing on stderr, as
    Click ends a command whose output has nowhere to go."""
    proc = subprocess.Popen([sys.executable, "-m", "metralectl", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=REPO)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert (proc.wait(timeout=120), err) == (ExitCode.FAILED, "")
