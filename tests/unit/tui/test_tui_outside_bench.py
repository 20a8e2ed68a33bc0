"""Benchmark text from outside in the dashboard: run records on disk (anyone who can write
$METRALE_HOME/runs, or a peer's record copied there) read through the one reader (RecordsBench), and a
runner whose progress and failure quote the engine it measures. See tests/unit/tui/hostile.py."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.widgets import Button, Input

from metralectl.errors import MetralError
from metralectl.tui.app import MetralectlApp
from metralectl.tui.bench_adapter import RecordsBench
from metralectl.cancel import CancelToken
from metralectl.tui.screens.run_detail import RunDetailScreen
from metralectl.tui.services import BenchProgress, RunSummary
from metralectl.tui.views.bench import BenchView
from metralectl.tui.widgets.history_table import HistoryTable
from metralectl.tui.widgets.param_form import ParamForm
from tests.unit.tui.conftest import until
from tests.unit.tui.fakes import FakeBench, FakeServices
from tests.unit.tui.hostile import CLICK, HOSTILE, assert_shown_safely, click_the_crafted_word, screen_lines

SIZE = (200, 50)


def plant(home: Path, directory: str, record: dict[str, Any]) -> None:
    """A run.json as someone else left it (JSON carries any character: `\\u001b` is ESC)."""
    run = home / "metrale" / "runs" / "decode" / directory
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps(record))


def hostile_record(run_id: str) -> dict[str, Any]:
    return {"run_id": run_id, "suite": HOSTILE, "started_at": "2026-11-29T10:00:00+00:00", "source": HOSTILE,
            "status": "failed", "verdict": HOSTILE, "target": {"recipe": HOSTILE, "engine": {"name": HOSTILE}},
            "params": {HOSTILE: HOSTILE}, "summary": {"headline": {HOSTILE: 1.0}}, "error": HOSTILE,
            "stages": [{"name": HOSTILE, "summary": {"ok": 1, "requests": 1}}],
            "gates": [{"metric": HOSTILE, "op": ">=", "threshold": HOSTILE, "passed": False}]}


def test_a_bench_record_from_disk_in_history_detail_and_comparison(isolated_env: Path) -> None:
    plant(isolated_env, "20261129-100000-aaaaaa", hostile_record(HOSTILE))
    plant(isolated_env, "20261129-090000-bbbbbb", {**hostile_record("plain-run"), "started_at": "2026-11-29T09:00:00"})
    services = FakeServices(bench=RecordsBench())  # type: ignore[arg-type]

    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await pilot.press("3")
            history = app.query_one(HistoryTable)
            await until(pilot, lambda: history.row_count == 2, what="history")
            await pilot.pause(0.1)
            assert_shown_safely(app, CLICK, "[/bold]")  # a narrow pane: the rest of the suite's cell scrolls
            await click_the_crafted_word(pilot, app)
            history.focus()
            history.move_cursor(row=0)
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RunDetailScreen), what="run detail")
            await pilot.pause(0.1)
            assert_shown_safely(app)
            await click_the_crafted_word(pilot, app)
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, RunDetailScreen))
            history.focus()
            await pilot.press("space", "down", "space", "c")
            await until(pilot, lambda: isinstance(app.screen, RunDetailScreen) and len(app.screen.details) == 2,
                        what="comparison")
            await pilot.pause(0.1)
            assert_shown_safely(app, CLICK, "[/bold]")  # the run id is a column header too

    asyncio.run(scenario())


def test_clicking_a_crafted_run_id_runs_nothing(isolated_env: Path) -> None:
    """Balanced markup (nothing that would crash): shown, it is a label's text; read as markup, clicking it
    would toggle the theme."""
    plant(isolated_env, "20261129-100000-aaaaaa", {"run_id": f"r-{CLICK}", "suite": "decode", "status": "completed",
                                                   "stages": [], "target": {}})
    services = FakeServices(bench=RecordsBench())  # type: ignore[arg-type]

    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await pilot.press("3")
            history = app.query_one(HistoryTable)
            await until(pilot, lambda: history.row_count == 1, what="history")
            history.focus()
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RunDetailScreen), what="run detail")
            await pilot.pause(0.1)
            await click_the_crafted_word(pilot, app)  # the dialog's title, first on screen
            assert any(f"Run r-{CLICK}" in text for text in screen_lines(app))

    asyncio.run(scenario())


class QuotingBench(FakeBench):
    """A runner whose progress and failure quote the engine under test."""

    def run(self, suite: str, params: dict[str, Any], on_event: Callable[[BenchProgress], None],
            cancel: CancelToken) -> RunSummary:
        on_event(BenchProgress(1, 5, HOSTILE))
        assert self.hold is not None
        self.hold.wait(10)
        raise MetralError(HOSTILE, HOSTILE)


def test_a_runners_progress_and_failure() -> None:
    bench = QuotingBench(hold=threading.Event())
    services = FakeServices(bench=bench)

    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await pilot.press("3")
            view = app.query_one(BenchView)
            start = app.query_one("#bench-start", Button)
            await until(pilot, lambda: view.suite is not None and not start.disabled, what="form")
            await pilot.press("ctrl+g")
            await until(pilot, lambda: any(CLICK in text for text in screen_lines(app)), what="progress")
            assert_shown_safely(app)
            bench.hold.set()  # type: ignore[union-attr]
            await until(pilot, lambda: view.token is None, what="the failure")
            await pilot.pause(0.1)
            assert_shown_safely(app)
            await click_the_crafted_word(pilot, app)

    asyncio.run(scenario())


def test_a_refused_parameter_quoting_what_was_typed() -> None:
    """The form's refusal quotes the typed value (`'[/bold]' is not int`): a label's text, not markup."""
    services = FakeServices()

    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await pilot.press("3")
            view = app.query_one(BenchView)
            form = app.query_one(ParamForm)
            await until(pilot, lambda: view.suite is not None and form.suite is not None, what="form")
            form.query_one("#param-max_tokens", Input).value = f"{CLICK}[/bold]"
            await until(pilot, lambda: "max_tokens" in view.errors, what="inline refusal")
            await pilot.pause(0.1)
            assert_shown_safely(app, CLICK, "[/bold]' is not int")
            await click_the_crafted_word(pilot, app)

    asyncio.run(scenario())
