"""A suite's parameter schema as a form. Posts Changed on every edit (the view checks the values and
hands back errors, shown under each field) and Submitted on Enter."""

from __future__ import annotations

import textwrap

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Input, Label, Static

from metralectl.tui.outside import line
from metralectl.tui.services import SuiteInfo


def _default_text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value).lower() if isinstance(value, bool) else str(value)


NAME_COLUMNS = 30  # the widest name column: the form is half a 120-column screen


class ParamForm(VerticalScroll):
    can_focus = False  # tab goes from field to field, not to the scroll container
    class Changed(Message):
        def __init__(self, values: dict[str, str]) -> None:
            super().__init__()
            self.values = values

    class Submitted(Message):
        def __init__(self, values: dict[str, str]) -> None:
            super().__init__()
            self.values = values

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.suite: SuiteInfo | None = None
        self.errors: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        yield Static("", classes="param-form--empty")

    async def set_suite(self, suite: SuiteInfo | None) -> None:
        self.suite = None  # until the new fields are mounted: edits of the old ones are ignored
        self.errors = {}
        await self.remove_children()
        if suite is None:
            await self.mount(Static("no suite", classes="param-form--empty"))
            return
        fields = []
        # every name whole and two columns before its field, the fields in one column (`show`'s rule); a name longer
        # than NAME_COLUMNS is folded onto the next lines, so the field stays in the pane whatever an engine calls it
        width = min(max([16, *(len(p.name) for p in suite.params)]), NAME_COLUMNS) + 2
        for p in suite.params:
            hint = p.help + (f" (one of: {', '.join(p.choices)})" if p.choices else "")
            folded = "\n".join(textwrap.wrap(p.name, NAME_COLUMNS, break_on_hyphens=True, break_long_words=True))
            label = Label(folded, classes="param-form--label", markup=False)
            label.styles.width = width
            fields.append(Vertical(
                Horizontal(
                    label,
                    Input(value=_default_text(p.default), placeholder=hint or p.kind, id=f"param-{p.name}",
                          classes="param-form--input", tooltip=hint or None, compact=True),
                    classes="param-form--row"),
                Label("", id=f"error-{p.name}", classes="param-form--error"),
                classes="param-form--field"))
        if not fields:
            fields.append(Vertical(Static("this suite takes no parameters", classes="param-form--empty")))
        await self.mount_all(fields)
        self.suite = suite

    def values(self) -> dict[str, str]:
        """The fields' text by parameter name (only the current suite's fields)."""
        if self.suite is None:
            return {}
        names = {p.name for p in self.suite.params}
        found = {(i.id or "").removeprefix("param-"): i.value for i in self.query(".param-form--input").results(Input)}
        return {k: v for k, v in found.items() if k in names}

    def show_errors(self, errors: dict[str, str]) -> None:
        self.errors = dict(errors)
        for label in self.query(".param-form--error").results(Label):
            why = errors.get((label.id or "").removeprefix("error-"), "")
            label.update(line(why))  # it may quote what was typed: `[/]` must not be read as markup
            label.display = bool(why)
        for field in self.query(".param-form--input").results(Input):
            field.set_class(bool(errors.get((field.id or "").removeprefix("param-"))), "-invalid")

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        if self.suite is not None:
            self.post_message(self.Changed(self.values()))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if self.suite is not None:
            self.post_message(self.Submitted(self.values()))
