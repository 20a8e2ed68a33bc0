"""The dashboard on the real core: a real Docker daemon and the engine test double, driven by Pilot.

Launch from the Library, watch it become ready (boot phases from the log), see it on the Serving
view with its log, cancel a slow start (the half-started container is removed), stop it.
"""

from __future__ import annotations

import asyncio

import pytest

from metralectl.seams import store
from tests.integration.conftest import Box
from tests.unit.tui.conftest import until

pytestmark = [pytest.mark.docker, pytest.mark.integration]
ENV = ("METRALECTL_CONFIG_DIR", "METRALECTL_CACHE_DIR", "HF_HOME", "METRALE_HOME", "METRALECTL_LOCK_DIR")


@pytest.fixture()
def tui_box(box: Box, monkeypatch: pytest.MonkeyPatch) -> Box:
    for name in ENV:  # the app runs in this process: give it the box's machine
        monkeypatch.setenv(name, box.env[name])
    box.weights_complete()
    return box


async def _act(pilot, app, recipe: str, key: str, timeout: float = 90.0):  # type: ignore[no-untyped-def]
    from metralectl.tui.screens.confirm import ConfirmScreen
    from metralectl.tui.screens.progress import ProgressScreen
    from metralectl.tui.widgets.recipe_table import RecipeTable

    await pilot.press("2")
    table = app.query_one(RecipeTable)
    await until(pilot, lambda: recipe in table.names and app.focused is table, timeout=30, what="library")
    table.move_cursor(row=table.names.index(recipe))
    await pilot.press(key)
    await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), timeout=30, what="confirmation")
    assert not app.screen.plan.blocked, app.screen.plan.blocked
    await pilot.press("y")
    await until(pilot, lambda: isinstance(app.screen, ProgressScreen), what="progress")
    return app.screen


def test_launch_watch_ready_and_stop(tui_box: Box) -> None:
    from metralectl.tui.app import MetralectlApp
    from metralectl.tui.core_services import CoreServices
    from metralectl.tui.widgets.log_tail import LogTail
    from metralectl.tui.widgets.serving_card import ServingCard

    name = tui_box.recipe("tui", image="slow3")  # ready after 3 s: the phases show

    async def scenario() -> None:
        app = MetralectlApp(CoreServices(), status_every_s=0.5)
        async with app.run_test(size=(120, 40)) as pilot:
            progress = await _act(pilot, app, name, "r")
            await until(pilot, lambda: progress.outcome is not None, timeout=90, what="ready")
            assert progress.outcome.status == "done", progress.outcome
            phases = [line.text.split()[0] for line in progress.model.lines]
            assert {"kernel-select", "loading", "kv-sizing", "ready"} <= set(phases)  # today's engine's phases
            await pilot.press("enter")
            card = app.query_one(ServingCard)
            await until(pilot, lambda: card.report is not None and any(
                s.recipe == name and s.health == "ok" for s in card.report.serving), timeout=30, what="serving, healthy")
            log = app.query_one(LogTail)
            await until(pilot, lambda: any("Server live and ready at" in line for line in log.lines), timeout=30, what="log")
            await pilot.press("x")
            await until(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen", timeout=30)
            await pilot.press("y")
            await until(pilot, lambda: getattr(app.screen, "outcome", None) is not None, timeout=60, what="stopped")
            assert "removed: yes" in app.screen.outcome.summary  # type: ignore[attr-defined]
            await pilot.press("enter")
        assert tui_box.containers() == []

    asyncio.run(scenario())


def test_cancel_a_silent_boot_removes_the_container(tui_box: Box) -> None:
    from metralectl.tui.app import MetralectlApp
    from metralectl.tui.core_services import CoreServices

    name = tui_box.recipe("cancel", image="slow")  # silent for 30 s before it is ready

    async def scenario() -> None:
        app = MetralectlApp(CoreServices(), status_every_s=0.5)
        async with app.run_test(size=(120, 40)) as pilot:
            progress = await _act(pilot, app, name, "r")
            await until(pilot, lambda: tui_box.containers() != [], timeout=30, what="container started")
            await until(pilot, lambda: any(line.text.startswith("started") for line in progress.model.lines), timeout=30)
            await pilot.press("c")
            await until(pilot, lambda: progress.outcome is not None, timeout=30, what="cancelled")
            assert progress.outcome.status == "cancelled"
        assert tui_box.containers() == []
        assert store.lock_holder() is None  # the lock the action took is free again

    asyncio.run(scenario())


def test_swap_shows_the_downtime_by_phase(tui_box: Box) -> None:
    from metralectl.tui.app import MetralectlApp
    from metralectl.tui.core_services import CoreServices
    from metralectl.tui.widgets.serving_card import ServingCard

    first = tui_box.recipe("swap-a")
    second = tui_box.recipe("swap-b")

    async def scenario() -> None:
        app = MetralectlApp(CoreServices(), status_every_s=0.5)
        async with app.run_test(size=(120, 40)) as pilot:
            for recipe, key in ((first, "r"), (second, "w")):
                progress = await _act(pilot, app, recipe, key)
                await until(pilot, lambda p=progress: p.outcome is not None, timeout=90, what=f"{key} {recipe}")
                assert progress.outcome.status == "done", progress.outcome
                await pilot.press("enter")
            assert progress.outcome.summary.startswith(f"swapped {first} → {second}: downtime")
            card = app.query_one(ServingCard)
            await until(pilot, lambda: card.report is not None and card.report.last_swap is not None
                        and any(s.recipe == second for s in card.report.serving), timeout=30, what="last swap")
            assert "swapped, downtime" in card.report.last_swap and "boot" in card.report.last_swap
        tui_box.cli("stop", "--all", check=True)

    asyncio.run(scenario())
