"""Benchmarks: pick a suite, fill its parameter form (refused values marked inline), run it with live
progress and see its results; History lists every recorded run (CLI or dashboard, source marked),
opens one (enter) and compares two (space marks, c compares)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, DataTable, Label, ProgressBar, Select
from textual.worker import Worker

from metralectl.errors import MetralError
from metralectl.cancel import Cancelled, CancelToken
from metralectl.tui.coalesce import Coalescer
from metralectl.tui.messages import (
    BenchFinished,
    BenchTick,
    HistoryLoaded,
    RunDetailLoaded,
    SuitesLoaded,
    WorkerFailed,
)
from metralectl.tui.outside import line, prose
from metralectl.tui.services import BenchProgress, RunSummary, SuiteInfo
from metralectl.tui.views import services_of
from metralectl.tui.widgets.history_table import HistoryTable
from metralectl.tui.widgets.param_form import ParamForm
from metralectl.tui.widgets.table_fill import fill
from metralectl.tui.alarm import alarm, caution
from metralectl.wording import count


class BenchView(Horizontal):
    BINDINGS = [  # short words: with the history's own keys the footer must still show `q Quit` at 80 columns
        Binding("ctrl+g", "start", "Run"),
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+r", "reload_history", "Reload"),
        Binding("ctrl+o", "focus_history", "History"),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.suites: list[SuiteInfo] = []
        self.unavailable: str | None = None
        self.suite: SuiteInfo | None = None
        self.errors: dict[str, str] = {}
        self.token: CancelToken | None = None
        self.worker: Worker[None] | None = None
        self.progress: Coalescer[BenchProgress] = Coalescer(lambda: self.post_message(BenchTick()), maxlen=1)

    def compose(self) -> ComposeResult:
        with Vertical(id="bench-run"):
            yield Select[str]([], prompt="suite", id="suite-select", allow_blank=True, compact=True)
            yield Label("", id="suite-description")
            yield ParamForm(id="bench-form")
            with Horizontal(id="bench-buttons"):
                yield Button("Run (ctrl+g)", id="bench-start", variant="success", disabled=True, compact=True)
                yield Button("Cancel (esc)", id="bench-cancel", variant="error", disabled=True, compact=True)
            # the progress bar is mounted only while a suite runs: hidden, its indeterminate animation would
            # still tick 15 times a second (and its own timer once) for as long as the dashboard is open
            yield Label("", id="bench-status")
            yield DataTable(id="bench-results", zebra_stripes=True)
        with Vertical(id="bench-history"):
            yield Label("History — enter opens · space marks · c compares two", id="history-title")
            yield HistoryTable(id="history")

    def on_mount(self) -> None:
        self.load_suites()
        self.action_reload_history()

    def focus_main(self) -> None:
        (self.query_one("#suite-select") if self.suites else self.query_one(HistoryTable)).focus()

    # -- loading --------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="bench-suites", exit_on_error=False)
    def load_suites(self) -> None:
        bench = services_of(self).bench
        try:
            self.post_message(SuitesLoaded(bench.suites(), bench.unavailable))
        except Exception as exc:  # noqa: BLE001
            self.post_message(WorkerFailed("benchmark suites", exc))

    def action_focus_history(self) -> None:
        self.query_one(HistoryTable).focus()

    def action_reload_history(self) -> None:
        self.load_history()

    @work(thread=True, exclusive=True, group="bench-history", exit_on_error=False)
    def load_history(self) -> None:
        try:
            self.post_message(HistoryLoaded(services_of(self).bench.history()))
        except Exception as exc:  # noqa: BLE001
            self.post_message(WorkerFailed("benchmark history", exc))

    def on_suites_loaded(self, message: SuitesLoaded) -> None:
        message.stop()
        self.suites, self.unavailable = message.suites, message.unavailable
        select = self.query_one("#suite-select", Select)
        select.set_options([(f"{s.title} ({s.id})", s.id) for s in self.suites])
        if self.unavailable:
            self.query_one("#suite-description", Label).update(prose(self.unavailable, style="yellow"))
        if self.suites:
            select.value = self.suites[0].id

    def on_history_loaded(self, message: HistoryLoaded) -> None:
        message.stop()
        self.query_one(HistoryTable).set_runs(message.runs)
        self.query_one("#history-title", Label).update(
            f"History ({count(len(message.runs), 'run')}) — enter opens · space marks · c compares two")

    # -- the form -------------------------------------------------------------------------------
    async def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        self.suite = next((s for s in self.suites if s.id == event.value), None)
        self.query_one("#suite-description", Label).update(prose(self.suite.description if self.suite else ""))
        await self.query_one(ParamForm).set_suite(self.suite)
        self._check(self.query_one(ParamForm).values())

    def _check(self, values: dict[str, str]) -> dict[str, Any] | None:
        if self.suite is None:
            self.query_one("#bench-start", Button).disabled = True
            return None
        params, errors = services_of(self).bench.check_params(self.suite.id, values)  # pure parsing: no I/O
        self.errors = errors
        self.query_one(ParamForm).show_errors(errors)
        ok = not errors and self.token is None
        self.query_one("#bench-start", Button).disabled = not ok
        return None if errors else params

    def on_param_form_changed(self, message: ParamForm.Changed) -> None:
        message.stop()
        self._check(message.values)

    def on_param_form_submitted(self, message: ParamForm.Submitted) -> None:
        message.stop()
        self.action_start()

    # -- running --------------------------------------------------------------------------------
    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "bench-start":
            self.action_start()
        elif event.button.id == "bench-cancel":
            self.action_cancel()

    def action_start(self) -> None:
        if self.token is not None:
            self.notify("a benchmark is already running", severity="warning")
            return
        if self.suite is None:
            self.notify(self.unavailable or "pick a suite first", severity="warning")
            return
        params = self._check(self.query_one(ParamForm).values())
        if params is None:
            self.notify("fix the marked parameters first", severity="error")
            return
        self.token = CancelToken()
        self.query_one("#bench-start", Button).disabled = True
        self.query_one("#bench-cancel", Button).disabled = False
        for old in self.query("#bench-progress"):
            old.remove()
        self.query_one("#bench-run").mount(ProgressBar(id="bench-progress", show_eta=False), after="#bench-buttons")
        self.query_one("#bench-status", Label).update(line(f"running {self.suite.id}…", style="bold"))
        self.worker = self.run_suite(self.suite.id, params, self.token)

    def action_cancel(self) -> None:
        if self.token is not None:  # Textual's worker, and the benchmark it runs (its token)
            self.token.cancel("cancelled from the dashboard")
            if self.worker is not None:
                self.worker.cancel()
            self.query_one("#bench-status", Label).update(Text("cancelling…", style="yellow"))

    @work(thread=True, exclusive=True, group="bench-run", exit_on_error=False)
    def run_suite(self, suite: str, params: dict[str, Any], token: CancelToken) -> None:
        def on_event(event: BenchProgress) -> None:
            token.check()
            self.progress.push(event)

        try:
            with token.bound():
                run = services_of(self).bench.run(suite, params, on_event, token)
        except Cancelled:
            self.post_message(BenchFinished(None, "cancelled", f"{suite} cancelled"))
            return
        except MetralError as exc:
            self.post_message(BenchFinished(None, "failed", exc.message, exc.hint))
            return
        except Exception as exc:  # noqa: BLE001
            self.post_message(BenchFinished(None, "failed", f"internal error: {type(exc).__name__}: {exc}"))
            return
        failed = run.outcome.startswith("failed")
        self.post_message(BenchFinished(run, "failed" if failed else "done", f"{run.suite}: {run.outcome} · {run.headline}"))

    def on_bench_tick(self, message: BenchTick) -> None:
        message.stop()
        latest = self.progress.drain()
        if not latest:
            return
        p = latest[-1]
        for bar in self.query("#bench-progress").results(ProgressBar):
            bar.update(total=p.total, progress=p.done)
        # the runner's words quote the engine it measures (an error, a status): never markup (tui/outside.py)
        self.query_one("#bench-status", Label).update(line(p.message or f"{p.done}/{p.total or '?'}"))

    def on_bench_finished(self, message: BenchFinished) -> None:
        message.stop()
        self.token = self.worker = None
        self.query_one("#bench-cancel", Button).disabled = True
        for bar in self.query("#bench-progress"):
            bar.remove()
        style = {"done": "bold green", "failed": alarm(), "cancelled": caution()}[message.status]
        text = prose(message.text, style=style)  # an error quotes the engine or a record
        if message.hint:
            text.append_text(prose(f"  → {message.hint}"))
        self.query_one("#bench-status", Label).update(text)
        self._check(self.query_one(ParamForm).values())
        if message.run is not None:
            self.open_runs([message.run], into_results=True)
        self.action_reload_history()

    # -- history --------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="bench-detail", exit_on_error=False)
    def open_runs(self, runs: list[RunSummary], into_results: bool = False) -> None:
        try:
            details = [services_of(self).bench.detail(r) for r in runs]
        except Exception as exc:  # noqa: BLE001
            self.post_message(WorkerFailed("benchmark record", exc))
            return
        self.post_message(RunDetailLoaded(details, into_results))

    def on_run_detail_loaded(self, message: RunDetailLoaded) -> None:
        message.stop()
        if message.into_results:
            detail = message.details[0]
            fill(self.query_one("#bench-results", DataTable), detail.columns, detail.rows)
            return
        from metralectl.tui.screens.run_detail import RunDetailScreen

        self.app.push_screen(RunDetailScreen(message.details))

    def on_history_table_open(self, message: HistoryTable.Open) -> None:
        message.stop()
        self.open_runs([message.run])

    def on_history_table_compare(self, message: HistoryTable.Compare) -> None:
        message.stop()
        self.open_runs([message.a, message.b])
