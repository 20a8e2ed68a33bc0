"""Process-wide CLI settings and the stderr side of output (diagnostics, errors, colour)."""

from __future__ import annotations

import sys

from metralectl.errors import MetralError, RecipeInvalid
from metralectl.present.style import color_enabled, style  # noqa: F401  (re-exported)

DEBUG = False


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
