"""SVG snapshots at fixed sizes with a fixed clock (pytest-textual-snapshot).

Update after an intended change: `pytest tests/unit/tui/test_tui_snapshots.py --snapshot-update`, then
look at the SVGs (or snapshot_report.html) before committing them.
"""

from __future__ import annotations

from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable

from metralectl.tui.app import MetralectlApp
from metralectl.tui.views.serving import ServingView
from tests.unit.tui.conftest import until
from tests.unit.tui.fakes import FakeServices, several_view, top_view

pytest.importorskip("pytest_textual_snapshot")


class SnapshotFeed:
    """One view, then silence: the test pushes the rest as one burst, so every run draws the same."""

    interval_s = 3600.0

    def start(self) -> None:
        pass

    def view(self) -> Any:
        return top_view(0)

    def close(self) -> None:
        pass


class SeveralFeed(SnapshotFeed):
    def view(self) -> Any:
        return several_view(0)


class SnapshotServices(FakeServices):
    several = False

    def telemetry(self) -> SnapshotFeed:  # type: ignore[override]
        return SeveralFeed() if self.several else SnapshotFeed()


def make_app(served: bool = True, theme: str = "textual-dark") -> MetralectlApp:
    services = SnapshotServices(served=["qwen3.5-35b-a3b"] if served else [])
    return MetralectlApp(services, theme=theme, status_every_s=3600.0)


async def started(pilot: Pilot[int]) -> None:
    """The main screen is composed and its first view focused (keys before that would be lost)."""
    await until(pilot, lambda: pilot.app.screen.query(ServingView) and pilot.app.focused is not None, what="start")


def screen_text(app: Any) -> str:
    """The screen as the compositor paints it, as plain text."""
    import io

    from rich.console import Console

    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), color_system=None, record=True)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


async def settled(pilot: Pilot[int], *fragments: str) -> None:
    """Every DataTable has measured its rows and the painted screen shows `fragments` (tables measure
    when idle; on a busy machine a screenshot could otherwise catch them half-done)."""
    await until(pilot, lambda: not any(t._require_update_dimensions for t in pilot.app.screen.query(DataTable)),
                what="tables measured")
    try:
        await until(pilot, lambda: all(f in screen_text(pilot.app) for f in fragments), what=f"painted {fragments}")
    except AssertionError:
        print("DUMP", screen_text(pilot.app))
        for t in pilot.app.screen.query(DataTable):
            print("TABLE", t.id, [(c.label.plain, c.width, c.content_width) for c in t.columns.values()], t.size)
        raise
    await pilot.pause(0.1)


async def serving_ready(pilot: Pilot[int]) -> None:
    await started(pilot)
    app = pilot.app
    view = app.query_one(ServingView)
    await until(pilot, lambda: view.history.latest is not None and view.report is not None, what="first data")
    view.telemetry.extend([top_view(i) for i in range(1, 60)])
    await until(pilot, lambda: len(view.history.values("util")) == 60 and view.query_one("LogTail").received == 5,
                what="burst drawn")
    await settled(pilot, "engine line 4", "Tokens/s")


async def library_ready(pilot: Pilot[int]) -> None:
    await started(pilot)
    await pilot.press("2")
    app = pilot.app
    await until(pilot, lambda: app.query_one("#recipes").row_count == 4 and "Provenance" in
                app.query_one("#recipe-detail").text and app.focused is not None  # type: ignore[attr-defined]
                and app.focused.id == "recipes", what="library")
    await settled(pilot, "qwen3.5-35b-a3b-hopper", "Provenance")


def test_serving_80x24(snap_compare: Any) -> None:
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=serving_ready)


def test_serving_200x50(snap_compare: Any) -> None:
    assert snap_compare(make_app(), terminal_size=(200, 50), run_before=serving_ready)


def test_serving_several_models_and_gateways_120x40(snap_compare: Any) -> None:
    """Two engines side by side, each with its engine, model and port; a gateway serving and one gone."""
    services = SnapshotServices(served=["qwen3.5-35b-a3b", "gemma-4-e4b"])
    services.several = True
    app = MetralectlApp(services, theme="textual-dark", status_every_s=3600.0)

    async def ready(pilot: Pilot[int]) -> None:
        await started(pilot)
        view = pilot.app.query_one(ServingView)
        await until(pilot, lambda: view.history.latest is not None and view.report is not None, what="first data")
        view.telemetry.extend([several_view(i) for i in range(1, 60)])
        await until(pilot, lambda: len(view.history.values("util")) == 60, what="burst drawn")
        await settled(pilot, "gemma-4-e4b-q8", "8091", "Tokens/s")

    assert snap_compare(app, terminal_size=(120, 40), run_before=ready)


def test_library_light_120x40(snap_compare: Any) -> None:
    assert snap_compare(make_app(served=False, theme="textual-light"), terminal_size=(120, 40),
                        run_before=library_ready)


def test_run_confirmation_80x24(snap_compare: Any) -> None:
    async def confirm(pilot: Pilot[int]) -> None:
        await library_ready(pilot)
        await pilot.press("r")
        await until(pilot, lambda: type(pilot.app.screen).__name__ == "ConfirmScreen", what="dialog")
        await settled(pilot, "Run qwen3.5-35b-a3b", "Cancel (n)")

    assert snap_compare(make_app(served=False), terminal_size=(80, 24), run_before=confirm)


def test_doctor_80x24(snap_compare: Any) -> None:
    async def doctor(pilot: Pilot[int]) -> None:
        await started(pilot)
        await pilot.press("4")
        await until(pilot, lambda: pilot.app.query_one("#checks").row_count == 3, what="checks")
        await until(pilot, lambda: "remedy" in pilot.app.query_one("#check-detail").text  # type: ignore[attr-defined]
                    and pilot.app.focused is not None and pilot.app.focused.id == "checks", what="focused")
        await settled(pilot, "FAIL  GPU driver     no NVIDIA driver", "remedy")

    assert snap_compare(make_app(served=False), terminal_size=(80, 24), run_before=doctor)


def test_benchmarks_120x40(snap_compare: Any) -> None:
    async def bench(pilot: Pilot[int]) -> None:
        await started(pilot)
        await pilot.press("3")
        app = pilot.app
        await until(pilot, lambda: app.query_one("#bench-view").suite is not None  # type: ignore[attr-defined]
                    and len(app.query_one("#history").runs) == 2, what="bench")  # type: ignore[attr-defined]
        await settled(pilot, "2025-11-29 16:00  sweep", "max_tokens")

    assert snap_compare(make_app(served=False), terminal_size=(120, 40), run_before=bench)
