"""A hidden tab does no periodic work: Serving's status poll, telemetry feed and log repaints stop while
another view is shown, and showing Serving again refreshes it at once (never stale on return).

Time passing is measured by a reference timer of the test's own (ticks of the same event loop), not by
the wall clock, so a busy machine slows both sides alike."""

from __future__ import annotations

import asyncio
from typing import Any

from textual.worker import WorkerState

from metralectl.tui.app import MetralectlApp
from metralectl.tui.views.serving import ServingView
from metralectl.tui.widgets.log_tail import LogTail
from tests.unit.tui.conftest import until
from tests.unit.tui.fakes import FakeServices

TICK_S = 0.05  # the status poll's interval in these tests, and the reference timer's


def status_calls(services: FakeServices) -> int:
    return len([c for c in services.calls if c[0] == "status"])


async def settle(pilot: Any, app: MetralectlApp) -> None:
    """Until no status poll is in flight (one started just before the switch may still report)."""
    await until(pilot, lambda: not [w for w in app.workers if w.group == "status"
                                    and w.state in (WorkerState.PENDING, WorkerState.RUNNING)], what="polls done")


async def ticks(pilot: Any, app: MetralectlApp, n: int) -> None:
    """Let `n` intervals of TICK_S pass, counted by a timer on the same loop as the view's own."""
    count = [0]
    timer = app.set_interval(TICK_S, lambda: count.__setitem__(0, count[0] + 1))
    try:
        await until(pilot, lambda: count[0] >= n, what=f"{n} reference ticks")
    finally:
        timer.stop()


def test_hidden_serving_stops_polling_and_its_feed(services: FakeServices) -> None:
    async def scenario() -> None:
        app = MetralectlApp(services, status_every_s=TICK_S)
        async with app.run_test(size=(120, 40)) as pilot:
            view = app.query_one(ServingView)
            await until(pilot, lambda: status_calls(services) >= 3, what="the poll running")
            await until(pilot, lambda: services.feeds and services.feeds[0].i >= 2, what="telemetry flowing")
            feed = services.feeds[0]

            await pilot.press("2")  # Library
            await until(pilot, lambda: app.main.active == "library", what="library shown")
            await until(pilot, lambda: feed.closed, timeout=5.0, what="the hidden view's feed closed")
            await settle(pilot, app)
            polls, views_taken = status_calls(services), feed.i
            await ticks(pilot, app, 10)  # ten poll intervals with Serving hidden
            assert status_calls(services) == polls, "the status poll ran while Serving was hidden"
            assert feed.i == views_taken and len(services.feeds) == 1, "telemetry was read while hidden"

            await pilot.press("1")  # Serving again: polls and a fresh feed resume
            await until(pilot, lambda: status_calls(services) >= polls + 3, what="polls resumed")
            await until(pilot, lambda: len(services.feeds) == 2 and services.feeds[1].started
                        and services.feeds[1].i >= 1, what="a new feed")
            assert view.history.latest is not None

    asyncio.run(scenario())


def test_showing_serving_refreshes_at_once(services: FakeServices) -> None:
    """With a poll interval far longer than the test, the status call seen after showing Serving can
    only be the immediate refresh."""
    async def scenario() -> None:
        app = MetralectlApp(services, status_every_s=600.0)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: status_calls(services) == 1, what="the first poll")
            await pilot.press("4")  # Doctor
            await until(pilot, lambda: app.main.active == "doctor", what="doctor shown")
            await settle(pilot, app)
            services.served = ["qwen3.5-35b-a3b"]  # changed while hidden
            await ticks(pilot, app, 3)
            assert status_calls(services) == 1
            await pilot.press("1")
            await until(pilot, lambda: status_calls(services) == 2, timeout=5.0, what="a refresh on show")
            view = app.query_one(ServingView)
            await until(pilot, lambda: view.report is not None and view.report.serving, what="the new report")

    asyncio.run(scenario())


def test_log_lines_wait_while_hidden_and_appear_on_show(services: FakeServices) -> None:
    """The follower keeps reading (a restart would lose or repeat lines), but a hidden log is not
    repainted: the lines wait in the Coalescer and are drawn in one batch when Serving is shown."""
    services.served = ["qwen3.5-35b-a3b"]

    async def scenario() -> None:
        app = MetralectlApp(services, status_every_s=600.0)
        async with app.run_test(size=(120, 40)) as pilot:
            view = app.query_one(ServingView)
            log = app.query_one(LogTail)
            await until(pilot, lambda: log.received == 5, what="the first lines")
            await pilot.press("2")
            await until(pilot, lambda: app.main.active == "library", what="library shown")
            view.lines.extend([f"hidden line {i}" for i in range(50)])  # the follower's thread would push these
            await ticks(pilot, app, 5)
            assert log.received == 5, "a hidden log was repainted"
            await pilot.press("1")
            await until(pilot, lambda: log.received == 55, timeout=5.0, what="the waiting lines drawn")
            assert log.lines[-1] == "hidden line 49"
            assert not services.follow_stops[0].is_set()  # the same follower all along

    asyncio.run(scenario())
