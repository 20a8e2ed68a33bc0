"""Library view and the action flow (plan → confirm → live progress → outcome), against fakes."""

from __future__ import annotations

import asyncio
import threading

from textual.pilot import Pilot
from textual.widgets import Input

from metralectl.errors import MetralError
from metralectl.tui.app import MetralectlApp
from metralectl.tui.screens.confirm import ConfirmScreen
from metralectl.tui.screens.progress import ProgressScreen
from metralectl.tui.widgets.log_tail import LogTail
from metralectl.tui.widgets.recipe_table import RecipeTable
from metralectl.tui.widgets.text_pane import TextPane
from tests.unit.tui.conftest import until
from tests.unit.tui.fakes import FakeServices


def library_app(services: FakeServices) -> MetralectlApp:
    return MetralectlApp(services)


async def show_library(pilot: Pilot[int], app: MetralectlApp) -> None:
    await pilot.press("2")
    table = app.query_one(RecipeTable)
    await until(pilot, lambda: table.row_count == 4 and app.focused is table, what="library shown and focused")


def test_table_filter_and_detail(services: FakeServices) -> None:
    async def scenario() -> None:
        app = library_app(services)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("2")
            table = app.query_one(RecipeTable)
            await until(pilot, lambda: table.row_count == 4, what="rows")
            assert table.names[0] == "qwen3.5-35b-a3b" and app.focused is table
            pane = app.query_one("#recipe-detail", TextPane)
            await until(pilot, lambda: "Provenance" in pane.text, what="detail")
            assert pane.text.startswith("qwen3.5-35b-a3b") and "docker run -d" in pane.text
            await pilot.press("down")
            await until(pilot, lambda: pane.text.startswith("qwen3.6-35b-a3b-fp8"), what="detail follows cursor")
            await pilot.press("slash")
            assert isinstance(app.focused, Input)
            await pilot.press(*"gemma")
            await until(pilot, lambda: table.names == ["gemma-4-31b"], what="filter")
            await pilot.press("enter")
            assert app.focused is table
            app.query_one("#library-filter", Input).value = "nothing-matches"
            await until(pilot, lambda: table.row_count == 0 and "no recipe matches" in pane.text)

    asyncio.run(scenario())


def test_run_flow_confirm_progress_outcome(services: FakeServices) -> None:
    async def scenario() -> None:
        app = library_app(services)
        async with app.run_test(size=(120, 40)) as pilot:
            await show_library(pilot, app)
            await pilot.press("r")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirmation")
            confirm = app.screen
            assert isinstance(confirm, ConfirmScreen) and confirm.plan.command
            assert ("plan", "run", "qwen3.5-35b-a3b") in services.calls
            await pilot.press("y")
            await until(pilot, lambda: isinstance(app.screen, ProgressScreen), what="progress")
            progress = app.screen
            assert isinstance(progress, ProgressScreen)
            await until(pilot, lambda: progress.outcome is not None, what="outcome")
            assert progress.outcome is not None and progress.outcome.status == "done"
            assert progress.model.ready_url == "http://127.0.0.1:8888"
            assert [line.text.split()[0] for line in progress.model.lines] == ["image", "started", "loading",
                                                                                "ready", "ready"]
            await until(pilot, lambda: progress.query_one(LogTail).line_count >= 30, what="boot log")
            await pilot.press("enter")
            await until(pilot, lambda: app.outcomes and app.main.active == "serving"
                        and isinstance(app.focused, LogTail), what="back to Serving, log focused")
            assert services.served == ["qwen3.5-35b-a3b"]
            table = app.query_one(RecipeTable)
            await until(pilot, lambda: str(table.get_row_at(0)[0]) == "●", what="serving marker")

    asyncio.run(scenario())


def test_cancel_removes_what_was_started(services: FakeServices) -> None:
    services.hold = threading.Event()  # the boot never finishes by itself

    async def scenario() -> None:
        app = library_app(services)
        async with app.run_test(size=(120, 40)) as pilot:
            await show_library(pilot, app)
            await pilot.press("r")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            await until(pilot, lambda: isinstance(app.screen, ProgressScreen))
            progress = app.screen
            assert isinstance(progress, ProgressScreen)
            await until(pilot, lambda: progress.model.phase == "loading", what="booting")
            await pilot.press("c")
            await until(pilot, lambda: progress.outcome is not None, what="cancelled outcome")
            assert progress.outcome is not None and progress.outcome.status == "cancelled"
            assert services.cleaned_up == ["run qwen3.5-35b-a3b"] and services.served == []
            await pilot.press("escape")
            await until(pilot, lambda: app.outcomes and app.outcomes[-1].status == "cancelled")

    asyncio.run(scenario())


def test_blocked_plan_offers_only_close(services: FakeServices) -> None:
    services.served = ["gemma-4-31b"]

    async def scenario() -> None:
        app = library_app(services)
        async with app.run_test(size=(80, 24)) as pilot:
            await show_library(pilot, app)
            await pilot.press("r")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            assert "already served" in (app.screen.plan.blocked or "")  # type: ignore[attr-defined]
            await pilot.press("y")  # refused: nothing starts
            await pilot.pause(0.1)
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
            assert not [c for c in services.calls if c[0] == "perform"]

    asyncio.run(scenario())


def test_a_failing_action_shows_why_and_the_hint(services: FakeServices) -> None:
    services.fail["perform"] = MetralError("start failed (out-of-memory): the engine ran out", "lower memory use")

    async def scenario() -> None:
        app = library_app(services)
        async with app.run_test(size=(120, 40)) as pilot:
            await show_library(pilot, app)
            await pilot.press("r")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            await until(pilot, lambda: isinstance(app.screen, ProgressScreen) and app.screen.outcome is not None)
            outcome = app.screen.outcome  # type: ignore[attr-defined]
            assert outcome.status == "failed" and "out-of-memory" in outcome.summary
            assert outcome.hint == "lower memory use"
            await pilot.press("enter")
            await until(pilot, lambda: bool(app.outcomes))
            assert app.is_running

    asyncio.run(scenario())


def test_worker_errors_become_notifications_not_crashes(services: FakeServices) -> None:
    services.fail["library"] = MetralError("the catalog is broken", "run `metralectl recipes check`")

    async def scenario() -> None:
        app = library_app(services)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: any("catalog is broken" in n.message for n in app._notifications),
                        what="notification")
            note = next(n for n in app._notifications if "catalog is broken" in n.message)
            assert note.severity == "error" and "recipes check" in note.message and note.title == "library"
            await pilot.press("2")
            assert app.is_running and app.query_one(RecipeTable).row_count == 0

    asyncio.run(scenario())


def test_pull_shows_a_byte_bar(services: FakeServices) -> None:
    async def scenario() -> None:
        app = library_app(services)
        async with app.run_test(size=(120, 40)) as pilot:
            await show_library(pilot, app)
            await pilot.press("p")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            await until(pilot, lambda: isinstance(app.screen, ProgressScreen) and app.screen.outcome is not None)
            progress = app.screen
            assert isinstance(progress, ProgressScreen)
            assert progress.model.bar is not None and progress.model.bar.done == 100
            assert progress.query_one("#progress-bar-row").display

    asyncio.run(scenario())


class _RealDetail(FakeServices):
    """The fake library rows, and the real `show` text for the detail pane (the catalog's own recipes)."""

    def detail(self, name: str) -> str:
        from metralectl.core.catalog import load_catalog
        from metralectl.present.show_view import as_text

        catalog = load_catalog()
        return as_text(catalog, catalog.recipe(name))


def test_the_engine_in_the_table_filter_and_detail() -> None:
    from dataclasses import replace

    from metralectl.tui.widgets.recipe_table import COLUMNS
    from tests.unit.tui.fakes import DEFAULT_ITEMS, library_row

    llama = replace(DEFAULT_ITEMS[0], row=library_row("gemma-4-31b", model="Gemma-4-31B", quant="q8_0",
                                                      engine="llama-cpp"))
    services = _RealDetail(items=(DEFAULT_ITEMS[0], llama))

    async def scenario() -> None:
        app = library_app(services)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("2")
            table = app.query_one(RecipeTable)
            await until(pilot, lambda: table.row_count == 2, what="rows")
            engine = COLUMNS.index("ENGINE")
            assert COLUMNS.index("RECIPE") + 1 == engine  # the engine sits next to the recipe's name
            assert [str(table.get_row_at(i)[engine]) for i in range(2)] == ["metrale", "llama-cpp"]
            # at 120 columns the engine is on screen, not scrolled away
            assert table.scroll_x == 0 and sum(c.get_render_width(table) for c in
                                               list(table.columns.values())[:engine + 1]) <= table.size.width
            pane = app.query_one("#recipe-detail", TextPane)
            await until(pilot, lambda: pane.text.startswith("qwen3.5-35b-a3b"), what="detail")
            assert pane.text.splitlines()[1].startswith("  engine        Metrale Engine (metrale), revision ")
            app.query_one("#library-filter", Input).value = "engine:llama-cpp"
            await until(pilot, lambda: table.names == ["gemma-4-31b"], what="engine filter")
            app.query_one("#library-filter", Input).value = "llama"  # a plain word matches the engine too
            await until(pilot, lambda: table.names == ["gemma-4-31b"], what="word filter")
            app.query_one("#library-filter", Input).value = "!engine:llama-cpp"
            await until(pilot, lambda: table.names == ["qwen3.5-35b-a3b"], what="negated engine filter")

    asyncio.run(scenario())
