"""The man page, docs/metralectl.1: what scripts/man-page.py generates from the command tree (like the
exit-codes doc), naming every command, its options and examples; and a page man renders without a warning
(else groff, else mandoc)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import click
import pytest

from metralectl.cli import examples
from tests.unit.recipe_helpers import REPO

PAGE = REPO / "docs" / "metralectl.1"


def script(action: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "man-page.py"), action], capture_output=True,
                          text=True, cwd=REPO, timeout=120)


def test_the_page_is_what_the_command_tree_gives() -> None:
    out = script("check")
    assert out.returncode == 0, out.stderr  # else: scripts/man-page.py generate, and commit docs/metralectl.1
    assert script("print").stdout == PAGE.read_text()


def rendered() -> str:
    """The page as a reader sees it, plain text; warnings fail the test."""
    env = {**os.environ, "MANWIDTH": "100", "MAN_KEEP_FORMATTING": "0", "LC_ALL": "C.UTF-8"}
    if shutil.which("man"):
        argv = ["man", "--warnings", "-l", str(PAGE)]
    elif shutil.which("groff"):
        argv = ["groff", "-man", "-Tutf8", "-ww", "-rLL=100n", str(PAGE)]
    elif shutil.which("mandoc"):
        argv = ["mandoc", "-Tutf8", "-Wwarning", str(PAGE)]
    else:
        pytest.skip("neither man, groff nor mandoc is installed here: the page cannot be rendered")
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stderr == "", (argv, out.stderr)
    # backspace overstrikes (bold, underline) as plain letters
    text = out.stdout
    while "\b" in text:
        i = text.index("\b")
        text = text[:i - 1] + text[i + 1:]
    return text.replace("\u2010", "-").replace("\u2212", "-")


def test_it_renders_and_names_every_command_option_and_example() -> None:
    from metralectl.cli.main import build_command

    text = " ".join(rendered().split())  # words, whatever the line breaks
    root = build_command()
    assert isinstance(root, click.Group)
    todo: list[tuple[list[str], click.Command]] = [([], root)]
    names = 0
    while todo:
        path, command = todo.pop()
        if isinstance(command, click.Group):
            todo += [([*path, n], c) for n, c in command.commands.items() if not c.hidden]
            continue
        names += 1
        assert f"metralectl {' '.join(path)} [OPTIONS]" in text or f"metralectl {' '.join(path)} " in text, path
        for param in command.params:
            for opt in param.opts if isinstance(param, click.Option) and not param.hidden else []:
                assert opt in text, (path, opt)
    assert names >= 40, names
    for path in examples.EXAMPLES:
        for line in examples.lines(path):
            assert " ".join(line.split()) in text, line
    for word in ("EXIT STATUS", "ENVIRONMENT", "METRALECTL_CONFIG_DIR", "130 interrupted"):
        assert word in text, word
