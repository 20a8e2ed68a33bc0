"""What `metralectl tui` does before its first frame, guarded by cause, not by the clock (the time is
benchmarks/tui.py's): the real entry point (`python -m metralectl tui`, real services) on a pty, watched
from inside by a driver that hooks Textual's App._display as Textual is imported and reports, at the first
frame that reaches the terminal and again a second later:
- the garbage collector did not run once Textual was being imported (tui.run pauses it; it found ~2,700
  objects of garbage for ~30 ms of the first paint), and runs again afterwards;
- no style of a view not shown or of a dialog was parsed (views.tcss, dialogs.tcss): every rule parsed
  before the first frame is matched against every node styled for it;
- nothing of Docker, HTTP, NVML, the Hub, YAML, the catalog, the lifecycle, telemetry or doctor was
  imported, nor the other views, the dialogs or their Textual widgets, nor services.py's values (~6 ms of
  dataclasses) or the bench service: they all come after;
- the screen had the breakpoint classes of the terminal's size (-wide, -tall at 120×50): Textual sets them
  on its first Resize, after the first frame, which was then laid out without them and everything styled
  and laid out again for the next;
- only the Serving view was mounted; the others are there a second later.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from metralectl.tui.app import MetralectlApp
from tests.unit import ptyterm
from tests.unit.tui.conftest import until
from tests.unit.tui.fakes import FakeServices

DRIVER = r"""
import gc, importlib.abc, importlib.util, json, os, sys

report = {"collections": 0}

def collections(phase, info):
    if phase == "start" and "textual" in sys.modules:
        report["collections"] += 1

def state(app):
    return {"gc_enabled": gc.isenabled(), "modules": sorted(sys.modules),
            "nodes": [f"{type(n).__name__}#{n.id}" for n in app.screen.walk_children(with_self=True)],
            "css": [where for where, _ in app.stylesheet.source], "classes": sorted(app.screen.classes)}

def watch(App):
    display = App._display

    def first_frame(self, screen, renderable):
        display(self, screen, renderable)
        if renderable is not None and "first" not in report:
            report["first"] = {**state(self), "collections_since_textual": report["collections"]}
            self.set_timer(1.0, lambda: later(self))

    App._display = first_frame

def later(app):
    report["later"] = state(app)
    with open(os.environ["FIRST_FRAME_REPORT"], "w") as out:
        json.dump(report, out)
    app.exit()

class WhenTextualAppLoads(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "textual.app":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            watch(module.App)

        spec.loader.exec_module = exec_module
        return spec

gc.callbacks.append(collections)
sys.meta_path.insert(0, WhenTextualAppLoads())
sys.argv = ["metralectl", "tui"]
import runpy
runpy.run_module("metralectl", run_name="__main__")
"""

# Not before the first frame: what the feeds, the other views and the dialogs load, and what they show with.
LATER = ("docker", "httpx", "requests", "urllib3", "pynvml", "huggingface_hub", "yaml", "metralectl.core.catalog",
         "metralectl.lifecycle", "metralectl.telemetry", "metralectl.doctor", "metralectl.seams.docker.runtime",
         "metralectl.app", "metralectl.tui.plans", "metralectl.tui.services", "metralectl.tui.bench_adapter",
         "metralectl.tui.bench_core", "metralectl.bench", "metralectl.tui.views.library", "metralectl.tui.views.bench",
         "metralectl.tui.views.doctor", "metralectl.tui.screens.confirm", "metralectl.tui.screens.progress",
         "metralectl.tui.screens.run_detail", "metralectl.tui.screens.message", "metralectl.tui.widgets.param_form",
         "metralectl.tui.widgets.recipe_table", "metralectl.tui.widgets.history_table",
         "metralectl.tui.widgets.check_table", "metralectl.tui.widgets.text_pane",
         "textual.widgets._data_table", "textual.widgets._progress_bar")  # Button, Select, Input: Textual's own
HIDDEN = ("LibraryView#library-view", "BenchView#bench-view", "DoctorView#doctor-view")


def first_frame_report(tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "first-frame.json"
    ran = ptyterm.run(["tui"], {"FIRST_FRAME_REPORT": str(out), "TERM": "xterm-256color"}, timeout=90,
                      columns=120, argv0=[sys.executable, "-c", DRIVER])
    assert ran.code == 0 and out.exists(), f"the dashboard did not paint and quit (exit {ran.code}): {ran.text[-2000:]}"
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def loaded(modules: list[str], names: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == n or m.startswith(n + ".") for n in names)]


def test_before_the_first_frame_only_the_serving_view_is_imported_styled_and_mounted(tmp_path: Path) -> None:
    report = first_frame_report(tmp_path)
    first, later = report["first"], report["later"]
    assert "metralectl.tui.views.serving" in first["modules"] and "ServingView#serving-view" in first["nodes"]
    problems = []  # every cause at once, each in its own words

    if first["collections_since_textual"] or first["gc_enabled"]:
        problems.append(f"the garbage collector ran {first['collections_since_textual']} times between importing "
                        "Textual and the first frame (tui.run() pauses it until then)")
    if not later["gc_enabled"]:
        problems.append("the garbage collector is still paused a second after the first frame")

    css = [Path(where).name for where in first["css"] if where.endswith(".tcss")]
    if css != ["app.tcss", "serving.tcss"]:
        problems.append(f"the first frame parsed {css}: only app.tcss and serving.tcss style what it shows")
    if "views.tcss" not in [Path(where).name for where in later["css"]]:
        problems.append("views.tcss was not read before the other views mounted")

    early = loaded(first["modules"], LATER)
    if early:
        problems.append(f"imported before the first frame: {early}")
    if not loaded(later["modules"], ("metralectl.tui.views.library", "textual.widgets._data_table")):
        problems.append("the other views were not imported a second after the first frame")

    if first["classes"] != later["classes"]:
        problems.append(f"the first frame was laid out for the breakpoint classes {first['classes']}, the terminal's "
                        f"are {later['classes']}: Textual sets them on its first Resize, after that frame")

    if [n for n in first["nodes"] if n in HIDDEN]:
        problems.append(f"mounted before the first frame: {[n for n in first['nodes'] if n in HIDDEN]}")
    if [n for n in later["nodes"] if n in HIDDEN] != list(HIDDEN):
        problems.append(f"a second after the first frame the other views are not all mounted: {later['nodes']}")

    assert not problems, "\n".join(problems)


def test_the_collector_is_resumed_only_by_whoever_paused_it() -> None:
    import gc

    from metralectl.tui.first_frame import pause_gc, resume_gc

    assert gc.isenabled()
    pause_gc()
    assert not gc.isenabled()
    resume_gc()
    resume_gc()  # the app ends after the main screen resumed it: nothing more
    assert gc.isenabled()
    gc.disable()  # someone else's pause (a caller that manages the collector itself): left as it is
    try:
        pause_gc()
        resume_gc()
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("size", [(80, 24), (119, 40), (120, 39), (120, 40), (200, 50)])
def test_the_first_frame_has_the_breakpoint_classes_textual_gives_the_screen_on_resize(
        services: FakeServices, size: tuple[int, int]) -> None:
    breakpoints = {name for _, name in (*MetralectlApp.HORIZONTAL_BREAKPOINTS, *MetralectlApp.VERTICAL_BREAKPOINTS)}
    first: list[set[str]] = []

    class Recorded(MetralectlApp):
        def _display(self, screen: Any, renderable: Any) -> None:
            if renderable is not None and not first:
                first.append(set(self.main.classes & breakpoints))
            super()._display(screen, renderable)

    async def scenario() -> set[str]:
        app = Recorded(services)
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: app.main.query("#library-view"), what="the views mounted after the first frame")
            await pilot.pause()
            return set(app.main.classes & breakpoints)  # Textual's own, set on the Resizes since

    settled = asyncio.run(scenario())
    assert len(settled) == 2 and first == [settled], (first, settled)


def test_quitting_as_the_first_frame_comes_ends_cleanly(services: FakeServices) -> None:
    """q pressed as the first frame shows (benchmarks/tui.py does): the other views, mounted after that frame,
    find their panes going; the dashboard still ends with 0 (it ended with MountError, exit 1)."""
    class QuitAtOnce(MetralectlApp):
        def _display(self, screen: Any, renderable: Any) -> None:
            super()._display(screen, renderable)
            if renderable is not None and self.return_code is None:
                self.exit(0)

    async def scenario() -> QuitAtOnce:
        app = QuitAtOnce(services)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.2)
        return app

    assert asyncio.run(scenario()).return_code == 0
