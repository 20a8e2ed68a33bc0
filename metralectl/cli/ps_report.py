"""`ps`'s report, printed; no Typer here.

cli/entry.py calls ps() directly for `ps` and `ps --json` (no Click, no Typer: most of the command's
start); cli/serve_cmds.py declares the command for Typer (with --repair) and prints through show().
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from metralectl.cli.state import note, style

if TYPE_CHECKING:
    from metralectl.lifecycle.status import StatusReport
    from metralectl.seams.container_runtime import ContainerRuntime


def ps(as_json: bool) -> None:
    """The `ps` command without --repair: what app/serving_direct.py's DirectServing.ps() does then (the
    default runtime, status.collect), without importing the use-case layer (it loads the launch machinery)."""
    from metralectl.seams.docker_runtime import open_runtime

    with open_runtime() as runtime:
        report = collect(runtime)
    show(report, as_json)


def collect(runtime: ContainerRuntime) -> StatusReport:
    from metralectl.lifecycle import status

    return status.collect(runtime)


def show(report: StatusReport, as_json: bool) -> None:
    """What the daemon's labelled containers say is served, as a table (stderr: notes) or JSON. The engine is the
    one the recipe named on the container's label runs on, from the catalog (`?` / null: a recipe it lacks)."""
    engines = _engines() if report.serving else {}
    if as_json:
        data = report.to_json()
        for entry in data["serving"]:
            entry["engine"] = engines.get(entry["recipe"])
        print(json.dumps(data, indent=2))
        return
    from metralectl.present.table import render_table

    rows = [[s.recipe, engines.get(s.recipe, "?"), s.name, s.owner, s.state, s.health, s.uptime, s.endpoint,
             (s.image_revision or "-")[:24]] for s in report.serving]
    headers = ["RECIPE", "ENGINE", "CONTAINER", "OWNER", "STATE", "HEALTH", "UPTIME", "ENDPOINT", "IMAGE REVISION"]
    if any(s.rank is not None for s in report.serving):  # a multi-rank deployment: say which rank runs where
        headers[3:3] = ["RANK", "NODE"]
        for row, s in zip(rows, report.serving):
            row[3:3] = ["-" if s.rank is None else str(s.rank), s.node or "local"]
    if rows:
        print(render_table(headers, rows))
    else:
        note("nothing is being served by metralectl")
    for line in report.notes:
        note(style(f"! {line}", "33", sys.stderr))
    if report.degraded:
        note(style(f"DEGRADED: {report.degraded}", "31", sys.stderr))
        note("    hint: `metralectl ps --repair` restores a serving model")
    if report.last_swap:
        note(f"last swap: {report.last_swap}")


def _engines() -> dict[str, str]:
    from metralectl.app.library_cache import engines_by_recipe

    return engines_by_recipe()
