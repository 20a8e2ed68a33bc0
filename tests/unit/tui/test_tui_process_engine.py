"""Serving view: an engine run as a host process (`runtime: process`, seams/process) is listed as LocalRuntime
lists it, beside Docker's containers: its recipe, state, health and endpoint, and that it is a host process
(it has no image revision to show; an operator stopping it or reading its logs wants to know where it runs)."""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from metralectl.core.labels import LABEL_ENDPOINT, LABEL_MANAGED, LABEL_OWNER, LABEL_RECIPE, LABEL_RUN_ID, owner
from metralectl.lifecycle.status import StatusReport
from metralectl.seams.endpoint import Health
from metralectl.tui.app import MetralectlApp
from metralectl.tui.widgets.serving_card import ServingCard
from tests.fakes.runtime import FakeRuntime
from tests.unit.tui.conftest import until
from tests.unit.tui.fakes import FakeServices

RECIPE = "qwen3.5-35b-a3b-llamacpp"
PROGRAM = "/opt/llama.cpp/bin/llama-server"
ENDPOINT = "http://127.0.0.1:8891"


class LocalServices(FakeServices):
    """The dashboard's status as CoreServices gets it: app.serving's ps() over LocalRuntime, its Docker side an
    empty daemon, its host-process side the real ProcessRuntime reading the state a launch wrote."""

    def status(self) -> StatusReport:
        from metralectl.app.serving import Serving
        from metralectl.lifecycle.local_runtime import LocalRuntime

        return Serving(runtime=lambda: LocalRuntime(FakeRuntime(), None)).ps()


def _plant_launch() -> None:
    """The state a `run --runtime process` leaves: its engine this very test process (so it runs, and outlives
    nothing), its image the program it runs, its labels a container's."""
    from metralectl.seams.process import group, state

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 720))
    labels = {LABEL_MANAGED: "true", LABEL_OWNER: owner(), LABEL_RECIPE: RECIPE, LABEL_RUN_ID: "run-7",
              LABEL_ENDPOINT: ENDPOINT}
    with state.locked() as store:
        state.write({"schema": state.SCHEMA, "name": f"metralectl-{RECIPE}", "owner_uid": os.geteuid(),
                     "launch": "launch-7", "image": f"process:{PROGRAM}", "argv": [PROGRAM, "--port", "8891"],
                     "labels": labels, "started_at": started, "engine": group.identity_of(os.getpid())}, store)


def _drawn(card: ServingCard) -> str:
    return "\n".join("".join(seg.text for seg in line) for line in card.render_lines(card.region.reset_offset))


def _row(services: LocalServices, size: tuple[int, int]) -> str:
    """The card's row of the one engine served, as painted at that size (its report checked first)."""

    async def scenario() -> str:
        app = MetralectlApp(services, status_every_s=0.2)
        async with app.run_test(size=size) as pilot:
            card = app.query_one(ServingCard)
            await until(pilot, lambda: card.report is not None and card.report.serving, what="status")
            await pilot.pause()
            assert card.report is not None
            [served] = card.report.serving
            assert (served.recipe, served.state, served.image) == (RECIPE, "running", f"process:{PROGRAM}")
            assert served.host_process and served.image_revision is None
            [row] = [x for x in _drawn(card).splitlines() if ENDPOINT in x]
            return row

    return asyncio.run(scenario())


def test_a_host_process_engine_is_shown_as_one(isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _plant_launch()
    answered: list[str] = []

    def health(url: str, timeout: float, path: str = "/health", headers: Any = None) -> Health:
        answered.append(url)
        return Health(200, "ok")

    monkeypatch.setattr("metralectl.lifecycle.status.health_once", health)
    services = LocalServices()
    wide = _row(services, (120, 40))
    # its recipe, health, uptime (from its state's start), endpoint, and that it runs as a process; a running
    # engine's state is said by its health and uptime, as a container's is
    recipe, health_, uptime, *rest = wide.split()
    assert (recipe, health_, rest) == (RECIPE, "ok", [f"{ENDPOINT}/v1", "process", owner()]), wide
    assert re.fullmatch(r"1\d+m", uptime), wide  # started 12 minutes before: minutes, however slow the test
    small = _row(services, (80, 24))  # the smallest designed size: the endpoint and "process" stay whole
    assert f"{ENDPOINT}/v1" in small and small.split()[-2:] == ["process", owner()], small
    assert set(answered) == {ENDPOINT}  # its health asked (each poll) where its label says it listens
