"""Process-wide CLI settings and the stderr side of output (diagnostics, errors, colour)."""

from __future__ import annotations

import os
import sys
from typing import TextIO

from metralectl.errors import MetralError, RecipeInvalid

DEBUG = False


def color_enabled(stream: TextIO) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return hasattr(stream, "isatty") and stream.isatty() and os.environ.get("TERM") != "dumb"


def style(text: str, code: str, stream: TextIO = sys.stdout) -> str:
    return f"\033[{code}m{text}\033[0m" if color_enabled(stream) else text


def note(message: str) -> None:
    """A diagnostic line on stderr (never on stdout, which carries data)."""
    print(message, file=sys.stderr)


def report_error(exc: MetralError) -> None:
    err = sys.stderr
    if isinstance(exc, RecipeInvalid):
        errors = [p for p in exc.problems if p.severity == "error"]
        for problem in errors:
            print(style(problem.render(), "31", err), file=err)
        print(f"metralectl: refused: {len(errors)} problem{'s' if len(errors) != 1 else ''}", file=err)
        return
    print(style(f"metralectl: {exc.message}", "31", err), file=err)
    if exc.hint:
        print(f"    hint: {exc.hint}", file=err)
