"""`tui`: open the dashboard (also what `metralectl` with no arguments does on a terminal).

Textual and the dashboard are imported inside the command, never at registration.
"""

from __future__ import annotations

import typer


def tui(
    hardware: str = typer.Option(None, "--hardware", help="Judge recipe fit against this hardware class."),
) -> None:
    """Open the dashboard: Serving, Library, Benchmarks and Doctor views (keyboard first; ctrl+p for commands)."""
    launch(hardware)


def launch(hardware: str | None = None) -> None:
    import sys

    from metralectl.errors import ExitCode, UsageError

    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("the dashboard needs a terminal (stdin and stdout)", "the other commands work without one")
    from metralectl import tui as dashboard
    code = ExitCode.of(dashboard.run(hardware=hardware))
    if code is not ExitCode.OK:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("tui")(tui)
