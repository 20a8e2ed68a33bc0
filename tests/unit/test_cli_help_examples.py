"""Every main command's `--help` ends with examples (cli/examples.py), through the real entry point; each
example parses with the command's own options, names recipes the catalog has, fits 80 columns, and the
ones that need no Docker, GPU or network run and exit 0."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import click
import pytest

from metralectl.cli import examples
from tests.unit.recipe_helpers import REPO

MAIN = ("list", "show", "pull", "run", "ps", "logs", "stop", "swap", "bench run", "doctor", "top", "chat", "gateway")
RUNNABLE = ("metralectl list", "metralectl show ", "metralectl run qwen3.5-35b-a3b --print")  # no daemon needed


def cli(*args: str, columns: str = "80") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "COLUMNS": columns}, timeout=60)


@pytest.mark.parametrize("path", MAIN)
def test_help_ends_with_examples_that_fit_80_columns(path: str) -> None:
    out = cli(*path.split(), "--help")
    assert out.returncode == 0, out.stderr
    text = out.stdout.split("\n  Examples:\n", 1)
    assert len(text) == 2, out.stdout
    shown = [line.strip() for line in text[1].split("\n\n")[0].splitlines()]
    assert shown == examples.lines(path) and len(shown) >= 2, shown
    assert all(line.strip().startswith(f"metralectl {path}") for line in shown), shown
    assert max(map(len, text[1].splitlines())) <= 80, text[1]


def test_the_top_help_has_examples_and_the_exit_codes() -> None:
    out = cli("--help")
    assert "\n  Examples:\n    metralectl list " in out.stdout and out.stdout.rstrip().endswith("(docs/exit-codes.md).")


def _command(root: click.Command, words: list[str]) -> tuple[click.Command, list[str]]:
    command = root
    while isinstance(command, click.Group) and words and words[0] in command.commands:
        command, words = command.commands[words[0]], words[1:]
    return command, words


def test_every_example_parses_and_names_real_recipes() -> None:
    from metralectl.cli.main import build_command
    from metralectl.core.catalog import load_catalog

    root = build_command()
    recipes = set(load_catalog(include_user=False).recipes)
    for path, block in examples.EXAMPLES.items():
        for line, what in block:
            words = shlex.split(line)[1:]
            if words == ["COMMAND", "--help"]:
                continue
            command, args = _command(root, words)
            assert command.name == (path.split()[-1] if path else words[0]), line
            ctx = command.make_context(command.name or "", list(args))  # a UsageError here: a wrong example
            for param in command.params:
                value = ctx.params.get(param.name or "")
                if (param.metavar or "").strip(".[]") in ("RECIPE", "RECIPES") and value:
                    named = value if isinstance(value, (list, tuple)) else [value]
                    assert set(named) <= recipes, (line, named)
            assert what and len(f"    {examples.lines(path)[block.index((line, what))]}") <= 80, line


def test_the_examples_that_need_no_daemon_run() -> None:
    ran = 0
    for block in examples.EXAMPLES.values():
        for line, _ in block:
            if line.startswith(RUNNABLE):
                out = cli(*shlex.split(line)[1:])
                assert out.returncode == 0, (line, out.stderr)
                ran += 1
    assert ran >= 6, ran
