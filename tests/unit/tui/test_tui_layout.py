"""The dashboard's layout at the sizes it is designed for (80×24, 120×40, 160×50): SVG snapshots of the
Library and Serving, and assertions that hold whatever the snapshots say: the Library's deciding columns
(RECIPE, ENGINE, FITS, WEIGHTS) whole at 80 and 120 columns with the real shipped catalog, and `q Quit` in
the footer of every view at 80×24.

Update the snapshots after an intended change: `pytest tests/unit/tui/test_tui_layout.py --snapshot-update`,
then look at the SVGs before committing them.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace
from typing import Any

import pytest
from textual.pilot import Pilot

from metralectl.tui.app import MetralectlApp
from metralectl.tui.services import LibraryItem
from metralectl.tui.widgets.recipe_table import COLUMNS, RecipeTable
from tests.unit.tui.conftest import until
from tests.unit.tui.fakes import DEFAULT_ITEMS, library_row
from tests.unit.tui.test_tui_snapshots import SnapshotServices, screen_text, serving_ready, settled, started

pytest.importorskip("pytest_textual_snapshot")

SIZES = [(80, 24), (120, 40), (160, 50)]
DECIDING = ("RECIPE", "ENGINE", "FITS", "WEIGHTS")  # what says "can I run it here": never scrolled away

# The widest values the shipped catalog has (the longest name, engine and quant), fixed here so that a new
# recipe does not change the pictures; test_deciding_columns_whole_with_the_shipped_catalog reads the real one.
WIDE = LibraryItem(library_row("nemotron-3-nano-30b-a3b-llamacpp", model="Nemotron-3-Nano-30B-A3B",
                               quant="UD-Q4_K_XL", engine="llama-cpp", mtp=False, tok_s=None, fits=False,
                               weights="partial"), "metralectl/llama-cpp-gb10:11434.0.0", False)
ITEMS = (*DEFAULT_ITEMS, WIDE)


def library_app(items: tuple[LibraryItem, ...] = ITEMS) -> MetralectlApp:
    return MetralectlApp(SnapshotServices(items=items), status_every_s=3600.0)


async def library_shown(pilot: Pilot[int], rows: int) -> None:
    await started(pilot)
    await pilot.press("2")
    app = pilot.app
    await until(pilot, lambda: app.query_one(RecipeTable).row_count == rows and "Provenance" in
                app.query_one("#recipe-detail").text and app.focused is not None  # type: ignore[attr-defined]
                and app.focused.id == "recipes", what="library")
    await settled(pilot, "Provenance", "WEIGHTS")


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_library_snapshot(snap_compare: Any, size: tuple[int, int]) -> None:
    async def ready(pilot: Pilot[int]) -> None:
        await library_shown(pilot, len(ITEMS))

    assert snap_compare(library_app(), terminal_size=size, run_before=ready)


@pytest.mark.parametrize("size", [(120, 40), (160, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_serving_snapshot(snap_compare: Any, size: tuple[int, int]) -> None:
    # 80×24 and 200×50: test_tui_snapshots.py
    app = MetralectlApp(SnapshotServices(served=["qwen3.5-35b-a3b"]), status_every_s=3600.0)
    assert snap_compare(app, terminal_size=size, run_before=serving_ready)


def shipped_items() -> tuple[LibraryItem, ...]:
    """Every shipped recipe as the Library gets it, judged on gb10 (most say FITS `no`: the widest word)."""
    from metralectl.app import library
    from metralectl.core.catalog import load_catalog

    catalog = load_catalog(include_user=False)
    rows = library.rows(catalog, library.Target("gb10", "--hardware"))
    # `complete`: the widest weights state (an empty HF cache says `absent` for all)
    return tuple(LibraryItem(replace(r, weights="complete"), r.image, False) for r in rows)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_deciding_columns_whole_with_the_shipped_catalog(size: tuple[int, int]) -> None:
    items = shipped_items()
    longest = max(items, key=lambda i: len(i.row.name))

    async def scenario() -> None:
        app = library_app(items)
        async with app.run_test(size=size) as pilot:
            await library_shown(pilot, len(items))
            table = app.query_one(RecipeTable)
            last = COLUMNS.index("WEIGHTS")
            assert all(COLUMNS.index(c) <= last for c in DECIDING)
            widths = [c.get_render_width(table) for c in list(table.columns.values())[:last + 1]]
            assert table.scroll_x == 0 and sum(widths) <= table.scrollable_content_region.width, (
                widths, table.scrollable_content_region)
            # and as painted: the header and the longest name's row carry every deciding column, whole
            painted = screen_text(app).splitlines()
            header = next(t for t in painted if "RECIPE" in t)
            assert all(f" {word} " in header for word in DECIDING), header
            table.move_cursor(row=table.names.index(longest.row.name), animate=False)
            await until(pilot, lambda: any(longest.row.name in t for t in screen_text(app).splitlines()),
                        what="the longest name scrolled into view")
            row = next(t for t in screen_text(app).splitlines() if longest.row.name in t)
            assert re.search(rf"{re.escape(longest.row.name)} +{longest.row.engine} +(yes|no|\?) +complete ", row), row

    asyncio.run(scenario())


async def footer(pilot: Pilot[int], first_key: str) -> str:
    """The footer row once it shows the focused view's keys (`first_key` first)."""
    await until(pilot, lambda: screen_text(pilot.app).splitlines()[-1].startswith(first_key), what=first_key)
    return screen_text(pilot.app).splitlines()[-1]


def test_quit_in_the_footer_of_every_view_at_80x24() -> None:
    async def scenario() -> None:
        app = library_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await started(pilot)
            seen = {"serving": await footer(pilot, "f Follow")}
            await library_shown(pilot, len(ITEMS))
            seen["library"] = await footer(pilot, "/ Filter")
            await pilot.press("3")
            await until(pilot, lambda: app.query_one("#history").runs and app.focused is not None  # type: ignore[attr-defined]
                        and app.focused.id == "suite-select", what="bench")
            seen["bench"] = await footer(pilot, "^g Run")
            await pilot.press("ctrl+o")  # the history's own keys (space, c) come first in the footer
            await until(pilot, lambda: app.focused is not None and app.focused.id == "history", what="history")
            seen["bench history"] = await footer(pilot, "space Mark")
            await pilot.press("4")
            await until(pilot, lambda: app.query_one("#checks").row_count == 3  # type: ignore[attr-defined]
                        and app.focused is not None and app.focused.id == "checks", what="doctor")
            seen["doctor"] = await footer(pilot, "^r Re-run")
        missing = {view: text for view, text in seen.items() if "q Quit" not in text}
        assert not missing, missing

    asyncio.run(scenario())

