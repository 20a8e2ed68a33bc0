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
    from metralectl import tui as dashboard
    from metralectl.errors import ExitCode

    code = dashboard.open_on_terminal(hardware)
    if code != ExitCode.OK:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("tui")(tui)
