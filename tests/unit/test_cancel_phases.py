"""A cancel token (metralectl/cancel.py) stops launch, swap and stop at each phase boundary, against the shared
fake runtime, and leaves the box as Ctrl-C leaves it: nothing half-started, the same events, the same record.

The listener here only cancels the token (tests/fakes/lifecycle.Recorder, `cancel_on`); it raises nothing, so
what stops the work is the lifecycle's own check of the token (its phase boundaries, its waits' ticks)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from metralectl.cancel import Cancelled, CancelToken
from metralectl.core.render import LABEL_RECIPE
from metralectl.lifecycle import readiness
from metralectl.lifecycle.events import ContainerStarted, Event, Failed, LogLine, Phase, Ready, Step, Transfer
from metralectl.lifecycle.launch import LaunchOptions, launch
from metralectl.lifecycle.swap import SwapInterrupted, journal_path, repair_if_needed, swap
from metralectl.seams import machine, store
from tests.fakes.lifecycle import GB10_IMAGE, Recorder, gb10_runtime, on_port, port_released
from tests.fakes.runtime import PREFIX, Answer, Boot, Exit, FakeRuntime, Listen, Log, engine_boot, image
from tests.ports import own_port
from tests.unit.recipe_helpers import catalog

NAME = "qwen3.5-27b"
CONTAINER = f"metralectl-{NAME}"
OLD, NEW = NAME, "qwen3.5-35b-a3b"
OLD_C, NEW_C = CONTAINER, f"metralectl-{NEW}"
WATCHDOG = "2026-08-26T05:35:05Z ERROR OOM watchdog: GPU free memory critically low: 1350 MB (threshold: 2048 MB) [1/3]"
SILENT = Boot((Log(PREFIX + "Metrale Engine starting..."), Listen(),
               Answer(200, {"status": "ready", "model": "m"}, after_s=30)), model="m")  # loads 30 s without a word
CRASH = Boot((Log(PREFIX + "Metrale Engine starting..."), Listen(),
              Log("2026-08-26T05:35:05Z ERROR Error: Snapshot 'db821d7' has no weight files (metadata-only)",
                  after_s=0.05), Exit(1)))
PROMPT_S = 3.0  # a cancel ends the work within this (the waits tick at tens of ms; the fake's HTTP adds some)


@pytest.fixture(autouse=True)
def arm64(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "cpu_arch", lambda: "aarch64")  # the gb10 image is linux/arm64


def _step(name: str) -> Callable[[Event], bool]:
    return lambda e: isinstance(e, Step) and e.name == name


def _launch(rt: FakeRuntime, listener: Recorder, port: int, **options: Any) -> Any:
    recipe, sets = on_port(catalog(), NAME, port)
    opts = LaunchOptions(**{"check_weights": False, "pull": False, "sets": tuple(sets), **options})
    with listener.token.bound():
        return launch(recipe, catalog(), rt, options=opts, on_event=listener)


def _runs() -> list[dict[str, Any]]:
    return store.read_jsonl(store.state_dir() / "runs.jsonl")


def _after_the_cancel(listener: Recorder) -> list[Event]:
    """What was reported after the event the cancel came on, less what a wait reports as it ticks."""
    rest = listener.events[listener.events.index(listener.interrupted) + 1:]  # type: ignore[arg-type]
    return [e for e in rest if not isinstance(e, (LogLine, Transfer)) and not _step("health")(e)]


# --- launch: each phase boundary ---------------------------------------------------------------------------------
HOLDING = Boot((Log(WATCHDOG), Listen(), Answer(200, {"status": "ready", "model": "m"}, after_s=0.5)), model="m")
LAUNCH_PHASES: dict[str, tuple[Callable[[Event], bool], Boot, bool]] = {  # (cancel on, boot, a container was made)
    "preflight": (_step("image"), engine_boot(), False),
    "before create": (_step("starting"), engine_boot(), False),
    "just started": (lambda e: isinstance(e, ContainerStarted), engine_boot(), True),
    "boot": (lambda e: isinstance(e, LogLine), engine_boot(), True),
    "ready": (lambda e: isinstance(e, Phase) and e.phase == "ready", engine_boot(), True),
    "hold": (_step("holding"), HOLDING, True),
}


@pytest.mark.parametrize("phase", list(LAUNCH_PHASES))
@pytest.mark.parametrize("keep_failed", [False, True])
def test_a_cancel_at_each_launch_phase_leaves_what_ctrl_c_leaves(phase: str, keep_failed: bool,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readiness, "HOLD_S", 30.0)
    cancel_on, boot, made = LAUNCH_PHASES[phase]
    rt, listener, port = gb10_runtime(), Recorder(cancel_on=cancel_on), own_port()
    rt.script(CONTAINER, boot)
    with pytest.raises(Cancelled) as cancelled:
        _launch(rt, listener, port, keep_failed=keep_failed)  # a cancel always cleans up, --keep-failed or not
    assert cancelled.value.reason == "cancelled by the test" and isinstance(cancelled.value, KeyboardInterrupt)
    assert listener.interrupted is not None and _after_the_cancel(listener) == []  # nothing said after it
    assert not listener.of(Ready) and not listener.of(Failed)
    assert rt.all() == [] and port_released(port)  # the container the launch made, removed
    assert bool(rt.created) == made
    assert not any(r.get("outcome") == "ready" for r in _runs())  # the run record: never a ready one


def test_a_cancel_while_the_daemon_creates_the_container_removes_it() -> None:
    """The cancel comes while create_and_start is in flight (the daemon makes the container; the call is not
    interrupted): the check right after it sends the launch into its own cleanup, which removes it."""
    rt, listener, port = gb10_runtime(), Recorder(), own_port()
    rt.script(CONTAINER, engine_boot())
    create = rt.create_and_start

    def create_then_cancel(*args: Any, **kwargs: Any) -> Any:
        made = create(*args, **kwargs)
        listener.token.cancel("cancelled mid-create")
        return made

    rt.create_and_start = create_then_cancel  # type: ignore[method-assign]
    with pytest.raises(Cancelled):
        _launch(rt, listener, port)
    assert [spec.name for spec in rt.created] == [CONTAINER] and rt.all() == [] and port_released(port)
    assert not listener.of(ContainerStarted)  # the launch never reported it started


def test_a_cancel_during_a_silent_boot_ends_it_at_once() -> None:
    """No event for 30 s (an engine loading without a word): the readiness wait's own tick sees the cancel."""
    rt, listener, port = gb10_runtime(), Recorder(), own_port()
    rt.script(CONTAINER, SILENT)
    started_at: list[float] = []

    def cancel_when_started(event: Event) -> None:
        if isinstance(event, ContainerStarted):
            threading.Timer(0.5, lambda: (started_at.append(time.monotonic()), listener.token.cancel())).start()

    listener.cancel_on = lambda e: (cancel_when_started(e), False)[1]
    with pytest.raises(Cancelled):
        _launch(rt, listener, port)
    assert started_at and time.monotonic() - started_at[0] < PROMPT_S
    assert rt.all() == [] and port_released(port) and not listener.of(Ready)


def test_a_cancel_during_a_pull_stops_it_before_anything_starts() -> None:
    rt = FakeRuntime(pullable=[image(GB10_IMAGE, "linux/arm64")])  # the image is not here yet: the launch pulls it
    rt.script(CONTAINER, engine_boot())
    listener, port = Recorder(cancel_on=lambda e: isinstance(e, Transfer)), own_port()
    with pytest.raises(Cancelled):
        _launch(rt, listener, port, pull=True)
    assert len(listener.of(Transfer)) == 1  # the pull's next report was the place it stopped
    assert rt.pulls and GB10_IMAGE not in rt.images  # the pull did not finish
    assert rt.created == [] and rt.all() == []


# --- swap: staging, drain, stop, the new model's boot, the rollback ------------------------------------------------
def _serving_old(old: tuple[Boot, ...], new: tuple[Boot, ...]) -> tuple[FakeRuntime, int]:
    rt, port = gb10_runtime(), own_port()
    rt.script(OLD_C, *old)
    rt.script(NEW_C, *new)
    recipe, sets = on_port(catalog(), OLD, port)
    launch(recipe, catalog(), rt, options=LaunchOptions(check_weights=False, pull=False, sets=tuple(sets)))
    return rt, port


def _swap(rt: FakeRuntime, listener: Recorder, **kw: Any) -> Any:
    with listener.token.bound():
        return swap(catalog().recipe(NEW), [], catalog(), rt, on_event=listener,
                    options=LaunchOptions(check_weights=False, pull=False), **kw)


def _running(rt: FakeRuntime) -> list[str]:
    return [c.labels[LABEL_RECIPE] for c in rt.all() if c.running]


def _journal_phase() -> str | None:
    journal = store.read_json(journal_path())
    return journal.get("phase") if isinstance(journal, dict) else None


def test_a_cancel_while_staging_releases_nothing() -> None:
    rt, _ = _serving_old((engine_boot("old/model"),), (engine_boot("new/model"),))
    listener = Recorder(cancel_on=_step("staging"))
    with pytest.raises(Cancelled):
        _swap(rt, listener)
    assert _running(rt) == [OLD] and _journal_phase() is None and NEW_C not in [s.name for s in rt.created]


@pytest.mark.parametrize("in_flight", [2, 0], ids=["mid-drain", "after the drain"])
def test_a_cancel_in_the_drain_leaves_the_old_model_serving(in_flight: int) -> None:
    """A drain that would wait 60 s for two requests ends at the cancel; either way the old model was not stopped,
    and the journal the swap had begun tells the repair so."""
    rt, _ = _serving_old((engine_boot("old/model", requests_active=in_flight),), (engine_boot("new/model"),))
    listener = Recorder(cancel_on=_step("draining"))
    started = time.monotonic()
    with pytest.raises(Cancelled):
        _swap(rt, listener, drain_timeout_s=60.0)
    assert time.monotonic() - started < PROMPT_S
    assert _running(rt) == [OLD] and not [e for e in listener.events if _step("stopping")(e)]
    assert _journal_phase() == "draining"
    assert repair_if_needed(rt, catalog()) == f"the interrupted swap had not released {OLD}; it still serves"


def test_a_cancel_while_the_old_model_stops_stops_before_the_new_one_starts() -> None:
    rt, port = _serving_old((engine_boot("old/model"),), (engine_boot("new/model"),))
    listener = Recorder(cancel_on=_step("stopping"))
    with pytest.raises(SwapInterrupted) as said:  # what Ctrl-C while the new model starts says
        _swap(rt, listener)
    assert said.value.exit_code == 130 and "nothing serves now" in said.value.message
    assert rt.all() == [] and port_released(port) and NEW_C not in [s.name for s in rt.created]
    assert _journal_phase() == "starting-new"
    assert repair_if_needed(rt, catalog()) == f"restored {OLD} after an interrupted swap" and _running(rt) == [OLD]


def test_a_cancel_while_the_new_model_boots_is_ctrl_c_s_swap_interrupted() -> None:
    """As tests/unit/test_swap_fake.py's Ctrl-C at the same point: SwapInterrupted, the new container removed,
    the journal at starting-new, which the repair follows."""
    rt, port = _serving_old((engine_boot("old/model"),), (engine_boot("new/model", step_s=0.5),))
    listener = Recorder(cancel_on=lambda e: isinstance(e, ContainerStarted))
    with pytest.raises(SwapInterrupted) as said:
        _swap(rt, listener)
    assert said.value.exit_code == 130 and f"{OLD} was stopped for the swap" in said.value.message
    assert "ps --repair" in (said.value.hint or "")
    assert rt.all() == [] and port_released(port) and _journal_phase() == "starting-new"
    assert repair_if_needed(rt, catalog()) == f"restored {OLD} after an interrupted swap" and _running(rt) == [OLD]


@pytest.mark.parametrize("at", ["before the rollback", "during the rollback's boot"])
def test_a_cancel_in_the_rollback_leaves_the_journal_for_the_repair(at: str) -> None:
    rt, port = _serving_old((engine_boot("old/model"), engine_boot("old/model", step_s=0.5)), (CRASH,))
    if at == "before the rollback":
        listener = Recorder(cancel_on=lambda e: isinstance(e, Failed))  # the new model's failure
    else:
        starts = [0]

        def second_old_start(event: Event) -> bool:
            starts[0] += isinstance(event, ContainerStarted) and event.name == OLD_C
            return starts[0] == 1 and isinstance(event, ContainerStarted)

        listener = Recorder(cancel_on=second_old_start)
    with pytest.raises(Cancelled):
        _swap(rt, listener)
    assert rt.all() == [] and port_released(port)  # neither model: the half-started restore was removed too
    assert _journal_phase() == "restoring"
    assert repair_if_needed(rt, catalog()) == f"restored {OLD} after an interrupted swap" and _running(rt) == [OLD]


# --- stop's wait ----------------------------------------------------------------------------------------------------
class _HeldMemory:
    """An NVML probe whose GPU keeps every process's memory: the stop's memory wait would last its whole wait_s."""

    def open(self) -> object:
        return object()

    def sample(self) -> list[Any]:
        from types import SimpleNamespace

        return [SimpleNamespace(processes=[SimpleNamespace(pid=4242, used_bytes=10**9)])]

    def close(self) -> None:
        pass


def test_a_cancel_ends_the_stops_memory_wait_with_the_container_gone() -> None:
    from metralectl.lifecycle.memory import NvmlMemoryWatch
    from metralectl.lifecycle.stop import stop_containers

    rt, _ = _serving_old((engine_boot("old/model"),), ())
    served = [c for c in rt.containers() if c.running]
    rt._find(served[0].id).pids = {4242}  # type: ignore[union-attr]  # its engine's process, on the GPU
    token = CancelToken()
    threading.Timer(0.3, token.cancel).start()
    started = time.monotonic()
    with token.bound(), pytest.raises(Cancelled):
        stop_containers(rt, served, memory=NvmlMemoryWatch(rt, wait_s=60.0, probe_factory=_HeldMemory))
    assert time.monotonic() - started < PROMPT_S
    assert rt.all() == []  # stopped and removed before the wait began


def test_a_cancel_between_containers_leaves_the_rest_running() -> None:
    from metralectl.lifecycle.stop import stop_containers

    rt = gb10_runtime()
    first, second = rt.serving("a"), rt.serving("b")
    listener = Recorder(cancel_on=_step("stopping"))
    with listener.token.bound(), pytest.raises(Cancelled):
        stop_containers(rt, [first, second], on_event=listener)
    assert [c.name for c in rt.all()] == [second.name]  # the first one went whole; the second was not begun


# --- a benchmark's load --------------------------------------------------------------------------------------------
def test_a_cancel_ends_an_in_process_load_as_sigterm_does() -> None:
    """The dashboard's benchmark runs the load in its worker's thread: the token ends it as SIGTERM would (the
    requests in flight kept, marked interrupted), and the stage reports itself cancelled."""
    from metralectl.bench.loadgen import LoadSpec
    from metralectl.bench.prompts import RequestFactory
    from metralectl.bench.shard import run_load
    from tests.bench_truth.helpers import truth_server

    with truth_server("--ttft-ms", "10", "--itl-ms", "50") as url:  # 2000 tokens: 100 s a request
        token = CancelToken()
        threading.Timer(0.5, token.cancel).start()
        started = time.monotonic()
        with token.bound():
            out = run_load(LoadSpec(concurrency=2, duration_s=60.0), url, "/v1/chat/completions",
                           RequestFactory(model="m", max_tokens=2000, text="hello"))
    assert time.monotonic() - started < PROMPT_S + 2  # not the 60 s window
    assert out.cancelled and out.results and all(r.error and r.error.startswith("interrupted") for r in out.results)


def test_a_stop_while_a_loads_connections_open_ends_it_as_ctrl_c_does() -> None:
    """SIGTERM (or the dashboard's token) that lands while a rung's connections are still opening, before its load
    began, ends the run as Ctrl-C does (a KeyboardInterrupt: the runner keeps the record as interrupted, exit 130),
    not with a CancelledError's traceback and exit 1 (seen in CI: a SIGTERM at the second rung's start)."""
    import socket

    from metralectl.bench.loadgen import LoadSpec
    from metralectl.bench.prompts import RequestFactory
    from metralectl.bench.shard import run_load

    with socket.socket() as server, socket.socket() as filler:
        server.bind(("127.0.0.1", 0))
        server.listen(0)  # never accepted: one connection fills the queue, and the next ones wait for their SYN's answer
        filler.connect(server.getsockname())
        url = "http://127.0.0.1:%d" % server.getsockname()[1]
        token = CancelToken()
        threading.Timer(0.5, token.cancel).start()
        started = time.monotonic()
        with token.bound(), pytest.raises(KeyboardInterrupt):
            run_load(LoadSpec(concurrency=4, duration_s=60.0), url, "/v1/chat/completions",
                     RequestFactory(model="m", max_tokens=10, text="hello"))
    assert time.monotonic() - started < 30  # ended by the stop, not by the connections' timeout
