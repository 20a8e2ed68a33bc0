"""The Library's recipe table. Gets LibraryItems; posts Chosen when the cursor lands on a recipe."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable

from metralectl.tui.outside import line
from metralectl.tui.services import LibraryItem
from metralectl.tui.widgets.table_fill import fill

# What decides "can I run it here" comes first: with the longest shipped name, RECIPE through WEIGHTS take 64
# columns, which an 80-column terminal (stacked panes) and the 120-column one (the table's 2fr of the body)
# both show whole, with 14 to spare; QUANT, TOK/S, HW (FITS judges it; `hw:X` filters on it), MTP, IMAGE and
# MODEL follow or scroll into view.
COLUMNS = ("", "RECIPE", "ENGINE", "FITS", "WEIGHTS", "QUANT", "TOK/S", "HW", "MTP", "IMAGE", "MODEL")
NAME_WIDTH = 36  # a longer name (a user's: up to 64) ends in `…`; the detail pane and the filter have it whole


def _yes_no(value: bool | None, yes: str = "yes", no: str = "no") -> Text:
    if value is None:
        return Text("?", style="dim")
    return Text(yes, style="green") if value else Text(no, style="red")


def cells(item: LibraryItem) -> tuple[str | Text, ...]:
    r = item.row
    weights_style = {"complete": "green", "present": "yellow", "partial": "yellow", "absent": "dim"}.get(r.weights, "")
    name = line(r.name)
    name.truncate(NAME_WIDTH, overflow="ellipsis")
    return (
        Text("●", style="bold green") if item.serving else " ",
        name, r.engine, _yes_no(r.fits), Text(r.weights, style=weights_style), r.quant,
        Text(f"{r.validated_tok_s:g}" if r.validated_tok_s is not None else "-", justify="right"),
        r.hardware, "yes" if r.mtp else "-",
        _yes_no(item.image_present, "here", "no"),
        r.model,
    )


class RecipeTable(DataTable[object]):
    class Chosen(Message):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, cursor_type="row", zebra_stripes=True)
        self.names: list[str] = []

    def on_mount(self) -> None:
        fill(self, COLUMNS, [])

    def set_items(self, items: Sequence[LibraryItem], keep: str | None = None) -> None:
        """Show these items; the cursor stays on `keep` (a recipe name) when it is still listed."""
        self.names = [i.row.name for i in items]
        fill(self, COLUMNS, [cells(i) for i in items], self.names)
        if keep in self.names:
            self.move_cursor(row=self.names.index(keep), animate=False)
        if self.names:
            self.post_message(self.Chosen(self.names[self.cursor_row] if 0 <= self.cursor_row < len(self.names)
                                          else self.names[0]))

    @property
    def chosen(self) -> str | None:
        if not self.names or not 0 <= self.cursor_row < len(self.names):
            return None
        return self.names[self.cursor_row]

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.Chosen(str(event.row_key.value)))
