"""A scrollable block of plain text (recipe detail, a check's remedy, a run's record).

What it shows quotes recipes, the doctor's findings and the like: never read as markup, and every control
character but line breaks and tabs escaped (tui/outside.py), whether it comes as a string or a Text."""

from __future__ import annotations

from rich.text import Text
from textual.containers import ScrollableContainer
from textual.widgets import Static

from metralectl.tui.outside import prose, scrub


class TextPane(ScrollableContainer):
    """wrap=False keeps lines whole (commands, tables) and scrolls sideways instead."""

    def __init__(self, placeholder: str = "", *, wrap: bool = True, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._placeholder = placeholder
        self.wrap = wrap
        self.set_class(not wrap, "-nowrap")
        self.text = placeholder

    def compose(self):  # type: ignore[no-untyped-def]
        yield Static(prose(self._placeholder), classes="text-pane--body")

    def show(self, text: str | Text) -> None:
        self.text = text.plain if isinstance(text, Text) else text
        body = scrub(text) if isinstance(text, Text) else prose(text)
        body.no_wrap = not self.wrap
        self.query_one(".text-pane--body", Static).update(body)
        self.scroll_home(animate=False)
