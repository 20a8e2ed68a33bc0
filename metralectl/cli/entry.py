"""The console script's first stop: the answers that need no command tree, then the Typer app.

Importing Click and Typer and building the tree of every command costs several times Python's own
start. Five answers need neither, and give the same bytes and exit code as the Typer app:
- `--version` (and `version`): a constant;
- `--help` / `-h`: the text Click rendered last time for this code and this width (cli/help_cache.py);
- `list` (or `ls`) with its options written plainly (`--json`, `--only`, `--hardware X`, `--tag X`, or the
  `--opt=X` forms): the command's own body (cli/catalog_list.py);
- `ps` and `ps --json`: the command's own body (cli/ps_report.py; `--repair` goes through Typer);
- `tui` (`--hardware X` or `--hardware=X`), and no arguments on a terminal: the dashboard, whose first
  paint would otherwise wait for the command tree (benchmarks/tui.py).
Anything else (another command, `--debug`, an option this parser does not know, a value that looks
like an option) goes to cli/main.py unchanged, which answers and reports errors as it always did.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing itself costs a few ms on this path; mypy treats the name as True
if TYPE_CHECKING:
    from typing import Any, Callable

    Answer = Callable[[], int | None]  # the exit code; None: OK


def _list_options(args: list[str]) -> dict[str, Any] | None:
    """`list`'s options as Click would pass them, or None for anything Click should judge itself."""
    if not args or args[0] not in ("list", "ls"):
        return None
    found: dict[str, Any] = {"hardware": None, "tag": [], "only_hardware": False, "as_json": False}
    rest = args[1:]
    i = 0
    while i < len(rest):
        word = rest[i]
        if word == "--json":
            found["as_json"] = True
        elif word == "--only":
            found["only_hardware"] = True
        elif word in ("--hardware", "--tag") or word.startswith(("--hardware=", "--tag=")):
            name, eq, value = word.partition("=")
            if not eq:
                if i + 1 == len(rest) or rest[i + 1].startswith("-"):
                    return None  # a missing value, or one Click might read as an option: Click decides
                i += 1
                value = rest[i]
            if name == "--tag":
                found["tag"].append(value)
            else:
                found["hardware"] = value  # given twice, the last one counts, as in Click
        else:
            return None
        i += 1
    return found


def _tui_options(args: list[str]) -> dict[str, Any] | None:
    """The dashboard's options as Click would pass them, or None for anything Click should judge itself."""
    if not args:  # the root callback opens the dashboard on a terminal, prints the help elsewhere
        return {"hardware": None} if sys.stdin.isatty() and sys.stdout.isatty() else None
    rest = args[1:]
    if args[0] != "tui" or len(rest) > 2:
        return None
    if not rest:
        return {"hardware": None}
    if len(rest) == 1 and rest[0].startswith("--hardware=") and len(rest[0]) > len("--hardware="):
        return {"hardware": rest[0].partition("=")[2]}
    if len(rest) == 2 and rest[0] == "--hardware" and rest[1] and not rest[1].startswith("-"):
        return {"hardware": rest[1]}
    return None


def _fast(args: list[str]) -> Answer | None:
    if args in (["--version"], ["version"]):
        def version() -> int | None:
            from metralectl import __version__

            print(f"metralectl {__version__}")
            return None
        return version
    if args in (["--help"], ["-h"]):
        from metralectl.cli import help_cache

        text = help_cache.read()
        if text is None:
            return None

        def cached_help() -> int | None:
            sys.stdout.write(text)
            sys.stdout.flush()  # as click.echo does: a closed pipe is reported here, inside the boundary
            return None
        return cached_help
    if args in (["ps"], ["ps", "--json"]):
        def ps() -> int | None:
            from metralectl.cli.ps_report import ps

            ps(as_json=len(args) == 2)
            return None
        return ps
    tui_options = _tui_options(args)
    if tui_options is not None:
        def open_dashboard() -> int | None:
            from metralectl.tui import open_on_terminal

            return open_on_terminal(tui_options["hardware"])
        return open_dashboard
    options = _list_options(args)
    if options is not None:
        def list_recipes() -> int | None:
            from metralectl.cli.catalog_list import list_recipes

            return list_recipes(**options)
        return list_recipes
    return None


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    answer = _fast(args)
    if answer is None:
        from metralectl.cli.main import main as full

        full(args)
        return
    from metralectl.cli import state

    state.DEBUG = state.debug_from_env()  # what the app's root callback sets without --debug
    state.guarded(lambda: _as_click_ends(answer))


def _as_click_ends(answer: Answer) -> int | None:
    """A reader that leaves while the answer is written (`list --json | head -c 10`): Click ends its
    commands then with exit 1 and nothing on stderr, so the fast answers do too."""
    try:
        return answer()
    except BrokenPipeError:
        from metralectl.errors import ExitCode

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush finds no pipe
        return ExitCode.FAILED
