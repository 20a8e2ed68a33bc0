"""The doctor's verdicts as a table; posts Chosen with the highlighted check's id."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable

from metralectl.tui.widgets.table_fill import fill

if TYPE_CHECKING:
    from metralectl.doctor.model import CheckResult

COLUMNS = ("", "CHECK", "DETAIL")
MARKS = {"ok": ("ok", "green"), "warn": ("warn", "yellow"), "problem": ("FAIL", "bold red"), "skipped": ("skip", "dim")}


def mark_of(status: str) -> tuple[str, str]:
    """The label and style of a status; FAIL and warn stay readable under NO_COLOR (tui/alarm.py)."""
    from metralectl.tui.alarm import alarm, caution

    import os

    label, style = MARKS.get(status, (status, ""))
    if not os.environ.get("NO_COLOR"):
        return label, style
    return label, {"problem": alarm(), "warn": caution()}.get(status, style)


class CheckTable(DataTable[object]):
    class Chosen(Message):
        def __init__(self, check_id: str) -> None:
            super().__init__()
            self.check_id = check_id

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, cursor_type="row", zebra_stripes=True)
        self.ids: list[str] = []

    def on_mount(self) -> None:
        fill(self, COLUMNS, [])

    def set_results(self, results: Sequence[CheckResult]) -> None:
        keep = self.ids[self.cursor_row] if self.ids and 0 <= self.cursor_row < len(self.ids) else None
        order = {"problem": 0, "warn": 1, "ok": 2, "skipped": 3}
        ordered = sorted(results, key=lambda r: order.get(r.status, 9))
        self.ids = [r.id for r in ordered]
        rows = []
        for r in ordered:
            mark, style = mark_of(r.status)
            rows.append((Text(mark, style=style), r.title, r.detail))
        fill(self, COLUMNS, rows, self.ids)
        if keep in self.ids:
            self.move_cursor(row=self.ids.index(keep), animate=False)
        if self.ids:
            self.post_message(self.Chosen(self.ids[max(0, self.cursor_row)]))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.Chosen(str(event.row_key.value)))
