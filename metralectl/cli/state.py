"""Process-wide CLI settings and the stderr side of output (diagnostics, errors, colour)."""

from __future__ import annotations

import os
import sys

from metralectl.present.style import color_enabled, style  # noqa: F401  (re-exported)
from metralectl.wording import count

TYPE_CHECKING = False  # every command's start imports this module: no dataclasses, no typing at run time
if TYPE_CHECKING:
    from typing import Callable, NoReturn

    from metralectl.errors import MetralError

DEBUG = False
DEBUG_ENV = "METRALECTL_DEBUG"  # `1` (or true/yes/on): as --debug, for a command a script or a service runs


def debug_from_env() -> bool:
    """`1`, `true`, `yes` or `on` turn tracebacks on; `0`, `no` or empty leave them off."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def note(message: str) -> None:
    """A diagnostic line on stderr (never on stdout, which carries data)."""
    print(message, file=sys.stderr)


SHOWN_PROBLEMS: set[int] = set()  # id() of problems already printed this run (a refused user recipe's, on load)


def report_error(exc: MetralError) -> None:
    """The error's lines on stderr. A message may quote a server, a label or a file (a release's recipe path,
    a Hub's X-Error-Message): escaped here whatever raised it (safetext.printable: our own line breaks kept)."""
    from metralectl.errors import RecipeInvalid
    from metralectl.safetext import printable

    err = sys.stderr  # a problem's or an error's text may quote a file, a server or a label: escaped here
    if isinstance(exc, RecipeInvalid):
        errors = [p for p in exc.problems if p.severity == "error"]
        unseen = [p for p in errors if id(p) not in SHOWN_PROBLEMS]
        for problem in unseen:
            print(style(printable(problem.render()), "31", err), file=err)
        above = " (shown above)" if len(unseen) < len(errors) else ""
        print(f"metralectl: refused: {count(len(errors), 'problem')}{above}", file=err)
        return
    print(style(f"metralectl: {_lines(exc.message)}", "31", err), file=err)
    if exc.hint:
        print(f"    hint: {_lines(exc.hint)}", file=err)


def _lines(text: object) -> str:
    """A message for stderr: escaped (safetext.printable), and every line after its first indented, so no line
    of it (ours, or one a server slipped in) can pass for a line of our own (`metralectl: ...`)."""
    from metralectl.safetext import printable

    return printable(str(text)).replace("\n", "\n    ")


def guarded(body: Callable[[], int | None]) -> NoReturn:
    """The one error boundary: run body and exit with its code (None: OK). MetralError -> its line, hint
    and code; Ctrl-C -> INTERRUPTED; a reader that left the pipe -> OK; anything else -> one line and
    SOFTWARE (a traceback only with --debug). The table is imported only on those paths."""
    try:
        code = body()
    except KeyboardInterrupt:
        from metralectl.errors import ExitCode

        print("metralectl: interrupted", file=sys.stderr)
        sys.exit(ExitCode.INTERRUPTED)
    except BrokenPipeError:
        from metralectl.errors import ExitCode

        # `metralectl list | head`: the reader left; not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(ExitCode.OK)
    except Exception as exc:
        from metralectl.errors import ExitCode, MetralError

        if isinstance(exc, MetralError):
            report_error(exc)
            sys.exit(exc.exit_code)
        if DEBUG:
            raise
        import traceback

        from metralectl.safetext import clean

        last = traceback.format_exc().strip().splitlines()[-1]  # may quote what a server or a file said
        print(f"metralectl: internal error: {clean(last, 500)}", file=sys.stderr)
        print(f"    hint: run again with --debug (or {DEBUG_ENV}=1) for the traceback, and report it", file=sys.stderr)
        sys.exit(ExitCode.SOFTWARE)
    sys.exit(code)  # None exits 0
