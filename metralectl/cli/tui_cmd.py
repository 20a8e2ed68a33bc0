"""`tui`: open the dashboard (also what `metralectl` with no arguments does on a terminal).

A plain Click command, so its first paint waits for neither Typer nor a command module (benchmarks/tui.py);
Textual and the dashboard are imported inside the command.
"""

from __future__ import annotations

import click


def launch(hardware: str | None = None) -> None:
    from metralectl import tui as dashboard
    from metralectl.errors import ExitCode

    code = dashboard.open_on_terminal(hardware)
    if code != ExitCode.OK:
        raise click.exceptions.Exit(code)


@click.command("tui")
@click.option("--hardware", help="Judge recipe fit against this hardware class.")
def tui(hardware: str | None) -> None:
    """Open the dashboard: Serving, Library, Benchmarks and Doctor views (keyboard first; ctrl+p for commands)."""
    launch(hardware)
