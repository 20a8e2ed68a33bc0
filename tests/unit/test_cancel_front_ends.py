"""Cancel from the agent's API and from the dashboard, on the real core (app/serving.py, the lifecycle) over the
shared fake runtime: an engine that loads for 30 s without a word is cancelled within a moment, its container
removed, the job or the dialog saying so, and nothing is ever pushed into a thread (ctypes' asynchronous
exception is replaced here by one that only records it was asked for)."""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from metralectl import paths
from metralectl.lifecycle.memory import NoMemoryWatch
from metralectl.seams import machine, store
from metralectl.seams.hf import cache as hfcache, listing as hflisting
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
        listing.append(hflisting.RepoFile(name, len(data), hashlib.sha256(data).hexdigest()))
    hfcache.write_json_atomic(snap / hfcache.VERIFIED_MANIFEST, hflisting.Listing(repo, commit, tuple(listing)).to_json())


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
    monkeypatch.setattr("metralectl.seams.docker.runtime.open_runtime", lambda *a, **k: rt)
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


# -- the CLI: Ctrl-C (or SIGTERM) cancels the same token ----------------------------------------------------------------
def _cli_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """`metralectl run NAME` in this process (the command's function, its options at their defaults); the SIGTERM
    handler it installs for its whole process is left out (it would outlive the test)."""
    import inspect

    from metralectl.cli import serve_cmds

    monkeypatch.setattr(serve_cmds, "_sigterm_as_interrupt", lambda: None)
    options = {name: getattr(p.default, "default", p.default)
               for name, p in inspect.signature(serve_cmds.run).parameters.items()}
    serve_cmds.run(**{**options, "recipe_name": NAME, "set_": None})


def _ctrl_c() -> None:
    """Ctrl-C at this point of the main thread (Python runs the handler before the next line)."""
    os.kill(os.getpid(), signal.SIGINT)


def _on_create(box: Box, then: Callable[[], None]) -> None:
    create = box.runtime.create_and_start

    def created(*args: Any, **kwargs: Any) -> Any:
        made = create(*args, **kwargs)
        then()
        return made

    box.runtime.create_and_start = created  # type: ignore[method-assign]


def test_the_clis_ctrl_c_cancels_the_token_and_the_cleanup_is_not_cut_short(box: Box,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the daemon creates the container (here: just as it returns) is seen at the next phase boundary
    (Cancelled, the token's, not a KeyboardInterrupt pushed in where the signal landed); a second Ctrl-C during the
    cleanup that follows does not cut it short: the container is removed, the lock free."""
    from metralectl.cancel import Cancelled

    _on_create(box, _ctrl_c)
    remove = box.runtime.remove

    def removing(*args: Any, **kwargs: Any) -> None:
        _ctrl_c()  # impatient: again, while the half-started container is being removed
        remove(*args, **kwargs)

    box.runtime.remove = removing  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt) as cancelled:  # (a bare one too: it must fail this test, not the session)
        _cli_run(monkeypatch)
    assert isinstance(cancelled.value, Cancelled) and cancelled.value.reason == "interrupted"
    assert _gone(box) and store.lock_holder() is None and box.injected == []


def test_a_second_ctrl_c_before_the_work_sees_the_first_leaves_at_once(box: Box,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A call blocked in the daemon does not see the token: a second Ctrl-C interrupts it there, as Ctrl-C always
    did, and the launch's own cleanup still finds the container it made (by its name and run id)."""
    from metralectl.cancel import Cancelled

    _on_create(box, lambda: (_ctrl_c(), _ctrl_c()))
    with pytest.raises(KeyboardInterrupt) as interrupted:
        _cli_run(monkeypatch)
    assert not isinstance(interrupted.value, Cancelled)
    assert _gone(box) and store.lock_holder() is None


def test_a_ctrl_c_of_the_cli_during_a_silent_boot_ends_it_at_once(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from metralectl.cancel import Cancelled

    asked: list[float] = []

    def later() -> None:
        asked.append(time.monotonic())
        _ctrl_c()

    _on_create(box, lambda: threading.Timer(0.5, later).start())  # the signal reaches the main thread, waiting
    with pytest.raises(KeyboardInterrupt) as cancelled:
        _cli_run(monkeypatch)
    assert isinstance(cancelled.value, Cancelled)
    assert asked and time.monotonic() - asked[0] < PROMPT_S
    assert _gone(box) and store.lock_holder() is None
