"""cli/commands.py, the table the root group loads its commands from, against the commands themselves: every
command a module defines has its row (and the module named there defines it), every summary and `hidden` is
the command's own, and the root's `--help`, listed from the table, is what Click renders with every command
loaded, at any width."""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from tests.unit.recipe_helpers import REPO


def _first_paragraph(command: click.Command) -> str:
    return " ".join(inspect.cleandoc(command.help or "").split("\n\n")[0].split())


def test_every_command_a_module_defines_has_its_row_and_every_row_its_command() -> None:
    import typer
    import typer.main

    from metralectl.cli.commands import COMMANDS

    defined: dict[str, str] = {}
    for module_name in sorted({entry.module for entry in COMMANDS.values()}):
        module = importlib.import_module(module_name)
        if hasattr(module, "register"):
            app = typer.Typer()
            module.register(app)
            names = list(typer.main.get_group(app).commands)
        else:
            names = [n for n, e in COMMANDS.items() if e.module == module_name]
            assert all(isinstance(getattr(module, COMMANDS[n].command or ""), click.Command) for n in names)
        for name in names:
            assert name not in defined, f"{name} is defined by {defined[name]} and {module_name}"
            defined[name] = module_name
    assert defined == {name: entry.module for name, entry in COMMANDS.items()}


def test_the_tables_summaries_and_aliases_are_the_commands_own() -> None:
    from metralectl.cli.commands import COMMANDS
    from metralectl.cli.main import build_command

    root = build_command()
    ctx = click.Context(root, info_name="metralectl")
    for name, entry in COMMANDS.items():
        command = root.get_command(ctx, name)
        assert command is not None, name
        assert (entry.summary, entry.hidden) == (_first_paragraph(command), command.hidden), \
            f"cli/commands.py's row for {name!r} differs from the command's own help: update the row"


@pytest.mark.parametrize("width", [40, 60, 80, 100, 120, 200])
def test_the_roots_help_from_the_table_is_clicks_own_with_every_command_loaded(width: int) -> None:
    from metralectl.cli.main import build_command

    root = build_command()
    ctx = root.make_context("metralectl", [], resilient_parsing=True, max_content_width=width, terminal_width=width)
    from_table = ctx.get_help()
    clicks = ctx.make_formatter()
    click.Group.format_commands(root, ctx, clicks)  # Click's own listing: asks every (loaded) command
    assert "Commands:\n" in clicks.getvalue() and clicks.getvalue() in from_table


def test_the_printed_help_lists_every_visible_command_once() -> None:
    from metralectl.cli.commands import COMMANDS

    out = subprocess.run([sys.executable, "-m", "metralectl", "--help"], capture_output=True, text=True, cwd=REPO,
                         timeout=60)
    assert out.returncode == 0 and out.stderr == ""
    listed = out.stdout.split("\nCommands:\n", 1)[1].split("\n\n", 1)[0]
    names = [line.split()[0] for line in listed.splitlines() if line.startswith("  ") and not line.startswith("   ")]
    assert names == [name for name, entry in COMMANDS.items() if not entry.hidden]


def test_the_roots_help_follows_the_exit_code_table_its_epilog_names(tmp_path: Path) -> None:
    """The epilog lists errors.ExitCode; a changed table shows in the next `--help` (a help-text cache keyed on
    cli/*.py kept printing the old one). A copy of the package, its table edited between two calls."""
    import shutil

    package = tmp_path / "site" / "metralectl"
    shutil.copytree(REPO / "metralectl", package, ignore=shutil.ignore_patterns("__pycache__", "_data"))
    env = {**os.environ, "PYTHONPATH": str(package.parent), "METRALECTL_CACHE_DIR": str(tmp_path / "cache"),
           "COLUMNS": "100"}

    def root_help() -> str:
        out = subprocess.run([sys.executable, "-m", "metralectl", "--help"], capture_output=True, text=True,
                             cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, timeout=60)
        assert out.returncode == 0 and out.stderr == "", out.stderr
        return " ".join(out.stdout.split())

    assert "75 busy" in root_help()
    errors = package / "errors.py"
    assert "    BUSY = 75\n" in errors.read_text()
    errors.write_text(errors.read_text().replace("    BUSY = 75\n", "    BUSY = 76\n"))
    after = root_help()
    assert "76 busy" in after and "75 busy" not in after
