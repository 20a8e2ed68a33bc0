"""The bench form's names and fields apart, whatever the name's length: every real suite's parameters, and
the longest serve key of the shipped engine files as a parameter name."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from textual.widgets import Input, Select

from metralectl.tui.app import MetralectlApp
from metralectl.tui.bench_core import CoreBench
from metralectl.tui.services import ParamSpec, SuiteInfo
from metralectl.tui.widgets.param_form import NAME_COLUMNS, ParamForm
from tests.unit.tui.conftest import until
from tests.unit.tui.fakes import FakeBench, FakeServices
from tests.unit.tui.test_tui_snapshots import screen_text


def longest_engine_key() -> str:
    from metralectl.core.catalog import load_catalog

    return max((k for e in load_catalog(include_user=False).engines.values() for k in e.flags), key=len)


@dataclass
class RealSuites(FakeBench):
    def suites(self) -> list[SuiteInfo]:
        long = SuiteInfo("long-key", "A long key", "the longest engine key as a name", (
            ParamSpec(longest_engine_key(), "bool", False, "a flag"), ParamSpec("n", "int", 1, "a short one")))
        return [*CoreBench().suites(), long]

    def check_params(self, suite: str, values: dict[str, str]) -> tuple[dict[str, object], dict[str, str]]:
        return dict(values), {}


def test_every_name_stands_apart_from_its_field() -> None:
    bench = RealSuites()
    suites = bench.suites()

    async def scenario() -> None:
        app = MetralectlApp(FakeServices(bench=bench))
        # tall enough for the longest form (rate: its sweep-to-saturation knobs) without scrolling
        async with app.run_test(size=(120, 90)) as pilot:
            await pilot.press("3")
            await until(pilot, lambda: app.query("#suite-select") and app.query_one("#bench-view").suite
                        is not None, what="bench")  # type: ignore[attr-defined]
            for suite in suites:
                app.query_one("#suite-select", Select).value = suite.id
                form = app.query_one(ParamForm)
                names = [p.name for p in suite.params]
                await until(pilot, lambda: form.suite is not None and form.suite.id == suite.id and len(form.query(Input)) == len(names),
                            what=suite.id)
                await pilot.pause(0.1)
                painted = screen_text(app).splitlines()
                columns = set()
                for name in names:
                    # a form row starts at the left edge with the name (the pane is the screen's left half), two
                    # columns or more before its field; a name wider than the name column is folded onto the lines
                    # below, whole
                    rows = [i for i, t in enumerate(painted) if t.startswith(name[:NAME_COLUMNS // 2])]
                    assert rows, f"{suite.id}: {name} not painted"
                    m = re.match(r"(\S+)( {2,})\S", painted[rows[0]])
                    assert m, f"{suite.id}: {name} runs into its field: {painted[rows[0]]!r}"
                    columns.add(m.end(2))
                    shown, below = m.group(1), rows[0] + 1
                    while len(shown) < len(name) and below < len(painted) and below <= rows[0] + 3:
                        shown += painted[below][:m.end(1) + 1].strip()
                        below += 1
                    assert shown == name, (name, painted[rows[0]:below])
                assert len(columns) == 1, f"{suite.id}: fields not in one column {sorted(columns)}"

    asyncio.run(scenario())
