"""Doctor and Benchmarks views against fakes."""

from __future__ import annotations

import asyncio
import threading

from textual.widgets import Button, Input, Label, Select

from metralectl.tui.alarm import alarm
from metralectl.tui.app import MetralectlApp
from metralectl.tui.screens.run_detail import RunDetailScreen
from metralectl.tui.views.bench import BenchView
from metralectl.tui.views.doctor import DoctorView
from metralectl.tui.widgets.check_table import CheckTable
from metralectl.tui.widgets.history_table import HistoryTable
from metralectl.tui.widgets.param_form import ParamForm
from metralectl.tui.widgets.text_pane import TextPane
from tests.unit.tui.conftest import until
from tests.unit.tui.fakes import FakeBench, FakeServices


def test_doctor_runs_on_first_show_and_reruns(services: FakeServices) -> None:
    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=(120, 40)) as pilot:
            assert ("doctor",) not in services.calls  # nothing runs until the view is opened
            await pilot.press("4")
            table = app.query_one(CheckTable)
            await until(pilot, lambda: table.row_count == 3, what="checks")
            assert table.ids == ["gpu", "port", "docker"]  # problems first
            summary = str(app.query_one("#doctor-summary", Label).render())
            assert "1 problem, 1 warning, 1 ok" in summary and "problems found" in summary
            detail = app.query_one("#check-detail", TextPane)
            await until(pilot, lambda: "install the NVIDIA driver" in detail.text, what="remedy")
            await pilot.press("down")
            await until(pilot, lambda: "free it" in detail.text)
            await pilot.press("ctrl+r")
            await until(pilot, lambda: services.calls.count(("doctor",)) == 2 and not app.query_one(DoctorView).running)

    asyncio.run(scenario())


def test_bench_form_refuses_bad_values_inline_then_runs(services: FakeServices) -> None:
    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("3")
            view = app.query_one(BenchView)
            await until(pilot, lambda: view.suite is not None and view.suite.id == "decode", what="suite")
            form = app.query_one(ParamForm)
            await until(pilot, lambda: form.suite is not None)
            start = app.query_one("#bench-start", Button)
            await until(pilot, lambda: not start.disabled)
            form.query_one("#param-max_tokens", Input).value = "0"
            await until(pilot, lambda: "max_tokens" in view.errors, what="inline refusal")
            error = form.query_one("#error-max_tokens", Label)
            assert error.display and "≥ 1" in str(error.render()) and start.disabled
            assert form.query_one("#param-max_tokens", Input).has_class("-invalid")
            await pilot.press("ctrl+g")  # refused while a field is invalid
            assert services.bench.ran == []
            form.query_one("#param-max_tokens", Input).value = "64"
            await until(pilot, lambda: not view.errors and not start.disabled)
            await pilot.press("ctrl+g")
            history = app.query_one(HistoryTable)
            await until(pilot, lambda: len(history.runs) == 3, what="new run in history")
            assert services.bench.ran == [("decode", {"max_tokens": 64, "prompt": "What is the capital of France?"})]
            assert history.runs[0].source == "tui"
            assert "133.0 tok/s" in str(app.query_one("#bench-status", Label).render())
            await until(pilot, lambda: app.query_one("#bench-results").row_count == 2, what="results table")
            app.query_one(Select).value = "sweep"
            await until(pilot, lambda: form.suite is not None and form.suite.id == "sweep")
            assert form.query_one("#param-concurrencies", Input).value == "1,2,4"

    asyncio.run(scenario())


def test_a_run_with_failed_requests_ends_red_and_failed(services: FakeServices) -> None:
    services.bench.outcome = "failed (errors)"

    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("3")
            view = app.query_one(BenchView)
            start = app.query_one("#bench-start", Button)
            await until(pilot, lambda: view.suite is not None and not start.disabled)
            await pilot.press("ctrl+g")
            history = app.query_one(HistoryTable)
            await until(pilot, lambda: len(history.runs) == 3, what="the run in history")
            status = app.query_one("#bench-status", Label).render()
            assert "failed (errors)" in str(status)
            assert any(str(span.style) == alarm() for span in status.spans)  # type: ignore[union-attr]  # red, or reverse under NO_COLOR
            assert history.runs[0].outcome == "failed (errors)"

    asyncio.run(scenario())


def test_core_history_shows_failed_runs_as_failed() -> None:
    from metralectl.bench import records
    from metralectl.tui.bench_core import CoreBench

    failing = {"started_at": "2026-12-01T00:00:00+00:00", "status": "completed", "params": {},
               "stages": [{"name": "decode", "summary": {"requests": 5, "ok": 0}}], "target": {}}
    directory = records.start("decode", "20261201-000000-bad000", dict(failing))
    record = records.load(directory) or {}
    record.update(failing)
    records.save(directory, record)
    [run] = CoreBench().history()
    assert run.outcome == "failed (errors)"


def test_bench_cancel(services: FakeServices) -> None:
    services.bench.hold = threading.Event()

    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("3")
            view = app.query_one(BenchView)
            start = app.query_one("#bench-start", Button)
            await until(pilot, lambda: view.suite is not None and not start.disabled)
            await pilot.press("ctrl+g")
            await until(pilot, lambda: view.token is not None and services.bench.ran)
            await pilot.press("escape")
            await until(pilot, lambda: view.token is None, what="cancelled")
            assert "cancelled" in str(app.query_one("#bench-status", Label).render())
            assert len(services.bench.runs) == 2

    asyncio.run(scenario())


def test_history_open_and_compare(services: FakeServices) -> None:
    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("3")
            history = app.query_one(HistoryTable)
            await until(pilot, lambda: len(history.runs) == 2)
            history.focus()
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RunDetailScreen), what="run detail")
            assert [d.summary.run_id for d in app.screen.details] == ["r2"]  # type: ignore[attr-defined]
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, RunDetailScreen))
            history.focus()
            await pilot.press("space", "down", "space", "c")
            await until(pilot, lambda: isinstance(app.screen, RunDetailScreen), what="comparison")
            screen = app.screen
            assert isinstance(screen, RunDetailScreen) and len(screen.details) == 2
            compare = screen.query_one("#run-compare")
            await until(pilot, lambda: compare.row_count >= 6)

    asyncio.run(scenario())


def test_bench_unavailable_says_why_history_still_works() -> None:
    services = FakeServices(bench=FakeBench(unavailable="metralectl.bench has no runner yet"))

    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("3")
            await until(pilot, lambda: "no runner yet" in str(app.query_one("#suite-description").render()))
            await until(pilot, lambda: len(app.query_one(HistoryTable).runs) == 2)
            await pilot.press("ctrl+g")
            assert app.query_one("#bench-start", Button).disabled and services.bench.ran == []

    asyncio.run(scenario())


def test_history_and_comparison_name_each_runs_engine() -> None:
    from dataclasses import replace

    from metralectl.tui.widgets.history_table import COLUMNS

    bench = FakeBench()
    bench.runs = [replace(bench.runs[0], engine="llama-cpp"), replace(bench.runs[1], engine="metrale")]
    services = FakeServices(bench=bench)

    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("3")
            history = app.query_one(HistoryTable)
            await until(pilot, lambda: history.row_count == 2)
            column = COLUMNS.index("ENGINE")
            assert [str(history.get_row_at(i)[column]) for i in range(2)] == ["llama-cpp", "metrale"]
            history.focus()
            await pilot.press("space", "down", "space", "c")
            await until(pilot, lambda: isinstance(app.screen, RunDetailScreen), what="comparison")
            compare = app.screen.query_one("#run-compare")
            await until(pilot, lambda: compare.row_count >= 7)
            rows = [[str(cell) for cell in compare.get_row_at(i)] for i in range(compare.row_count)]  # type: ignore[attr-defined]
            assert ["engine", "llama-cpp", "metrale"] in rows

    asyncio.run(scenario())
