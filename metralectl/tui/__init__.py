"""The dashboard (`metralectl tui`, or `metralectl` with no arguments on a terminal).

Nothing here is imported by the CLI until the dashboard is asked for: `run()` imports Textual and
the app lazily, so `metralectl --help` and `list` stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from metralectl.tui.services import Services


def open_on_terminal(hardware: str | None = None) -> int:
    """`metralectl tui`: the dashboard on this terminal, or a usage error without one. Typer-free, so the
    plain Click `tui` command (cli/tui_cmd.py) opens it without Typer or any other command module."""
    import sys

    from metralectl.errors import ExitCode, UsageError

    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("the dashboard needs a terminal (stdin and stdout)", "the other commands work without one")
    return int(ExitCode.of(run(hardware=hardware)))


def run(services: Services | None = None, *, hardware: str | None = None) -> int:
    """Open the dashboard on this terminal; returns the exit code."""
    from metralectl.tui.first_frame import pause_gc, resume_gc

    pause_gc()  # until the first frame (MainScreen resumes it), or until the app ends without one
    try:
        return _run(services, hardware)
    finally:
        resume_gc()


def _run(services: Services | None, hardware: str | None) -> int:
    if services is None:
        from metralectl.tui.core_services import CoreServices

        core = CoreServices(hardware=hardware)
        try:
            return _run_app(core)
        finally:
            core.close()  # the kept Docker connection
    return _run_app(services)


def _run_app(services: Services) -> int:
    from metralectl.tui.app import MetralectlApp

    app = MetralectlApp(services)
    app.run()
    return app.return_code or 0
