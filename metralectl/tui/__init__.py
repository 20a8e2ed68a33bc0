"""The dashboard (`metralectl tui`, or `metralectl` with no arguments on a terminal).

Nothing here is imported by the CLI until the dashboard is asked for: `run()` imports Textual and
the app lazily, so `metralectl --help` and `list` stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from metralectl.tui.services import Services


def run(services: Services | None = None, *, hardware: str | None = None) -> int:
    """Open the dashboard on this terminal; returns the exit code."""
    from metralectl.tui.app import MetralectlApp

    if services is None:
        from metralectl.tui.core_services import CoreServices

        services = CoreServices(hardware=hardware)
    app = MetralectlApp(services)
    app.run()
    return app.return_code or 0
