"""An error (or any message) that deserves more than a notification: what, the hint, the last lines."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from metralectl.tui.first_frame import DIALOGS_CSS
from metralectl.tui.outside import line, log, prose


class MessageScreen(ModalScreen[None]):
    CSS_PATH = DIALOGS_CSS  # read when the first dialog opens, not before the first frame
    BINDINGS = [Binding("escape,enter,q", "close", "Close")]

    def __init__(self, title: str, message: str, hint: str | None = None, lines: Sequence[str] = ()) -> None:
        super().__init__(classes="dialog-screen")
        self.title_text, self.message, self.hint, self.lines = title, message, hint, tuple(lines)

    def compose(self) -> ComposeResult:
        with Vertical(id="message-dialog", classes="dialog"):
            # an error quotes servers, labels and logs: Texts (never markup), controls escaped (tui/outside.py)
            yield Label(line(self.title_text), classes="dialog--title")
            with VerticalScroll(classes="dialog--body"):
                yield Static(prose(self.message), classes="dialog--error")
                if self.hint:
                    yield Static(prose(f"→ {self.hint}"), classes="dialog--hint")
                if self.lines:
                    yield Static(Text("\n".join(log(x) for x in self.lines)), classes="command")
            with Horizontal(classes="dialog--buttons"):
                yield Button("Close", id="close", variant="primary", compact=True)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)
