"""Cancel from the agent's API and from the dashboard, on the real core (app/serving.py, the lifecycle) over the
shared fake runtime: an engine that loads for 30 s without a word is cancelled within a moment, its container
removed, the job or the dialog saying so, and nothing is ever pushed into a thread (ctypes' asynchronous
exception is replaced here by one that only records it was asked for)."""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from metralectl import paths
from metralectl.lifecycle.memory import NoMemoryWatch
from metralectl.seams import hfcache, machine, store
from tests.fakes.lifecycle import GB10_IMAGE, port_released
from tests.fakes.runtime import PREFIX, Answer, Boot, FakeRuntime, Listen, Log, image
from tests.ports import own_port

NAME = "cancel-me"
CONTAINER = f"metralectl-{NAME}"
SILENT = Boot((Log(PREFIX + "Metrale Engine starting..."), Listen(),
               Answer(200, {"status": "ready", "model": "m"}, after_s=30)), model="m")
TOKEN = "c" * 43
PROMPT_S = 3.0


def _weights_complete(repo: str) -> None:
    """A verified snapshot in the HF cache, as `metralectl pull` leaves one."""
    commit = "0" * 40
    base = paths.hf_hub_cache() / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    (base / "refs").mkdir(exist_ok=True)
    (base / "refs" / "main").write_text(commit)
    listing = []
    for name, data in {"config.json": b"{}", "model.safetensors": b"\0" * 16}.items():
        (snap / name).write_bytes(data)
        listing.append(hfcache.RepoFile(name, len(data), hashlib.sha256(data).hexdigest()))
    hfcache.write_json_atomic(snap / hfcache.VERIFIED_MANIFEST, hfcache.Listing(repo, commit, tuple(listing)).to_json())


class Box:
    def __init__(self, runtime: FakeRuntime, port: int) -> None:
        self.runtime = runtime
        self.port = port
        self.injected: list[Any] = []


@pytest.fixture()
def box(isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Box]:
    """A user recipe on a port the test owns (the shipped gb10 one), its weights verified in the HF cache; every
    runtime the code opens is one fake daemon, where the recipe's engine loads silently."""
    from metralectl.core.catalog import load_catalog

    port = own_port()
    recipes = isolated_env / "config" / "recipes"
    recipes.mkdir(parents=True, exist_ok=True)
    (recipes / f"{NAME}.yaml").write_text(f"extends: qwen3.5-27b\nname: {NAME}\ndescription: a cancel test\n"
                                          f"resources:\n  port: {port}\n")
    catalog = load_catalog()
    assert NAME in catalog.recipes
    _weights_complete(catalog.recipe(NAME).checkpoint.repo)
    rt = FakeRuntime(images=[image(GB10_IMAGE, "linux/arm64")])
    rt.script(CONTAINER, SILENT)
    monkeypatch.setattr(machine, "cpu_arch", lambda: "aarch64")  # the gb10 image is linux/arm64
    monkeypatch.setattr("metralectl.app.serving.memory_watch", lambda runtime: NoMemoryWatch())
    monkeypatch.setattr("metralectl.seams.docker_runtime.open_runtime", lambda *a, **k: rt)
    made = Box(rt, port)
    monkeypatch.setattr(ctypes.pythonapi, "PyThreadState_SetAsyncExc", lambda *args: made.injected.append(args) or 1)
    yield made


def _gone(box: Box) -> bool:
    return box.runtime.all() == [] and port_released(box.port)


def test_the_agents_job_cancel_stops_a_silent_boot_and_cleans_up(box: Box) -> None:
    from metralectl.agent.api import LocalApiServer
    from metralectl.agent.ops import LifecycleOps

    server = LocalApiServer(LifecycleOps(lambda: None), token=TOKEN, port=0)
    server.start("test-cancel-api")
    base, auth = f"http://127.0.0.1:{server.port}", {"Authorization": f"Bearer {TOKEN}"}
    try:
        started = httpx.post(f"{base}/api/run", json={"recipe": NAME}, headers=auth, timeout=10, trust_env=False)
        assert started.status_code == 202, started.text
        job_id = started.json()["id"]
        deadline = time.monotonic() + 30
        while not any(c.running for c in box.runtime.all()) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the engine loads silently now: no event will come
        asked = time.monotonic()
        cancel = httpx.post(f"{base}/api/jobs/{job_id}/cancel", json={}, headers=auth, timeout=10, trust_env=False)
        assert cancel.status_code == 202 and cancel.json()["cancel_requested"] is True
        job = server.jobs.get(job_id)
        assert job is not None and job.wait_finished(PROMPT_S), "the cancel did not end the silent boot"
        assert time.monotonic() - asked < PROMPT_S
        answer = httpx.get(f"{base}/api/jobs/{job_id}/events?after=0&wait=0", timeout=10, trust_env=False).json()
    finally:
        server.stop()
    state = answer["job"]
    assert (state["state"], state["exit_code"]) == ("cancelled", 130)
    assert state["error"] == "cancelled by a client; what it had started was cleaned up"
    kinds = [e["kind"] for e in answer["events"]]
    assert "ContainerStarted" in kinds and "Ready" not in kinds and "Failed" not in kinds  # the job log, as numbered
    assert _gone(box) and box.injected == []
    assert not any(r.get("outcome") == "ready" for r in store.read_jsonl(store.state_dir() / "runs.jsonl"))


def test_the_dashboards_cancel_stops_a_silent_boot_and_cleans_up(box: Box) -> None:
    from textual.worker import WorkerState

    from metralectl.tui.app import MetralectlApp
    from metralectl.tui.core_services import CoreServices
    from metralectl.tui.screens.confirm import ConfirmScreen
    from metralectl.tui.screens.progress import ProgressScreen
    from metralectl.tui.widgets.recipe_table import RecipeTable
    from tests.unit.tui.conftest import until

    async def scenario() -> tuple[str, WorkerState | None, str]:
        app = MetralectlApp(CoreServices(bench=object()), status_every_s=0.5)  # type: ignore[arg-type]
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("2")
            table = app.query_one(RecipeTable)
            await until(pilot, lambda: NAME in table.names and app.focused is table, timeout=30, what="library")
            table.move_cursor(row=table.names.index(NAME))
            await pilot.press("r")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), timeout=30, what="confirmation")
            await pilot.press("y")
            await until(pilot, lambda: isinstance(app.screen, ProgressScreen), what="progress")
            progress = app.screen
            assert isinstance(progress, ProgressScreen)
            await until(pilot, lambda: any(line.text.startswith("started") for line in progress.model.lines),
                        timeout=30, what="container started")
            await pilot.pause(0.5)  # the engine loads silently now
            asked = time.monotonic()
            await pilot.press("c")
            await until(pilot, lambda: progress.outcome is not None, timeout=PROMPT_S, what="cancelled")
            assert time.monotonic() - asked < PROMPT_S
            assert progress.outcome is not None
            worker = progress.worker
            return progress.outcome.status, worker.state if worker is not None else None, progress.token.reason

    status, worker_state, reason = asyncio.run(scenario())
    assert status == "cancelled" and reason == "cancelled from the dashboard"
    assert worker_state is WorkerState.CANCELLED  # Textual's own worker cancel, beside the core call's token
    assert _gone(box) and box.injected == []
