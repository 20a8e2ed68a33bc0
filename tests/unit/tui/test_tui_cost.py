"""The dashboard's own cost, guarded by what causes it (the numbers are benchmarks/tui.py's):
- idle, the only timer that keeps firing is the status poll (no animation of a hidden widget, no
  fast polling) — read from the app's own timers, not from the clock;
- a poll or a telemetry tick that changes nothing repaints nothing;
- the first paint holds the Serving view only: the other views are imported and mounted after it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from textual.timer import Timer

from metralectl.tui.app import MetralectlApp
from metralectl.tui.screens.main import MainScreen
from metralectl.tui.views.serving import ServingView
from metralectl.tui.widgets.chart import Chart
from metralectl.tui.widgets.serving_card import ServingCard
from tests.unit.tui.conftest import until
from tests.unit.tui.fakes import FakeServices

FASTEST_IDLE_INTERVAL_S = 1.0  # anything that fires more often while nothing happens costs CPU for nothing


def running_timers(app: MetralectlApp) -> list[tuple[str, str, float]]:
    """Every repeating timer that is not paused, on the app and every node of every screen."""
    found = []
    for screen in app.screen_stack:
        for node in (app, screen, *screen.walk_children(with_self=False)):
            for timer in list(getattr(node, "_timers", ())):
                assert isinstance(timer, Timer)
                if timer._active.is_set() and timer._repeat is None:  # repeats forever and is not paused
                    found.append((type(node).__name__, timer.name, float(timer._interval)))
    return found


def test_idle_nothing_fires_faster_than_the_status_poll(services: FakeServices) -> None:
    async def scenario() -> None:
        app = MetralectlApp(services, status_every_s=2.0)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.main.query("#bench-view") and app.main.query_one("#bench-view").suites,
                        what="every view mounted and loaded")  # type: ignore[attr-defined]
            await until(pilot, lambda: app.query_one(ServingCard).report is not None, what="status")
            timers = running_timers(app)
            assert ("ServingView", "set_interval#1", 2.0) in timers  # the poll itself: proves the walk sees timers
            too_fast = [t for t in timers if t[2] < FASTEST_IDLE_INTERVAL_S]
            assert not too_fast, f"timers firing while idle: {too_fast}"  # e.g. a hidden ProgressBar's animation

    asyncio.run(scenario())


def test_a_poll_or_tick_that_changes_nothing_repaints_nothing(services: FakeServices) -> None:
    async def scenario() -> None:
        app = MetralectlApp(services, status_every_s=0.05)
        async with app.run_test(size=(120, 40)) as pilot:
            view = app.query_one(ServingView)
            card = app.query_one(ServingCard)
            await until(pilot, lambda: card.report is not None, what="status")
            updates: list[Any] = []
            original = card.update
            card.update = lambda *a, **k: (updates.append(a), original(*a, **k))[1]  # type: ignore[method-assign]
            polls = len([c for c in services.calls if c[0] == "status"])
            await until(pilot, lambda: len([c for c in services.calls if c[0] == "status"]) >= polls + 5,
                        what="five more polls")
            assert updates == []  # the same report each time (nothing served): the card was not re-rendered
            services.served = ["qwen3.5-35b-a3b"]
            await until(pilot, lambda: updates, what="a changed report shown")

            chart = app.query_one("#chart-util", Chart)
            refreshes: list[int] = []
            chart_refresh = chart.refresh
            chart.refresh = lambda *a, **k: (refreshes.append(1), chart_refresh(*a, **k))[1]  # type: ignore[method-assign]
            series = view.history.chart("util")
            for _ in range(3):
                chart.set_data(series.values, series.current, lines=series.lines, y_max=series.y_max,
                               note=series.note)
            assert len(refreshes) <= 1  # at most the first (if it differed from what was drawn), never the repeats
            chart.set_data((*series.values, 50.0), "50 %", y_max=100.0)
            assert len(refreshes) in (1, 2) and chart.current == "50 %"  # a change is drawn

    asyncio.run(scenario())


def test_the_first_paint_holds_only_the_serving_view(services: FakeServices, monkeypatch: Any) -> None:
    order: list[str] = []
    mount_hidden = MainScreen._mount_hidden_views

    async def recorded(self: MainScreen) -> None:
        order.append("other views mounted")
        await mount_hidden(self)

    monkeypatch.setattr(MainScreen, "_mount_hidden_views", recorded)

    class Recorded(MetralectlApp):
        def _display(self, screen: Any, renderable: Any) -> None:
            if renderable is not None and "painted" not in order:
                order.append("painted")
                assert not self.main.query("#library-view, #bench-view, #doctor-view")
            super()._display(screen, renderable)

    async def scenario() -> None:
        app = Recorded(services)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: len(app.main.query("#library-view, #bench-view, #doctor-view")) == 3,
                        what="the other views")
            await pilot.press("2")
            await until(pilot, lambda: app.main.active == "library" and app.focused is not None, what="library")

    asyncio.run(scenario())
    assert order == ["painted", "other views mounted"]
