"""Readiness without a daemon: the boot log read behind today's tracing prefixes, /health classified the way
today's engine and the book's write it, and the waiting loop (a scripted container, a real local HTTP server
standing in for the engine's /health) deciding ready / faulted / stalled / timeout on the right evidence."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from metralectl.core.contract import Readiness, parse_contract
from metralectl.seams.endpoint import Health
from metralectl.lifecycle import launch, readiness
from metralectl.lifecycle.boot import BootLog, clean_line, diagnose_exit, message_of
from metralectl.lifecycle.events import Event, Phase, Step, Warning_
from metralectl.lifecycle.logfollow import Watched
from metralectl.lifecycle.readiness import HEALTH_POLL_S, BootClock, HealthPoller, classify_health
from metralectl.core.render import ContainerSpec
from metralectl.core.yamlsrc import Document
from tests.fakes.runtime import Action, Boot, Exit, FakeRuntime, Log, image
from tests.ports import HeldPort
from tests.unit.recipe_helpers import catalog

PREFIX = "2026-08-26T05:35:05Z  INFO "
MODULE_PREFIX = "2026-06-11T01:09:49.443862Z  INFO spark::main_modules::serve: "
ANSI_PREFIX = "\x1b[2m2026-08-26T05:35:05Z\x1b[0m \x1b[32m INFO\x1b[0m "
TODAY = [  # today's wording (engine-facts §1-2), in boot order
    ("Metrale Engine starting...", None),
    ("Selected kernel target: (sm_121, qwen3.6-27b, nvfp4) (134 modules) — quant compat: kernel=nvfp4 model=nvfp4 OK",
     "kernel-select"),
    ("Fast-loaded 1234 weight tensors", "loading"),
    ("KV cache: 60.0 GB total x 86% util = 51.6 GB budget; 44.4 GB pre-KV + 5.9 GB reserve -> 1.4 GB for KV -> "
     "22384 max KV tokens", "kv-sizing"),
    ("API reachable only from this machine (loopback). To expose on the LAN pass --bind 0.0.0.0; combine with "
     "--require-auth and --auth-tokens-file for non-trusted networks.", None),
    ("Server live and ready at 127.0.0.1:8888 running Qwen/Qwen3.6-35B-A3B-FP8", "ready"),
]
READINESS = Readiness()


def _log(port: int = 8888) -> BootLog:
    return BootLog(catalog().engines["metrale"], "127.0.0.1", port)


# --- the boot log ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prefix", [PREFIX, MODULE_PREFIX, ANSI_PREFIX, ""])
def test_todays_lines_give_their_phases_behind_any_prefix(prefix: str) -> None:
    log = _log()
    seen = [log.feed(prefix + message) for message, _ in TODAY]
    assert seen == [phase for _, phase in TODAY]
    assert log.ready_line_seen and log.failure is None
    assert all("\x1b" not in line for line in log.tail)  # colour codes never reach a terminal or the kept log


def test_a_ready_line_for_another_port_does_not_count() -> None:
    log = _log(9000)
    assert log.feed(PREFIX + "Server live and ready at 127.0.0.1:8888 running m") is None
    assert log.feed(PREFIX + "Server live at 127.0.0.1:8888 — no model loaded yet, requests get 503") is None
    assert not log.ready_line_seen and log.phase == "starting"
    assert log.feed(PREFIX + "Server live and ready at 127.0.0.1:9000 running m") == "ready"


def test_ipv6_and_wildcard_renderings_of_the_ready_line() -> None:
    assert _log(8000).feed(PREFIX + "Server live and ready at [::1]:8000 running org/m") == "ready"
    # a bind of 0.0.0.0 or :: is printed as 127.0.0.1: only the port identifies the line as ours
    log = BootLog(catalog().engines["metrale"], "0.0.0.0", 8888)
    assert log.feed(PREFIX + "Server live and ready at 127.0.0.1:8888 running org/m") == "ready"


def test_the_modelless_line_is_a_phase_not_readiness() -> None:
    log = _log()
    line = ("Server live at 127.0.0.1:8888 — no model loaded yet, requests get 503 until one is started from "
            "the Library")
    assert log.feed(PREFIX + line) == "no-model"
    assert not log.ready_line_seen


def test_the_exposure_warning_is_not_the_books_listening_line() -> None:
    log = _log()
    warn = ("2026-08-26T05:35:05Z  WARN Metrale Engine is listening on 0.0.0.0:8888 — reachable from any host on "
            "the network.")
    assert log.feed(warn) is None and not log.ready_line_seen


@pytest.mark.parametrize("line,cause", [
    ("2026-08-26T05:35:05Z ERROR Error: Snapshot 'db821d7' has no weight files (metadata-only)", "empty-cache"),
    ("2026-08-26T05:35:09Z ERROR OOM watchdog: GPU free memory critically low: 1500 MB (threshold: 2048 MB) [1/3]",
     "out-of-memory"),
    (MODULE_PREFIX + "OOM watchdog: 3 consecutive readings below threshold. Terminating to prevent system freeze.",
     "out-of-memory"),
    ("loaded 0 tensors in 0.1s", "empty-cache"),
])
def test_todays_failure_lines(line: str, cause: str) -> None:
    log = _log()
    log.feed(line)
    assert log.failure is not None and log.failure.cause == cause and log.failure.remedy
    assert not log.failure.message.startswith("2026-")  # the diagnosis quotes the message, not the prefix
    assert diagnose_exit(1, False, log).cause == cause


def test_message_and_cleaning() -> None:
    assert message_of("2026-08-26T05:35:05Z ERROR Error: Snapshot 'x' has no weight files") == \
        "Error: Snapshot 'x' has no weight files"  # `Error:` is the message, not a module path
    assert message_of(MODULE_PREFIX + "Port: 8888") == "Port: 8888"
    assert message_of("  plain line  ") == "plain line"
    assert clean_line(ANSI_PREFIX + "ok") == "2026-08-26T05:35:05Z  INFO ok"
    cleaned = clean_line("bell\x07 and \x1b]0;title\x07 \x1b[2Jcleared")
    assert "\x1b" not in cleaned and "\x07" not in cleaned and cleaned.startswith("bell\\x07 and ")


def test_every_log_pattern_names_its_source() -> None:
    contract = catalog().engines["metrale"]
    assert all(p.source.strip() for p in contract.log_phases + contract.log_failures)
    doc = Document("engine/x.yaml", {"name": "x", "flags": {}, "log-phases": [{"phase": "ready", "pattern": "up"}]})
    parsed, check = parse_contract(doc)
    assert parsed is None and any("source" in p.message for p in check.problems)


# --- /health ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("status,body,kind,detail", [
    (503, '{"status":"loading"}', "loading", "loading"),
    (200, '{"status":"ready","model":"Qwen/Qwen3.6-35B-A3B-FP8"}', "ready", "Qwen/Qwen3.6-35B-A3B-FP8"),
    (503, '{"status":"faulted","reason":"Xid 79: GPU has fallen off the bus"}', "faulted",
     "Xid 79: GPU has fallen off the bus"),
    (503, '{"error":{"type":"model_not_loaded","message":"model is loading"}}', "loading", ""),  # the book's
    (200, '{"status":"ok","model":"m"}', "ready", "m"),  # the book's
    (404, "no route /health", "other", "no route /health"),
    (None, "", "down", "ConnectError: [Errno 111] Connection refused"),
])
def test_health_classification(status: int | None, body: str, kind: str, detail: str) -> None:
    error = "ConnectError: [Errno 111] Connection refused" if status is None else None
    state = classify_health(Health(status, body, error), READINESS)
    assert (state.kind, state.detail) == (kind, detail)


def test_a_faulted_reason_is_made_safe_for_a_terminal() -> None:
    state = classify_health(Health(503, json.dumps({"status": "faulted", "reason": "bad\x1b[2Jthing\n"})), READINESS)
    assert state.kind == "faulted" and "\x1b" not in state.detail and "\n" not in state.detail


# --- a /health server that changes state (the engine's HTTP side) ------------------------------------------
class HealthServer:
    """Binds when told (before that: connection refused), then answers /health with whatever `answer` is."""

    def __init__(self) -> None:
        self.held = HeldPort()  # ours until close(): refused until bind(), and nobody else can take it
        self.port = self.held.port
        self.answer: tuple[int, dict] = (503, {"status": "loading"})
        self.ready_at: float | None = None
        self.loading_answered = threading.Event()  # set once a 503 went out
        self.server: ThreadingHTTPServer | None = None

    def bind(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                status, body = owner.answer
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                if status == 503:
                    owner.loading_answered.set()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def turn_ready(self) -> None:
        self.ready_at = time.time()  # before the switch: any 200 anyone sees comes after this moment
        self.answer = (200, {"status": "ready", "model": "m"})

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        self.held.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture()
def engine() -> Iterator[HealthServer]:
    server = HealthServer()
    try:
        yield server
    finally:
        server.close()


def _later(seconds: float, action) -> None:  # type: ignore[no-untyped-def]
    threading.Timer(seconds, action).start()


def test_the_poll_interval_is_well_below_the_readiness_promise() -> None:
    assert HEALTH_POLL_S <= 0.1 and readiness.POLL_WAIT_S <= 0.05


def test_poller_sees_refused_then_loading_then_ready(engine: HealthServer) -> None:
    poller = HealthPoller(engine.url, READINESS)
    poller.start()
    try:
        time.sleep(0.3)
        assert poller.state.kind == "down"  # not bound yet: "not yet", never an error
        engine.bind()
        deadline = time.monotonic() + 10
        while poller.state.kind != "loading" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert poller.state.kind == "loading"
        engine.turn_ready()
        poller.join(timeout=10)
    finally:
        poller.stop()
    assert poller.state.kind == "ready" and poller.changes == 2  # (down from the start) loading, ready
    assert engine.ready_at is not None and poller.ready_at is not None
    assert engine.ready_at <= poller.ready_at  # how soon: HEALTH_POLL_S (above), not a window timed on a busy box


# --- the waiting loop, with a scripted container ------------------------------------------------------------
def scripted(lines: list[tuple[float, str]], exit_at: float | None = None) -> FakeRuntime:
    """A container (the shared fake's) that prints `lines` (with pauses) and runs until it exits 1 at `exit_at` s."""
    actions: list[Action] = [Log(line, after_s=pause) for pause, line in lines]
    if exit_at is not None:
        actions.append(Exit(1, after_s=max(0.0, exit_at - sum(pause for pause, _ in lines))))
    runtime = FakeRuntime(images=[image("img")])
    runtime.script("c", Boot(tuple(actions)))
    return runtime


def _wait(runtime: FakeRuntime, url: str, tmp_path: Path, *, stall: float = 30.0, boot: float = 30.0,
          events: list[Event] | None = None) -> tuple[dict[str, float], float]:
    container = runtime.create_and_start(ContainerSpec(name="c", image="img", command=()))
    log = BootLog(catalog().engines["metrale"], "127.0.0.1", int(url.rsplit(":", 1)[1]))
    sink = events if events is not None else []
    return readiness.wait_ready([Watched(0, runtime, container.id, log, tmp_path / "boot.log")], url, READINESS,
                                BootClock(time.monotonic(), boot, stall), sink.append)


def test_silent_engine_is_ready_on_health_alone(engine: HealthServer, tmp_path: Path) -> None:
    _later(0.3, engine.bind)
    # ready once a 503 was answered (not at a set time: on a busy box the first poll may come later than that)
    def ready_after_a_503() -> None:
        if engine.loading_answered.wait(30):
            engine.turn_ready()

    threading.Thread(target=ready_after_a_503, daemon=True).start()
    events: list[Event] = []
    phases, ready_at = _wait(scripted([]), engine.url, tmp_path, events=events)
    assert engine.ready_at is not None and engine.ready_at <= ready_at
    assert "ready" in phases
    assert [e.phase for e in events if isinstance(e, Phase)] == ["ready"]
    assert any(isinstance(e, Step) and "503 loading" in e.detail for e in events)


def test_a_ready_line_without_health_200_is_not_ready(engine: HealthServer, tmp_path: Path) -> None:
    engine.bind()  # answers 503 loading throughout
    port = engine.port
    runtime = scripted([(0.1, f"{PREFIX}Server live and ready at 127.0.0.1:{port} running m")])
    with pytest.raises(launch.LaunchFailed) as failed:
        _wait(runtime, engine.url, tmp_path, stall=0.8)
    assert failed.value.diagnosis.cause == "health" and "503 loading" in failed.value.diagnosis.message


def test_a_faulted_engine_fails_at_once_with_its_reason(engine: HealthServer, tmp_path: Path) -> None:
    engine.answer = (503, {"status": "faulted", "reason": "Xid 79: GPU has fallen off the bus"})
    engine.bind()
    started = time.monotonic()
    with pytest.raises(launch.LaunchFailed) as failed:
        _wait(scripted([]), engine.url, tmp_path, stall=60, boot=60)
    diagnosis = failed.value.diagnosis
    assert diagnosis.cause == "gpu-fault" and "Xid 79: GPU has fallen off the bus" in diagnosis.message
    assert "nvidia-smi" in diagnosis.remedy
    assert time.monotonic() - started < 30  # not on a timer


def test_a_health_change_is_progress(engine: HealthServer, tmp_path: Path) -> None:
    """No log line at all: refused for 0.6 s, then 503 loading for ever. The stall window (0.8 s) counts from the
    change, so the stall comes no earlier than 0.6 + 0.8 s, and says what /health answered."""
    _later(0.6, engine.bind)
    started = time.monotonic()
    with pytest.raises(launch.LaunchFailed) as failed:
        _wait(scripted([]), engine.url, tmp_path, stall=0.8)
    assert time.monotonic() - started >= 1.4
    diagnosis = failed.value.diagnosis
    assert diagnosis.cause == "stalled" and "503 loading" in diagnosis.message and "no new log line" in diagnosis.message


def test_log_lines_are_progress_while_health_is_refused(engine: HealthServer, tmp_path: Path) -> None:
    lines = [(0.3, f"{PREFIX}loading step {i}") for i in range(6)]  # 1.8 s of lines, each within the window
    started = time.monotonic()
    with pytest.raises(launch.LaunchFailed) as failed:
        _wait(scripted(lines), engine.url, tmp_path, stall=0.8, boot=30)
    assert time.monotonic() - started >= 1.8 + 0.8
    assert failed.value.diagnosis.cause == "stalled" and "not answering" in failed.value.diagnosis.message


def test_timeout_names_the_phase_and_the_health_answer(engine: HealthServer, tmp_path: Path) -> None:
    engine.bind()
    lines = [(0.2, f"{PREFIX}Fast-loaded 12 weight tensors")] + [(0.2, f"{PREFIX}warming up") for _ in range(20)]
    with pytest.raises(launch.LaunchFailed) as failed:
        _wait(scripted(lines), engine.url, tmp_path, stall=30, boot=1.0)
    diagnosis = failed.value.diagnosis
    assert diagnosis.cause == "timeout" and "phase: loading" in diagnosis.message and "503 loading" in diagnosis.message


def test_an_exit_is_diagnosed_from_todays_error_line(engine: HealthServer, tmp_path: Path) -> None:
    runtime = scripted([(0.1, "2026-08-26T05:35:05Z ERROR Error: Snapshot 'db821d7' has no weight files "
                              "(metadata-only)")], exit_at=0.4)
    with pytest.raises(launch.LaunchFailed) as failed:
        _wait(runtime, engine.url, tmp_path)
    assert failed.value.diagnosis.cause == "empty-cache"
    kept = (tmp_path / "boot.log").read_text()
    assert "Snapshot 'db821d7'" in kept and os.path.getsize(tmp_path / "boot.log") > 0


WATCHDOG = "2026-08-26T05:35:05Z ERROR OOM watchdog: GPU free memory critically low: 1350 MB (threshold: 2048 MB) [{}/3]"


def test_a_watchdog_reading_before_ready_holds_then_warns(engine: HealthServer, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine can say ready and die of its OOM watchdog seconds later: ready only once it has stayed up."""
    monkeypatch.setattr(readiness, "HOLD_S", 1.0)
    runtime = scripted([(0.05, WATCHDOG.format(1))])
    engine.bind()
    _later(0.4, engine.turn_ready)
    events: list[Event] = []
    started = time.monotonic()
    _wait(runtime, engine.url, tmp_path, events=events)
    assert time.monotonic() - started >= 0.4 + 1.0  # held after the 200
    kinds = [(type(e).__name__, getattr(e, "name", "")) for e in events]
    assert ("Step", "holding") in kinds
    assert kinds.index(("Step", "holding")) < next(i for i, e in enumerate(events) if isinstance(e, Warning_))
    assert any(isinstance(e, Warning_) and "OOM watchdog" in e.message for e in events)


def test_an_engine_that_dies_while_held_is_a_failed_start(engine: HealthServer, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readiness, "HOLD_S", 30.0)
    lines = [(0.05, WATCHDOG.format(1)), (0.6, WATCHDOG.format(2)), (0.3, WATCHDOG.format(3)),
             (0.1, "2026-08-26T05:35:06Z ERROR OOM watchdog: 3 consecutive readings below threshold. Terminating.")]
    runtime = scripted(lines, exit_at=1.4)
    engine.bind()
    _later(0.3, engine.turn_ready)
    started = time.monotonic()
    with pytest.raises(launch.LaunchFailed) as failed:
        _wait(runtime, engine.url, tmp_path)
    assert failed.value.diagnosis.cause == "out-of-memory" and "OOM watchdog" in failed.value.diagnosis.message
    assert time.monotonic() - started < 15  # on the exit, not the end of the hold


def test_a_modelless_boot_waiting_a_whole_window_says_so(engine: HealthServer, tmp_path: Path) -> None:
    engine.bind()  # 503 loading throughout: the engine is up but has no model
    line = (f"{PREFIX}Server live at 127.0.0.1:{engine.port} — no model loaded yet, requests get 503 until one is "
            "started from the Library")
    events: list[Event] = []
    with pytest.raises(launch.LaunchFailed) as failed:
        _wait(scripted([(0.1, line)]), engine.url, tmp_path, stall=0.8, events=events)
    assert failed.value.diagnosis.cause == "no-model" and "run RECIPE --print" in failed.value.diagnosis.remedy
    assert [e.phase for e in events if isinstance(e, Phase)] == ["no-model"]
