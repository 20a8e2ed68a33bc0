"""Text from outside in the dashboard, planted the way an attacker would: container labels on a shared
daemon, an engine's log, recipe fields from a synced set, doctor findings, servers' errors, an action's
events. Each source holds markup (an action on click, a link, an unbalanced closing tag) and terminal
controls; the dashboard must not crash, must show the markup as text, must send no raw control character
and must run nothing when the crafted word is clicked (tests/unit/tui/hostile.py)."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input

from metralectl.doctor.model import CheckResult
from metralectl.errors import MetralError
from metralectl.lifecycle import events as ev
from metralectl.lifecycle.status import Serving, StatusReport
from metralectl.telemetry.engine_view import EngineTarget
from metralectl.tui.app import MetralectlApp
from metralectl.cancel import CancelToken
from metralectl.tui.screens.confirm import ConfirmScreen
from metralectl.tui.screens.progress import ProgressScreen
from metralectl.tui.services import Action, Outcome, Plan
from metralectl.tui.widgets.log_tail import LogTail
from metralectl.tui.widgets.recipe_table import RecipeTable
from metralectl.tui.widgets.text_pane import TextPane
from tests.unit.tui.conftest import until
from tests.unit.tui.fakes import DEFAULT_ITEMS, FakeBench, FakeServices, top_view
from tests.unit.tui.hostile import (
    CLICK,
    CONTROLS,
    HOSTILE,
    MARKUP,
    SHOWN,
    assert_shown_safely,
    click_the_crafted_word,
    screen_lines,
)

REPO = Path(__file__).resolve().parents[3]

SIZE = (200, 50)


class LabelledServices(FakeServices):
    """A container someone else labelled as ours: every field `ps` reads from its labels is hostile, and so
    are the swap journal's line, NVML's GPU name and an engine's error."""

    def status(self) -> StatusReport:
        self.calls.append(("status",))
        serving = Serving(recipe=HOSTILE, name="metralectl-x", owner=HOSTILE, state="running", health=HOSTILE,
                          uptime=HOSTILE, uptime_s=60.0, endpoint="http://127.0.0.1:8888", run_id="run-1",
                          image="img", image_revision=HOSTILE)
        return StatusReport([serving], degraded=HOSTILE, last_swap=HOSTILE)


def hostile_views() -> list[Any]:
    view = top_view(0)
    gpu = replace(view.gpus[0], name=HOSTILE)
    engine = replace(view.engines[0], error=HOSTILE, target=EngineTarget(HOSTILE, "metralectl-x", "x", "container"))
    return [replace(view, gpus=(gpu,), engines=(engine,), engine_note=HOSTILE)]


def test_container_labels_on_the_serving_card_and_telemetry_notes() -> None:
    services = LabelledServices(views=hostile_views())

    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await until(pilot, lambda: app.main.query_one("#serving-view").report is not None  # type: ignore[attr-defined]
                        and any("DEGRADED" in text for text in screen_lines(app)), what="card")
            await until(pilot, lambda: any("thermal" in text for text in screen_lines(app)), what="telemetry notes")
            assert_shown_safely(app)
            await click_the_crafted_word(pilot, app)

    asyncio.run(scenario())


def test_engine_log_lines_are_escaped_in_the_serving_log() -> None:
    services = FakeServices(served=["qwen3.5-35b-a3b"])
    services.log_lines = ["before", HOSTILE, "loading 10%\rloading 99%", "tail\x85forged line", "after"]

    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            log = app.query_one("#serving-log", LogTail)
            await until(pilot, lambda: any("after" in text for text in screen_lines(app)), what="log lines")
            assert_shown_safely(app)
            lines = list(log.lines)
            assert lines[-5:] == ["before", lines[-4], "loading 99%", "tail\\x85forged line", "after"]
            assert lines[-4].startswith(CLICK)  # one line each: NEL and U+2028 split nothing

    asyncio.run(scenario())


class RecipeServices(FakeServices):
    """A synced set's recipe: its model, quant and hardware fields and its description (in `show`'s text)."""

    def detail(self, name: str) -> str:
        return f"{name} — {HOSTILE}\n\nProvenance\n  file          recipes/{name}.yaml (synced)"


def test_recipe_fields_in_the_library_table_detail_and_palette() -> None:
    row = replace(DEFAULT_ITEMS[0].row, model=HOSTILE, quant="nvfp4", hardware="gb10", engine=HOSTILE)
    services = RecipeServices(items=(replace(DEFAULT_ITEMS[0], row=row),))

    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await pilot.press("2")
            table = app.query_one(RecipeTable)
            pane = app.query_one("#recipe-detail", TextPane)
            await until(pilot, lambda: table.row_count == 1 and "Provenance" in pane.text, what="library")
            assert_shown_safely(app)
            await click_the_crafted_word(pilot, app)
            await pilot.press("ctrl+p")  # the palette reads its entries as markup
            await pilot.pause(0.2)
            await pilot.press(*"Pull")
            await until(pilot, lambda: any("Pull qwen3.5-35b-a3b" in text for text in screen_lines(app)),
                        what="palette entry")
            assert_shown_safely(app, CLICK, "[link=file:///etc/passwd]L[/link][/bold]")
            await click_the_crafted_word(pilot, app)  # a palette entry: runs the pull's plan, never the markup
            assert app.is_running

    asyncio.run(scenario())


def test_doctor_findings_in_the_table_and_detail() -> None:
    services = FakeServices(checks=[CheckResult("port", "Port 8888", "warn", f"in use by {HOSTILE} (pid 42)",
                                                f"stop {HOSTILE}")])

    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await pilot.press("4")
            await until(pilot, lambda: "remedy" in app.query_one("#check-detail", TextPane).text, what="detail")
            assert_shown_safely(app)
            await click_the_crafted_word(pilot, app)

    asyncio.run(scenario())


def test_errors_of_services_are_plain_notifications() -> None:
    services = FakeServices()
    services.fail["library"] = MetralError(HOSTILE, HOSTILE)  # a Hub's or the daemon's message, quoted
    services.fail["doctor"] = RuntimeError(HOSTILE)  # type: ignore[assignment]  # not ours: "internal error: …"

    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await pilot.press("4")
            await until(pilot, lambda: len(app._notifications) >= 2, what="both notifications")
            await until(pilot, lambda: any("internal error" in text for text in screen_lines(app)), what="toasts")
            assert_shown_safely(app)  # the toasts, over the Doctor view
            assert {n.markup for n in app._notifications} == {False}
            await click_the_crafted_word(pilot, app)

    asyncio.run(scenario())


class ActionServices(FakeServices):
    """An action whose plan, events and failure quote what outside said: a label of what already serves, a
    boot phase's log line, the engine's last lines, a server's error."""

    def plan(self, action: Action, name: str | None) -> Plan:
        return Plan(action, name, f"Run {CLICK}", (f"start {HOSTILE}",), command=f"docker run {HOSTILE}",
                    warnings=(HOSTILE,), hint=HOSTILE)

    def perform(self, action: Action, name: str | None, on_event: Any, cancel: CancelToken) -> Outcome:
        on_event(ev.Step("image", HOSTILE))
        on_event(ev.Phase("loading", HOSTILE, 0.1))
        on_event(ev.LogLine(HOSTILE))
        assert self.hold is not None
        self.hold.wait(10)
        error = MetralError(HOSTILE, HOSTILE)
        error.last_lines = [HOSTILE]  # type: ignore[attr-defined]
        raise error


def test_an_actions_plan_progress_and_failure() -> None:
    services = ActionServices(hold=threading.Event())

    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await pilot.press("2")
            await until(pilot, lambda: app.query_one(RecipeTable).row_count == 4, what="library")
            await pilot.press("r")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="plan")
            await pilot.pause(0.1)
            await click_the_crafted_word(pilot, app)  # the dialog's title: a Label
            assert_shown_safely(app, CLICK, SHOWN[2])
            await pilot.press("y")
            await until(pilot, lambda: isinstance(app.screen, ProgressScreen) and app.screen.model.phase == "loading")
            await until(pilot, lambda: app.screen.query_one(LogTail).line_count == 1, what="log line")
            assert_shown_safely(app)
            services.hold.set()  # type: ignore[union-attr]
            await until(pilot, lambda: app.screen.outcome is not None, what="failure")  # type: ignore[attr-defined]
            await pilot.pause(0.1)
            assert_shown_safely(app)

    asyncio.run(scenario())


def test_user_recipes_through_the_real_catalog(isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real library and `show` (CoreServices, Docker unreachable): a refused user recipe whose file name
    would set the window title (the Library's note quotes the path), and a valid one whose description holds
    markup (the checker refuses its controls, not its brackets)."""
    from metralectl.tui.core_services import CoreServices

    monkeypatch.setenv("DOCKER_HOST", f"unix://{isolated_env}/no-docker.sock")
    recipes = isolated_env / "config" / "recipes"
    recipes.mkdir()
    (recipes / f"x{CONTROLS}[@click=app.toggle_theme]CLICK.yaml").write_text("schema: 1\nname: broken\n")
    demo = (REPO / "recipes" / "demo-cpu.yaml").read_text()
    demo = demo.replace("name: demo-cpu", "name: evil-demo").replace(
        "description: Qwen2.5", f"description: {json.dumps(MARKUP)} # Qwen2.5")
    (recipes / "evil-demo.yaml").write_text(demo)
    core = CoreServices(bench=FakeBench())
    services = FakeServices()
    services.library, services.detail = core.library, core.detail  # type: ignore[method-assign]

    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=(250, 50), notifications=True) as pilot:
            await pilot.press("2")
            table = app.query_one(RecipeTable)
            await until(pilot, lambda: "evil-demo" in table.names, timeout=30, what="the catalog")
            app.query_one("#library-filter", Input).value = "evil"
            pane = app.query_one("#recipe-detail", TextPane)
            await until(pilot, lambda: pane.text.startswith("evil-demo"), timeout=30, what="show's text")
            await pilot.pause(0.1)
            assert_shown_safely(app, "recipes/x\\x1b]0;T\\x07", f"evil-demo — {CLICK}")
            await click_the_crafted_word(pilot, app)

    try:
        asyncio.run(scenario())
    finally:
        core.close()
