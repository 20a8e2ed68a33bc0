"""Benchmark runs (CLI and dashboard alike, source marked). Enter opens one; space marks up to two
for comparison; c compares the marked pair."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable

from metralectl.tui.outside import line
from metralectl.tui.services import RunSummary
from metralectl.tui.widgets.table_fill import fill

COLUMNS = ("", "WHEN", "SUITE", "SOURCE", "TARGET", "RESULT", "HEADLINE", "ENGINE")


def when(started: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(started)) if started else "-"


class HistoryTable(DataTable[object]):
    BINDINGS = [
        Binding("space", "mark", "Mark"),
        Binding("c", "compare", "Compare"),
    ]

    class Open(Message):
        def __init__(self, run: RunSummary) -> None:
            super().__init__()
            self.run = run

    class Compare(Message):
        def __init__(self, a: RunSummary, b: RunSummary) -> None:
            super().__init__()
            self.a = a
            self.b = b

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, cursor_type="row", zebra_stripes=True)
        self.runs: list[RunSummary] = []
        self.marked: list[str] = []

    def on_mount(self) -> None:
        fill(self, COLUMNS, [])

    def set_runs(self, runs: Sequence[RunSummary]) -> None:
        self.runs = list(runs)
        self.marked = [m for m in self.marked if any(r.run_id == m for r in self.runs)]
        self._fill()

    def _fill(self) -> None:
        row = self.cursor_row
        rows = []
        for r in self.runs:
            mark = Text("◆", style="bold") if r.run_id in self.marked else Text(" ")
            source = line(r.source, style="cyan" if r.source == "tui" else "")  # a record's field, as read
            rows.append((mark, when(r.started), r.suite, source, r.target, r.outcome, r.headline, r.engine))
        fill(self, COLUMNS, rows, [r.run_id for r in self.runs])
        if self.runs:
            self.move_cursor(row=min(row, len(self.runs) - 1), animate=False)

    def _current(self) -> RunSummary | None:
        return self.runs[self.cursor_row] if self.runs and 0 <= self.cursor_row < len(self.runs) else None

    def action_mark(self) -> None:
        run = self._current()
        if run is None:
            return
        if run.run_id in self.marked:
            self.marked.remove(run.run_id)
        else:
            self.marked = [*self.marked[-1:], run.run_id]
        self._fill()

    def action_compare(self) -> None:
        chosen = [r for r in self.runs if r.run_id in self.marked]
        if len(chosen) == 2:
            self.post_message(self.Compare(chosen[0], chosen[1]))
        else:
            self.notify("mark two runs with space first", severity="warning")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        run = self._current()
        if run is not None:
            self.post_message(self.Open(run))
