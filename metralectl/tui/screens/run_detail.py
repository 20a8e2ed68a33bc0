"""One benchmark run (parameters, results table, notes), or two side by side.

Every field is read from a record on disk (which anyone who can write $METRALE_HOME/runs may have left):
shown as Texts, never markup, each value's control characters escaped (tui/outside.py; tables: table_fill)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Label, Static

from metralectl.tui.first_frame import DIALOGS_CSS
from metralectl.tui.outside import line
from metralectl.tui.services import RunDetail
from metralectl.tui.widgets.history_table import when
from metralectl.tui.widgets.table_fill import fill


def compare_rows(a: RunDetail, b: RunDetail) -> list[tuple[str, str, str]]:
    """(field, a, b) for the summary and every parameter that either run has; differences first."""
    rows = [("suite", a.summary.suite, b.summary.suite), ("when", when(a.summary.started), when(b.summary.started)),
            ("source", a.summary.source, b.summary.source), ("target", a.summary.target, b.summary.target),
            ("engine", a.summary.engine, b.summary.engine),
            ("result", a.summary.outcome, b.summary.outcome), ("headline", a.summary.headline, b.summary.headline)]
    params = sorted(set(a.params) | set(b.params))
    pairs = [(f"param {k}", str(a.params.get(k, "-")), str(b.params.get(k, "-"))) for k in params]
    pairs.sort(key=lambda r: r[1] == r[2])
    return rows + pairs


class RunDetailScreen(ModalScreen[None]):
    CSS_PATH = DIALOGS_CSS  # read when the first dialog opens, not before the first frame
    BINDINGS = [Binding("escape,q", "close", "Close")]

    def __init__(self, details: Sequence[RunDetail]) -> None:
        super().__init__(classes="dialog-screen")
        self.details = list(details)

    def compose(self) -> ComposeResult:
        title = (f"Run {self.details[0].summary.run_id}" if len(self.details) == 1 else
                 f"Compare {self.details[0].summary.run_id} ↔ {self.details[1].summary.run_id}")
        with Vertical(id="run-dialog", classes="dialog dialog--wide"):
            yield Label(line(title), classes="dialog--title")
            with VerticalScroll(classes="dialog--body"):
                if len(self.details) == 2:
                    yield DataTable(id="run-compare", cursor_type="row", zebra_stripes=True)
                for i, detail in enumerate(self.details):
                    if len(self.details) == 1:
                        s = detail.summary
                        params = ", ".join(f"{k}={v}" for k, v in detail.params.items()) or "-"
                        yield Static(Text("\n").join((
                            line(f"{s.suite} · {when(s.started)} · source {s.source} · target {s.target}"
                                 f" · engine {s.engine}"),
                            line(f"result {s.outcome} · {s.headline}"), line(f"parameters: {params}"))))
                    else:
                        yield Label(line(f"results of {detail.summary.run_id}"), classes="dialog--section")
                    yield DataTable(id=f"run-results-{i}", zebra_stripes=True)
                    for note in detail.notes:
                        yield Static(line(f"· {note}"), classes="dialog--hint")
            with Horizontal(classes="dialog--buttons"):
                yield Button("Close", id="close", variant="primary", compact=True)

    def on_mount(self) -> None:
        if len(self.details) == 2:
            a, b = self.details
            rows = [(line(name), line(x, style="bold yellow" if x != y else ""),
                     line(y, style="bold yellow" if x != y else "")) for name, x, y in compare_rows(a, b)]
            fill(self.query_one("#run-compare", DataTable), ("", a.summary.run_id, b.summary.run_id), rows)
        for i, detail in enumerate(self.details):
            results = self.query_one(f"#run-results-{i}", DataTable)
            if detail.columns:
                fill(results, detail.columns, detail.rows)
            else:
                fill(results, ("no results table in this record",), [])

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)
