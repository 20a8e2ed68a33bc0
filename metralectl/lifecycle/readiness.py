"""When a starting engine is ready: /health, polled from container start. And when it is not going to be.

Ready is `GET /health` = 200 (engine/metrale.yaml `readiness:`), nothing else: no log line is waited
for (the engine's wording changes between releases; a ready line for another port must not count).
The poll starts with the container, every HEALTH_POLL_S, in its own thread; until the engine binds
its port the answer is "down" (connection refused), which means "not yet", never an error.

Progress, for the stall diagnosis, is a new log line OR a change in the health answer (down →
loading → ready/faulted, or another status). A boot that logs nothing and keeps answering the same
503 is not stalled until a whole stall window passes with no change at all (docs/serving.md).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

from metralectl import cancel
from metralectl.core.contract import Readiness
from metralectl.seams.endpoint import EngineClient, Health
from metralectl.lifecycle.boot import REMEDIES, BootLog, Diagnosis, clean_line
from metralectl.lifecycle.events import Listener, Step

HEALTH_POLL_S = 0.05  # well below the 0.3 s within which a ready engine must be seen ready
HEALTH_TIMEOUT_S = 2.0  # one poll's HTTP timeout (a busy engine answering slowly is still "answering")


@dataclass(frozen=True)
class HealthState:
    kind: str  # down | loading | ready | faulted | other
    status: int | None  # the HTTP status (None: nothing answered)
    detail: str = ""  # the fault's reason, the served model, the error, or a short body

    @property
    def key(self) -> tuple[str, int | None]:
        """What counts as a change (progress): the kind and the status, not the exact text."""
        return self.kind, self.status

    def describe(self) -> str:
        if self.kind == "down":
            return f"not answering ({self.detail})" if self.detail else "not answering"
        if self.kind == "ready":
            return f"{self.status} ready" + (f" (model {self.detail})" if self.detail else "")
        if self.kind == "faulted":
            return f"{self.status} faulted: {self.detail or 'no reason given'}"
        if self.kind == "loading":
            return f"{self.status} loading"
        return f"{self.status} {self.detail}".strip()


NOT_POLLED = HealthState("down", None, "not polled yet")


def _short(text: str, limit: int = 160) -> str:
    text = clean_line(" ".join(text.split()))
    return text if len(text) <= limit else text[:limit] + "…"


def classify_health(answer: Health, readiness: Readiness) -> HealthState:
    """One /health answer, read the way today's engine and the book's write it."""
    if answer.status is None:
        return HealthState("down", None, _short(answer.error or "no answer"))
    try:
        body = json.loads(answer.body) if answer.body else None
    except ValueError:
        body = None
    fields = body if isinstance(body, dict) else {}
    word = fields.get(readiness.status_key)
    if isinstance(word, str) and word == readiness.faulted:
        reason = fields.get(readiness.reason_key)
        return HealthState("faulted", answer.status, _short(str(reason)) if reason is not None else "")
    if answer.status == readiness.ready_status:
        model = fields.get("model")
        return HealthState("ready", answer.status, _short(str(model)) if model is not None else "")
    if answer.status == 503:  # today's {"status":"loading"}, the book's {"error":{"type":"model_not_loaded"}}
        return HealthState("loading", answer.status, _short(word) if isinstance(word, str) else "")
    return HealthState("other", answer.status, _short(answer.body))


class HealthPoller(threading.Thread):
    """GET /health every interval until ready or faulted (or stopped); the latest answer, with when it came.

    `ready_at` is the wall-clock time the first 200 arrived (time.time(), comparable with the engine's
    own clock on the same machine); `changes` counts answers that differed from the one before.
    """

    def __init__(self, url: str, readiness: Readiness, *, interval_s: float = HEALTH_POLL_S) -> None:
        super().__init__(daemon=True, name="health-poll")
        self.url = url
        self.readiness = readiness
        self.interval_s = interval_s
        self.stop_event = threading.Event()
        self.changed = threading.Event()  # set on every change; the waiting loop clears it
        self._lock = threading.Lock()
        self._state = NOT_POLLED
        self.ready_at: float | None = None
        self.changes = 0

    @property
    def state(self) -> HealthState:
        with self._lock:
            return self._state

    def run(self) -> None:
        with EngineClient(self.url, timeout=HEALTH_TIMEOUT_S) as client:
            while not self.stop_event.is_set():
                began = time.monotonic()
                state = classify_health(client.health(self.readiness.health_path), self.readiness)
                received = time.time()
                with self._lock:
                    if state.key != self._state.key:
                        self.changes += 1
                        if state.kind == "ready":
                            self.ready_at = received
                        self._state = state
                        self.changed.set()
                if state.kind in ("ready", "faulted"):
                    return  # final for a boot: the caller takes it from here
                self.stop_event.wait(max(0.0, self.interval_s - (time.monotonic() - began)))

    def stop(self) -> None:
        self.stop_event.set()


class StyleGate:
    """What the engine's readiness style asks beyond a 200 from its health path (engine_profile.READINESS_STYLES):
    marker-then-health, port-closed-until-ready, http-503-until-loaded: nothing more (the 200 is the truth);
    warm-up-marker: its warm-up line in the log as well; lazy-load: one real answer, since such an engine is
    healthy before it has loaded anything. Asked only once health is ready."""

    def __init__(self, readiness: Readiness, url: str, on_event: Listener,
                 probe_timeout_s: float = 600.0) -> None:
        self.readiness = readiness
        self.url = url
        self.on_event = on_event
        self.probe_timeout_s = probe_timeout_s
        self._answered = False
        self._announced = False

    def satisfied(self, log: BootLog) -> bool:
        style = self.readiness.style
        if style == "warm-up-marker":
            if not log.marker_seen and not self._announced:
                self._announced = True
                self.on_event(Step("health", "healthy; waiting for the engine's warm-up line"))
            return log.marker_seen
        if style == "lazy-load":
            if not self._answered:
                self.on_event(Step("health", "healthy; asking for one answer (the engine loads on first use)"))
                with EngineClient(self.url, timeout=self.probe_timeout_s) as client:  # a cancel ends the wait for it
                    self._answered = cancel.call(lambda: client.answer_one(self.probe_timeout_s)).status == 200
            return self._answered
        return True


class BootClock:
    """Boot and stall deadlines; progress pushes the stall deadline out."""

    def __init__(self, started: float, boot_timeout_s: float, stall_timeout_s: float) -> None:
        self.started = started
        self.boot_timeout_s = boot_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.last_progress = started

    def progressed(self, now: float) -> None:
        self.last_progress = now

    def timed_out(self, now: float) -> bool:
        return now - self.started > self.boot_timeout_s

    def stalled(self, now: float) -> bool:
        return now - self.last_progress > self.stall_timeout_s


def fault_diagnosis(state: HealthState, url: str) -> Diagnosis:
    return Diagnosis("gpu-fault", f"the engine reports a GPU fault: {state.detail or 'no reason given'} "
                     f"(GET {url}/health answered {state.status})", REMEDIES["gpu-fault"])


def stall_diagnosis(log: BootLog, state: HealthState, url: str, stall_s: float, *, where: str = "") -> Diagnosis:
    """Nothing changed for a whole stall window: say what the engine last showed, in the operator's terms."""
    health = f"GET {url}/health: {state.describe()}"
    if log.ready_line_seen:
        return Diagnosis("health", f"the engine logged that it is ready on port {log.port}, but /health did not "
                         f"answer 200 for {stall_s:g} s ({health})", REMEDIES["health"])
    if log.phase == "no-model" and state.kind == "loading":
        return Diagnosis("no-model", f"the engine is up without a model and has waited for one for {stall_s:g} s "
                         f"({health})", REMEDIES["no-model"])
    return Diagnosis("stalled", f"no progress for {stall_s:g} s{where}: no new log line and no change in the "
                     f"/health answer (phase: {log.phase}; {health})", REMEDIES["stalled"])


def timeout_diagnosis(log: BootLog, state: HealthState, url: str, boot_s: float, *, label: str = "phase") -> Diagnosis:
    return Diagnosis("timeout", f"not ready after {boot_s:g} s ({label}: {log.phase}; GET {url}/health: "
                     f"{state.describe()})", REMEDIES["timeout"])


def warnings_at_ready(log: BootLog, held_s: float) -> list[str]:
    """A failure signature seen during a boot that still became ready (e.g. a first OOM-watchdog reading) and
    stayed up for held_s: the operator hears of it, since the engine may yet die of it."""
    if log.failure is None:
        return []
    return [f"the engine logged `{log.failure.message}` while starting ({log.failure.cause}); it became ready and "
            f"stayed up for {held_s:g} s, but may not stay up: {log.failure.remedy}"]
