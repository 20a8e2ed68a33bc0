"""Before an action: what will happen (steps, the rendered command, warnings), or why it cannot."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from metralectl.tui.first_frame import DIALOGS_CSS
from metralectl.tui.outside import line, prose
from metralectl.tui.services import Plan


class ConfirmScreen(ModalScreen[bool]):
    CSS_PATH = DIALOGS_CSS  # read when the first dialog opens, not before the first frame
    BINDINGS = [
        Binding("y", "confirm", "Confirm"),
        Binding("n,escape", "cancel", "Cancel"),
    ]

    def __init__(self, plan: Plan) -> None:
        super().__init__(classes="dialog-screen")
        self.plan = plan

    def compose(self) -> ComposeResult:
        plan = self.plan
        with Vertical(id="confirm-dialog", classes="dialog"):
            # a plan quotes recipes, labels and the daemon: Texts (never markup), controls escaped (tui/outside.py)
            yield Label(line(plan.title), classes="dialog--title")
            if plan.blocked:  # first: why nothing can happen matters more than what would have
                yield Static(prose(f"✘ {plan.blocked}"), id="confirm-blocked", classes="dialog--error")
            if plan.hint:
                yield Static(prose(f"→ {plan.hint}"), classes="dialog--hint")
            for warning in plan.warnings:
                yield Static(prose(f"! {warning}"), classes="dialog--warning")
            if not plan.cancellable and not plan.blocked:
                yield Static(Text("this cannot be cancelled once started"), classes="dialog--hint")
            with VerticalScroll(classes="dialog--body"):
                if plan.steps:
                    yield Static(Text("\n").join(line(f"{i}. {s}") for i, s in enumerate(plan.steps, 1)),
                                 id="confirm-steps")
                if plan.command:
                    yield Label("command", classes="dialog--section")
                    yield Static(prose(plan.command), id="confirm-command", classes="command")
            with Horizontal(classes="dialog--buttons"):
                if plan.blocked:
                    yield Button("Close", id="cancel", variant="primary", compact=True)
                else:
                    yield Button(f"{plan.action.capitalize()} (y)", id="confirm", variant="warning", compact=True)
                    yield Button("Cancel (n)", id="cancel", compact=True)

    def on_mount(self) -> None:
        self.query_one("#confirm" if not self.plan.blocked else "#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "confirm")

    def action_confirm(self) -> None:
        if not self.plan.blocked:
            self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)
