"""Filling a DataTable with columns sized from their content, up front.

DataTable measures auto-width columns later, when idle; a repaint that lands in between (a focus
change, a cursor move) is cached with the header widths and can stay on screen. Sizing the columns
ourselves when the rows are set leaves nothing to measure later.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import DataTable

MAX_WIDTH = 120


def _width(cell: str | Text) -> int:
    return cell.cell_len if isinstance(cell, Text) else cell_len(str(cell))


def fill(table: DataTable[object], headers: Sequence[str], rows: Sequence[Sequence[str | Text]],
         keys: Sequence[str] | None = None, *, max_width: int = MAX_WIDTH) -> None:
    """Replace columns and rows; each column as wide as its widest cell (at most max_width)."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], min(max_width, _width(cell)))
    table.clear(columns=True)
    for i, (header, width) in enumerate(zip(headers, widths)):
        table.add_column(header, width=width, key=f"c{i}")
    for i, row in enumerate(rows):
        table.add_row(*row, key=keys[i] if keys is not None else None)
