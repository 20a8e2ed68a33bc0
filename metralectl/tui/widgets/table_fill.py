"""Filling a DataTable with columns sized from their content, up front.

DataTable measures auto-width columns later, when idle; a repaint that lands in between (a focus
change, a cursor move) is cached with the header widths and can stay on screen. Sizing the columns
ourselves when the rows are set leaves nothing to measure later.

Every cell and header becomes a Text first: DataTable reads a string as Rich markup, and cells quote
recipes, doctor findings and bench records (tui/outside.py); control characters are escaped in both.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widgets import DataTable

from metralectl.tui.outside import cell

MAX_WIDTH = 120


def fill(table: DataTable[object], headers: Sequence[str | Text], rows: Sequence[Sequence[str | Text]],
         keys: Sequence[str] | None = None, *, max_width: int = MAX_WIDTH) -> None:
    """Replace columns and rows; each column as wide as its widest cell (at most max_width)."""
    labels = [cell(h) for h in headers]
    texts = [[cell(c) for c in row] for row in rows]
    widths = [label.cell_len for label in labels]
    for row_texts in texts:
        for i, text in enumerate(row_texts):
            widths[i] = max(widths[i], min(max_width, text.cell_len))
    table.clear(columns=True)
    for i, (label, width) in enumerate(zip(labels, widths)):
        table.add_column(label, width=width, key=f"c{i}")
    for i, row_texts in enumerate(texts):
        table.add_row(*row_texts, key=keys[i] if keys is not None else None)
