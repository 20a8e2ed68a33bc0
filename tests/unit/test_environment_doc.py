"""README's Environment table names every METRALECTL_* variable the package reads, and METRALECTL_DEBUG does
what it says there: `1` is `--debug` (an internal error shows its traceback) on both of the entry point's
paths; `0` leaves it off."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest

from tests.unit.recipe_helpers import REPO

PACKAGE = REPO / "metralectl"
NAME = re.compile(r"METRALECTL_[A-Z0-9_]+")
# Set by metralectl for itself, never by a person: not in the table.
INTERNAL = {
    "METRALECTL_AGENT_REGROUPED": "the agent marks its own re-exec through `sg docker` (agent/service.py)",
}


def read_by_the_package() -> set[str]:
    """Every string constant that is a METRALECTL_ name (os.environ.get("X"), environ["X"], X = "..."):
    `_METRALECTL_COMPLETE`, Click's completion variable, starts with `_` and is no name of ours."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value):
                found.add(node.value)
    return found


def readme_table() -> set[str]:
    section = (REPO / "README.md").read_text().split("\n## Environment\n", 1)[1].split("\n## ", 1)[0]
    return {name for row in section.splitlines() if row.startswith("| `")
            for name in NAME.findall(row.split("|")[1])}


def test_the_readme_table_names_every_variable_the_package_reads() -> None:
    read = read_by_the_package()
    assert {"METRALECTL_CONFIG_DIR", "METRALECTL_DEBUG", "METRALECTL_LOCK_DIR"} <= read, read  # the scan sees them
    missing = sorted(read - readme_table() - set(INTERNAL))
    assert not missing, f"README.md's Environment table lacks {missing}"
    assert not set(INTERNAL) & readme_table()


FAIL = ("import sys\n"
        "import metralectl.cli.catalog_list as listing\n"
        "import metralectl.present.show_view as show\n"
        "def boom(*a, **k):\n    raise ZeroDivisionError('planted')\n"
        "listing.list_recipes = boom\nshow.as_text = boom\n"
        "from metralectl.cli.main import main\nmain(sys.argv[1:])\n")


@pytest.mark.parametrize("args", [["list"], ["show", "qwen3.5-35b-a3b"]], ids=["click command", "typer command"])
@pytest.mark.parametrize("value, traceback", [("1", True), ("yes", True), ("0", False), ("", False)])
def test_metralectl_debug(args: list[str], value: str, traceback: bool) -> None:
    out = subprocess.run([sys.executable, "-c", FAIL, *args], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "METRALECTL_DEBUG": value}, timeout=60)
    assert ("Traceback (most recent call last)" in out.stderr) is traceback, out.stderr
    if not traceback:
        from metralectl.errors import ExitCode

        assert out.returncode == ExitCode.SOFTWARE and "ZeroDivisionError: planted" in out.stderr
        assert "run again with --debug (or METRALECTL_DEBUG=1)" in out.stderr, out.stderr
