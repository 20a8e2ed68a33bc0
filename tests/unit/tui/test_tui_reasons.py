"""The dashboard says why, before anything is asked (issue 28, item 6), in the words `list` and the page say.

The real library (CoreServices: the catalog, app/library's fit and blocked, on the shared fake runtime with
the GB10 image present, on an x86-64 box with no GPU) in the real dashboard (Pilot): for the chosen recipe the
line under the table gives FITS's reason and, when Run and Swap cannot go here whatever serves, why — and r
and w are shown disabled and do nothing (no plan, no confirmation). The page's /api/recipes (the agent's
LifecycleOps on the same runtime) and `list`'s footnotes say the same words.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input, Label

from metralectl.seams import machine
from metralectl.tui.app import MetralectlApp
from metralectl.tui.screens.confirm import ConfirmScreen
from metralectl.tui.widgets.recipe_table import RecipeTable
from tests.fakes.runtime import FakeRuntime, image
from tests.unit.tui.conftest import until
from tests.unit.tui.fakes import FakeBench, FakeServices

GB10_IMAGE = "metrale/metrale-inference-gb10:latest"
HOPPER_IMAGE = "metrale/metrale-inference-hopper:latest"
ON_ARM = (f"image {GB10_IMAGE} is built for linux/arm64 (gb10); this machine is linux/amd64 (x86_64)")
NO_GPU = "built for gb10, and this box has no NVIDIA GPU"


def runtime() -> FakeRuntime:
    return FakeRuntime(images=[image(GB10_IMAGE, "linux/arm64"), image(HOPPER_IMAGE, "linux/amd64")])


class Shared:
    """In place of the dashboard's kept Docker connection (seams/docker/shared.SharedRuntime)."""

    def __call__(self) -> FakeRuntime:
        return runtime()

    def close(self) -> None:
        pass


@pytest.fixture()
def box(isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An x86-64 box without a GPU, the hopper recipe's weights verified in its cache."""
    from tests.integration.conftest import Box

    monkeypatch.setattr(machine, "cpu_arch", lambda: "x86_64")
    monkeypatch.setattr(machine, "gpu_names", lambda: [])
    Box(isolated_env, {}).weights_complete("Sehyo/Qwen3.5-35B-A3B-NVFP4")  # what `pull` leaves
    return isolated_env


def why(app: MetralectlApp) -> str:
    label = app.query_one("#library-why", Label)
    return str(label.render()) if label.display else ""


def enabled(app: MetralectlApp, key: str) -> bool:
    return app.screen.active_bindings[key].enabled


def test_r_and_w_disabled_with_the_reason_before_anything_is_asked(box: Path) -> None:
    from metralectl.tui.core_services import CoreServices

    core = CoreServices(bench=FakeBench())  # type: ignore[arg-type]
    core._shared = Shared()  # type: ignore[assignment]
    services = FakeServices()
    services.library, services.detail = core.library, core.detail  # type: ignore[method-assign]

    async def choose(pilot: Any, app: MetralectlApp, name: str) -> None:
        app.query_one("#library-filter", Input).value = name
        table = app.query_one(RecipeTable)
        await until(pilot, lambda: table.chosen == name, timeout=30, what=name)
        app.set_focus(table)
        await pilot.pause(0.05)

    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=(160, 50)) as pilot:
            await pilot.press("2")
            table = app.query_one(RecipeTable)
            await until(pilot, lambda: "qwen3.5-27b" in table.names, timeout=30, what="the catalog")

            await choose(pilot, app, "qwen3.5-27b")  # a GB10 recipe on an x86-64 box
            assert why(app) == f"FITS no: {NO_GPU}\n✘ run, swap: {ON_ARM} → use a recipe for this machine's " \
                "hardware (`metralectl list` marks what fits), or declare your own linux/amd64 image in your " \
                "config's images/ directory", why(app)
            assert not enabled(app, "r") and not enabled(app, "w") and enabled(app, "p") and enabled(app, "x")
            await pilot.press("r")
            await pilot.press("w")
            await pilot.pause(0.3)
            assert not isinstance(app.screen, ConfirmScreen) and not [c for c in services.calls if c[0] == "plan"]

            await choose(pilot, app, "deepseek-v4-flash-ep2")  # two nodes: never from the dashboard
            assert why(app).startswith("FITS no: needs 2 nodes, this is one box (`run --worker` spans them); "
                                       f"{NO_GPU}\n✘ run, swap: deepseek-v4-flash-ep2 needs 2 ranks on 2 nodes"), why(app)
            assert not enabled(app, "r")

            await choose(pilot, app, "qwen3.5-35b-a3b-hopper")  # its image and weights here: it may go
            assert why(app) == "FITS no: built for hopper, and this box has no NVIDIA GPU", why(app)
            assert enabled(app, "r") and enabled(app, "w")
            await pilot.press("r")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the plan asked")
            assert ("plan", "run", "qwen3.5-35b-a3b-hopper") in services.calls
            await pilot.pause(0.2)
            await pilot.press("n")
            await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), what="the question closed")

    try:
        asyncio.run(scenario())
    finally:
        core.close()


def test_the_page_and_list_say_the_same_words(box: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from metralectl.agent.ops import LifecycleOps
    from metralectl.cli.catalog_list import list_recipes
    from metralectl.tui.core_services import CoreServices

    core = CoreServices(bench=FakeBench())  # type: ignore[arg-type]
    core._shared = Shared()  # type: ignore[assignment]
    shown = {i.row.name: i for i in core.library().items}
    ops = LifecycleOps(lambda: None)
    monkeypatch.setattr(ops, "_runtime", lambda timeout=10.0: runtime())
    page = {r["name"]: r for r in ops.recipes()["recipes"]}
    for name in ("qwen3.5-27b", "deepseek-v4-flash-ep2"):  # what no staging brings: the same for both
        assert page[name]["blocked"]["error"] == shown[name].blocked, name
    assert page["qwen3.5-27b"]["blocked"]["error"] == ON_ARM
    assert page["qwen3.5-35b-a3b-hopper"]["blocked"] is None and shown["qwen3.5-35b-a3b-hopper"].blocked is None
    assert page["qwen3.5-27b"]["fit_note"] == NO_GPU and page["demo-cpu"]["fit_note"] is None

    list_recipes(None, None, False, False)
    err = capsys.readouterr().err
    footnotes = {m.group(1) for m in re.finditer(r"^(?:FITS|    ) [¹²³⁴⁵⁶⁷⁸⁹⁰]+ (.+)$", err, re.MULTILINE)}
    for name in ("qwen3.5-27b", "deepseek-v4-flash-ep2", "qwen3.5-35b-a3b-hopper"):
        assert page[name]["fit_note"] in footnotes, (name, err)
    list_recipes(None, None, False, True)
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["recipes"]}
    assert all(rows[n]["fits_reason"] == page[n]["fits_reason"] for n in rows)
