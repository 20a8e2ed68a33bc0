"""What is served: recipe, endpoint, health, uptime, image revision (or "process": a host process); the last swap; a
degraded state."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from metralectl.tui.alarm import alarm
from metralectl.tui.outside import line

if TYPE_CHECKING:
    from metralectl.lifecycle.status import StatusReport


def _health(value: str) -> Text:
    style = {"ok": "bold green", "-": "dim"}.get(value, "bold yellow")
    return line(value, style=style)


class ServingCard(Static):
    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(Text("asking Docker what is served…", style="dim"), id=id, classes=classes)
        self.report: StatusReport | None = None
        self._unreachable: str | None = None

    def show_unreachable(self, why: str) -> None:
        """Docker did not answer: say so (and that it keeps asking), never "asking…" forever."""
        from metralectl.safetext import clean

        if self.report is None and self._unreachable == why:
            return  # said already: re-rendering it every poll would cost a layout and a repaint each time
        self.report, self._unreachable = None, why
        self.update(Text.assemble(("Docker is not answering: ", "bold yellow"), clean(why, 300),
                                  ("\nstill asking every few seconds; `metralectl doctor` explains the daemon's state",
                                   "dim")))

    def show(self, report: StatusReport) -> None:
        if report == self.report:
            return  # nothing changed since the last poll (nothing served, most of the time): no repaint
        self.report, self._unreachable = report, None
        table = Table.grid(padding=(0, 2), expand=True)
        # every value is a container's label or the daemon's answer (a container someone else labelled as
        # ours): a Text, never a string Rich would read as markup, its controls escaped (tui/outside.py)
        endpoints = [line(f"{s.endpoint}/v1" if s.endpoint != "-" else "-") for s in report.serving]
        for name in ("RECIPE", "HEALTH", "UPTIME", "ENDPOINT", "IMAGE REV", "OWNER"):
            # the endpoint is what a user copies: it keeps its whole width (port included); the recipe and the
            # image revision give way first on a narrow terminal, each ending in … rather than cut short
            table.add_column(name, no_wrap=True, overflow="ellipsis",
                             ratio={"RECIPE": 3, "IMAGE REV": 2}.get(name),
                             min_width=max((e.cell_len for e in endpoints), default=8) if name == "ENDPOINT"
                             else None)
        if report.serving:
            table.add_row(*(Text(h, style="bold") for h in ("RECIPE", "HEALTH", "UPTIME", "ENDPOINT", "IMAGE REV",
                                                              "OWNER")))
        for s, endpoint in zip(report.serving, endpoints):
            recipe = line(s.recipe, style="bold")
            if not s.state.startswith("running"):
                recipe.append_text(line(f" ({s.state})", style="yellow"))
            # a host process has no image to revise: say that it runs as one (`runtime: process`), since an
            # operator stopping it or reading its logs looks on the host, not in Docker
            revision = Text("process", style="cyan") if s.host_process else line(s.image_revision or "-")
            table.add_row(recipe, _health(s.health), line(s.uptime), endpoint, revision, line(s.owner))
        parts: list[Table | Text] = [table] if report.serving else [
            Text("Nothing is served. Pick a recipe in the Library (2) and press r to run it.", style="dim")]
        if report.degraded:
            parts.append(line(f"DEGRADED: {report.degraded} — `metralectl ps --repair` restores a model",
                              style=alarm()))
        last_swap = line(f"last swap: {report.last_swap}" if report.last_swap else "last swap: none recorded",
                         style="dim")
        last_swap.no_wrap, last_swap.overflow = True, "ellipsis"
        parts.append(last_swap)
        from rich.console import Group

        self.update(Group(*parts))
