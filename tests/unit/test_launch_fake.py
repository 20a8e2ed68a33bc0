"""`launch()` on every path, against the shared fake runtime (tests/fakes/runtime.py): a real loopback HTTP server
stands in for the engine's /health, so readiness is decided exactly as with Docker (lifecycle/readiness.py).

Each failure must end with the event sequence that says why, and with nothing half-started left behind: no
container (unless keep_failed), the engine's port free again. The real-daemon versions of these paths are in
tests/integration/test_lifecycle.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from metralectl.core.render import LABEL_RECIPE, LABEL_RUN_ID
from metralectl.lifecycle import readiness
from metralectl.lifecycle.events import ContainerStarted, Event, Failed, LogLine, Phase, Step
from metralectl.lifecycle.launch import LaunchFailed, LaunchOptions, launch
from metralectl.seams import machine, store
from tests.fakes.lifecycle import Recorder, gb10_runtime, in_order, on_port, port_released
from tests.fakes.runtime import PREFIX, Answer, Boot, Chatter, Exit, FakeRuntime, Listen, Log, engine_boot
from tests.unit.recipe_helpers import catalog
from tests.ports import own_port

NAME = "qwen3.5-27b"
CONTAINER = f"metralectl-{NAME}"
EMPTY_CACHE = "2026-08-26T05:35:05Z ERROR Error: Snapshot 'db821d7' has no weight files (metadata-only)"
WATCHDOG = "2026-08-26T05:35:05Z ERROR OOM watchdog: GPU free memory critically low: 1350 MB (threshold: 2048 MB) [1/3]"


@pytest.fixture(autouse=True)
def arm64(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "cpu_arch", lambda: "aarch64")  # the gb10 image is linux/arm64


def _launch(rt: FakeRuntime, listener: Recorder, port: int, **options: Any) -> Any:
    recipe, sets = on_port(catalog(), NAME, port)
    opts = LaunchOptions(check_weights=False, pull=False, sets=tuple(sets), **options)
    return launch(recipe, catalog(), rt, options=opts, on_event=listener)


def _runs() -> list[dict[str, Any]]:
    return store.read_jsonl(store.state_dir() / "runs.jsonl")


def _failed(boot: Boot, **options: Any) -> tuple[LaunchFailed, Recorder, FakeRuntime, int]:
    rt, listener, port = gb10_runtime(), Recorder(), own_port()
    rt.script(CONTAINER, boot)
    with pytest.raises(LaunchFailed) as failure:
        _launch(rt, listener, port, **options)
    return failure.value, listener, rt, port


def test_a_boot_like_the_engines_is_ready_on_health_200() -> None:
    rt, listener, port = gb10_runtime(), Recorder(), own_port()
    rt.script(CONTAINER, engine_boot("Qwen/Qwen3.5-27B"))
    launched = _launch(rt, listener, port)
    assert launched.model == "Qwen/Qwen3.5-27B" and launched.url == f"http://127.0.0.1:{port}"
    assert in_order(listener.marks(), ["step:image", "step:port", "step:starting", f"started:{CONTAINER}",
                                       "phase:loading", "phase:ready", "ready"])
    (running,) = rt.all()
    assert running.running and running.name == CONTAINER and running.labels[LABEL_RECIPE] == NAME
    assert running.labels[LABEL_RUN_ID] == launched.run_id and rt.health_of(CONTAINER) == (
        200, {"status": "ready", "model": "Qwen/Qwen3.5-27B"})
    assert _runs()[-1]["outcome"] == "ready"


def test_a_boot_that_stops_making_progress_is_stalled_and_removed() -> None:
    boot = Boot((Log(PREFIX + "Metrale Engine starting..."), Listen(),
                 Log(PREFIX + "Fast-loaded 1234 weight tensors", after_s=0.05)))  # then silence, 503 loading for ever
    failure, listener, rt, port = _failed(boot, stall_timeout_s=0.8)
    assert failure.diagnosis.cause == "stalled" and "503 loading" in failure.diagnosis.message
    assert in_order(listener.marks(), [f"started:{CONTAINER}", "phase:loading", "failed:stalled"])
    assert listener.marks()[-1] == "failed:stalled" and "ready" not in listener.marks()
    assert rt.all() == [] and port_released(port)
    assert _runs()[-1] == {**_runs()[-1], "outcome": "failed", "cause": "stalled"}


def test_a_crash_while_booting_carries_the_engines_last_lines() -> None:
    boot = Boot((Log(PREFIX + "Metrale Engine starting..."), Listen(), Log(EMPTY_CACHE, after_s=0.05), Exit(1)))
    failure, listener, rt, port = _failed(boot)
    assert failure.diagnosis.cause == "empty-cache" and "has no weight files" in failure.diagnosis.message
    assert failure.last_lines[-1] == EMPTY_CACHE
    (failed,) = listener.of(Failed)
    assert isinstance(failed, Failed) and failed.last_lines[-1] == EMPTY_CACHE
    assert listener.marks()[-1] == "failed:empty-cache"
    assert rt.all() == [] and port_released(port)
    kept = failure.message.split("logs kept in ")[1].split(";")[0]
    assert EMPTY_CACHE in open(kept).read()  # the boot log outlives the container


def test_keep_failed_keeps_the_exited_container() -> None:
    boot = Boot((Log(EMPTY_CACHE), Exit(1)))
    failure, _, rt, _ = _failed(boot, keep_failed=True)
    (kept,) = rt.all()
    assert kept.name == CONTAINER and kept.status == "exited" and kept.exit_code == 1
    assert f"container {CONTAINER} kept" in failure.message


@pytest.mark.parametrize("oom", [True, False])
def test_an_oom_kill_is_named_as_such(oom: bool) -> None:
    boot = Boot((Log(PREFIX + "Metrale Engine starting..."), Listen(),
                 Log(PREFIX + "Fast-loaded 1234 weight tensors", after_s=0.05), Exit(137, oom=oom, after_s=0.05)))
    failure, listener, rt, port = _failed(boot)
    assert failure.diagnosis.cause == "out-of-memory"
    assert "exit 137" in failure.diagnosis.message and ("OOM-killed" in failure.diagnosis.message) == oom
    assert "memory-utilization" in failure.diagnosis.remedy
    assert listener.marks()[-1] == "failed:out-of-memory" and rt.all() == [] and port_released(port)


def test_a_boot_that_keeps_talking_but_never_gets_ready_times_out() -> None:
    boot = Boot((Log(PREFIX + "Metrale Engine starting..."), Listen(),
                 Log(PREFIX + "Fast-loaded 1234 weight tensors"), Chatter(PREFIX + "warming up", 0.1)))
    failure, listener, rt, port = _failed(boot, boot_timeout_s=1.0, stall_timeout_s=30.0)
    assert failure.diagnosis.cause == "timeout"
    assert "phase: loading" in failure.diagnosis.message and "503 loading" in failure.diagnosis.message
    assert listener.marks()[-1] == "failed:timeout" and rt.all() == [] and port_released(port)


def test_a_faulted_engine_fails_at_once() -> None:
    boot = Boot((Listen(), Answer(503, {"status": "faulted", "reason": "Xid 79: GPU has fallen off the bus"})))
    failure, listener, rt, port = _failed(boot, stall_timeout_s=60.0, boot_timeout_s=60.0)
    assert failure.diagnosis.cause == "gpu-fault" and "Xid 79" in failure.diagnosis.message
    assert rt.all() == [] and port_released(port)


def test_a_start_the_daemon_refuses_leaves_nothing() -> None:
    boot = Boot(start_error='the daemon cannot give containers a GPU: could not select device driver ""')
    failure, listener, rt, _ = _failed(boot)
    assert failure.diagnosis.cause == "gpu-runtime-missing"
    assert listener.marks() == ["step:image", "step:port", "step:starting", "failed:gpu-runtime-missing"]
    assert rt.all() == []


def test_a_missing_image_is_refused_before_anything_starts() -> None:
    rt, listener = FakeRuntime(), Recorder()  # no image, and --no-pull
    with pytest.raises(Exception, match="is not here"):
        _launch(rt, listener, own_port())
    assert rt.created == [] and listener.marks() == []  # the preflight's refusal comes before staging begins


def test_a_stale_container_of_an_earlier_failed_run_is_replaced() -> None:
    rt, listener, port = gb10_runtime(), Recorder(), own_port()
    rt.script(CONTAINER, Boot((Exit(1),)), engine_boot())
    with pytest.raises(LaunchFailed):
        _launch(rt, listener, port, keep_failed=True)
    (stale,) = rt.all()
    launched = _launch(rt, Recorder(), port)
    (now,) = rt.all()
    assert now.running and now.id == launched.container_id != stale.id


# --- Ctrl-C at each phase ----------------------------------------------------------------------------------------
def _is_step(name: str) -> Callable[[Event], bool]:
    return lambda e: isinstance(e, Step) and e.name == name


HOLDING = Boot((Log(WATCHDOG), Listen(), Answer(200, {"status": "ready", "model": "m"}, after_s=0.5)), model="m")
PHASES: dict[str, tuple[Callable[[Event], bool], Boot]] = {
    "image check": (_is_step("image"), engine_boot()),
    "before create": (_is_step("starting"), engine_boot()),
    "just started": (lambda e: isinstance(e, ContainerStarted), engine_boot()),
    "boot": (lambda e: isinstance(e, LogLine), engine_boot()),
    "ready": (lambda e: isinstance(e, Phase) and e.phase == "ready", engine_boot()),
    "hold": (_is_step("holding"), HOLDING),
}


@pytest.mark.parametrize("phase", list(PHASES))
@pytest.mark.parametrize("keep_failed", [False, True])
def test_ctrl_c_at_any_phase_leaves_nothing_behind(phase: str, keep_failed: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readiness, "HOLD_S", 30.0)
    accept, boot = PHASES[phase]
    rt, listener, port = gb10_runtime(), Recorder(interrupt_on=accept), own_port()
    rt.script(CONTAINER, boot)
    with pytest.raises(KeyboardInterrupt):
        _launch(rt, listener, port, keep_failed=keep_failed)  # Ctrl-C always cleans up, --keep-failed or not
    assert listener.interrupted is listener.events[-1]  # nothing was reported after the interrupt
    assert "ready" not in listener.marks() and not listener.of(Failed)
    assert rt.all() == [] and port_released(port)
    started = phase not in ("image check", "before create")
    assert bool(rt.created) == started
    assert not any(r.get("outcome") == "ready" for r in _runs())


def test_ctrl_c_inside_create_removes_the_container_by_its_run_id() -> None:
    """The daemon created the container, but Ctrl-C came before its id did: the launch finds it by name and run id."""
    rt, listener = gb10_runtime(), Recorder()
    rt.script(CONTAINER, Boot(interrupt_in_create=True))
    with pytest.raises(KeyboardInterrupt):
        _launch(rt, listener, own_port())
    assert rt.all() == [] and not listener.of(ContainerStarted)
    ((_, (name, labels), _),) = [c for c in rt.calls if c[0] == "remove_if_labelled"]
    assert name == CONTAINER and list(labels) == [LABEL_RUN_ID]
