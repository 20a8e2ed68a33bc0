"""When a starting engine is ready: /health, polled from container start. And when it is not going to be.

The one waiting loop of every launch: `wait_ready` watches a launch's ranks (one for a single-node run,
head and worker for EP=2: the same loop) and is the only place a launch polls /health. Ready is
`GET /health` = 200 (engine/metrale.yaml `readiness:`), then what the engine's readiness style
(engine_profile.READINESS_STYLES) still asks: nothing (health-when-loaded), its warm-up line
(warm-up-marker) or one real answer (lazy-load); and in a multi-rank launch one real answer always (a
head whose worker is gone stays healthy but hangs requests). No log line is waited for otherwise (the
engine's wording changes between releases; a ready line for another port must not count). The poll
starts with the containers, every HEALTH_POLL_S, in its own thread; until the engine binds its port
the answer is "down" (connection refused), which means "not yet".

Progress, for the stall diagnosis, is a new log line OR a change in the health answer (down →
loading → ready/faulted, or another status). A boot that logs nothing and keeps answering the same
503 is not stalled until a whole stall window passes with no change at all (docs/serving.md).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from metralectl import cancel
from metralectl.core.contract import Readiness
from metralectl.seams.endpoint import EngineClient, Health
from metralectl.lifecycle.boot import REMEDIES, BootLog, Diagnosis, LaunchFailed, clean_line, diagnose_exit
from metralectl.lifecycle.events import Listener, Phase, Step, Warning_
from metralectl.lifecycle.logfollow import DRAIN_S, Logs, Watched

HEALTH_POLL_S = 0.05  # well below the 0.3 s within which a ready engine must be seen ready
HEALTH_TIMEOUT_S = 2.0  # one poll's HTTP timeout (a busy engine answering slowly is still "answering")
POLL_WAIT_S = 0.02  # the waiting loop's tick: it sees a new /health answer within this of the poll
# A boot that logged a failure signature and still answered 200 must stay up this long before it counts as
# ready: the engine's OOM watchdog reads every ~2 s and exits after 3 low readings, and field logs show its
# first reading before the ready line and the exit 3 s after it (engine-facts §2).
HOLD_S = 8.0
LAZY_ANSWER_S = 600.0  # lazy-load: the first answer includes loading the model


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

    def __init__(self, url: str, readiness: Readiness, *, interval_s: float = HEALTH_POLL_S,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(daemon=True, name="health-poll")
        self.url = url
        self.headers = headers  # the engine token's, when the engine asks it (lifecycle/engine_token.py)
        self.readiness = readiness
        self.interval_s = interval_s
        self.stop_event = threading.Event()
        self._lock = threading.Lock()
        self._state = NOT_POLLED
        self.ready_at: float | None = None
        self.changes = 0

    @property
    def state(self) -> HealthState:
        with self._lock:
            return self._state

    def run(self) -> None:
        with EngineClient(self.url, timeout=HEALTH_TIMEOUT_S, headers=self.headers) as client:
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
                if state.kind in ("ready", "faulted"):
                    return  # final for a boot: the caller takes it from here
                self.stop_event.wait(max(0.0, self.interval_s - (time.monotonic() - began)))

    def stop(self) -> None:
        self.stop_event.set()


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


def health_now(url: str, readiness: Readiness, timeout_s: float,
               headers: dict[str, str] | None = None) -> HealthState:
    """One answer of a serving engine's health, classified (a `run` of what serves already; a swap's repair)."""
    with EngineClient(url, timeout=timeout_s, headers=headers) as client:
        return classify_health(client.health(readiness.health_path), readiness)


class FirstAnswer(threading.Thread):
    """One real 1-token request, off the waiting loop (a hung request must not stop it noticing a dead rank)."""

    def __init__(self, url: str, timeout_s: float, headers: dict[str, str] | None = None) -> None:
        super().__init__(daemon=True, name="first-request")
        self.url = url
        self.headers = headers
        self.timeout_s = timeout_s
        self.result: Health | None = None
        self.finished = threading.Event()

    def run(self) -> None:
        try:
            with EngineClient(self.url, timeout=5.0, headers=self.headers) as client:
                self.result = client.answer_one(self.timeout_s)
        finally:
            self.finished.set()


def wait_ready(ranks: Sequence[Watched], url: str, readiness: Readiness, clock: BootClock, on_event: Listener, *,
               answer_timeout_s: float | None = None, network: str = "",
               headers: dict[str, str] | None = None) -> tuple[dict[str, float], float]:
    """Until the head (ranks[0]) is ready, or the launch is known to fail: a faulted /health, any rank's exit, a
    failed real request, a stall, the boot timeout (LaunchFailed, naming the rank). `answer_timeout_s`: a real
    request must be answered after /health 200 (multi-rank); `network`: the RoCE interface, for the stuck-NCCL
    diagnosis; `headers`: the engine token's, when it asks one. Returns the phases (seconds from clock.started) and the wall-clock time the 200 arrived."""
    logs = Logs(ranks, clock.started, on_event)
    logs.follow()
    poller = HealthPoller(url, readiness, headers=headers)  # only the head serves HTTP
    poller.start()
    try:
        return _Wait(ranks, logs, poller, url, readiness, clock, on_event, answer_timeout_s, network).run()
    finally:
        poller.stop()
        logs.close()


class _Wait:
    def __init__(self, ranks: Sequence[Watched], logs: Logs, poller: HealthPoller, url: str, readiness: Readiness,
                 clock: BootClock, on_event: Listener, answer_timeout_s: float | None, network: str) -> None:
        self.ranks, self.logs, self.poller, self.url, self.readiness = list(ranks), logs, poller, url, readiness
        self.clock, self.on_event, self.network = clock, on_event, network
        self.head = self.ranks[0]
        self.multi = len(self.ranks) > 1
        self.answer_s = answer_timeout_s if answer_timeout_s is not None else (
            LAZY_ANSWER_S if readiness.style == "lazy-load" else None)
        self.request: FirstAnswer | None = None
        self.headers = poller.headers
        self.announced = False
        self.hold_until: float | None = None

    def run(self) -> tuple[dict[str, float], float]:
        seen_changes, next_check, ends_seen, last_end = 0, 0.0, 0, -DRAIN_S
        while True:
            cancel.checkpoint()  # every tick of the wait (POLL_WAIT_S): a silent boot is cancelled within one
            progressed = self.logs.take(POLL_WAIT_S)
            now = time.monotonic()
            if progressed:
                self.clock.progressed(now)
            health = self.poller.state
            if self.poller.changes != seen_changes:
                seen_changes = self.poller.changes
                self.clock.progressed(now)
                if health.kind != "down":
                    self.on_event(Step("health", f"{'head: ' if self.multi else ''}GET {self.readiness.health_path}: "
                                                 f"{health.describe()}"))
            if health.kind == "faulted":
                raise self.fail(self.head, fault_diagnosis(health, self.url))
            if health.kind == "ready" and self.hold_until is None and self._ready(now, health):
                return self.logs.phases, self.poller.ready_at or time.time()
            if self.hold_until is not None and now >= self.hold_until:
                for watched in self.ranks:
                    for warning in warnings_at_ready(watched.boot, HOLD_S):
                        self.on_event(Warning_(f"rank {watched.rank}: {warning}" if self.multi else warning))
                return self.logs.phases, self.poller.ready_at or time.time()
            if len(self.logs.ended) != ends_seen:  # a log that ended: its container is checked at once, then often
                ends_seen, last_end, next_check = len(self.logs.ended), now, now
            if now >= next_check:
                next_check = now + (0.05 if now - last_end < DRAIN_S else 0.5)
                self._check_running()
            if self.hold_until is not None:
                continue  # ready already; only a rank's exit (checked above) can still fail the start
            if self.clock.timed_out(now):
                raise self.fail(self.head, timeout_diagnosis(self.head.boot, health, self.url,
                                                             self.clock.boot_timeout_s,
                                                             label="head phase" if self.multi else "phase"))
            if self.request is None and self.clock.stalled(now):
                raise self.fail(self.head, self._stalled(health))

    def _ready(self, now: float, health: HealthState) -> bool:
        """/health is ready: what the style (and a multi-rank launch) still asks; True once ready. The style's
        branches: warm-up-marker here, lazy-load's answer (answer_s, set from the style), health-when-loaded
        neither."""
        elapsed = now - self.clock.started
        if self.readiness.style == "warm-up-marker" and not self.head.boot.marker_seen:
            if not self.announced:
                self.announced = True
                self.on_event(Step("health", "healthy; waiting for the engine's warm-up line"))
            return False
        if self.request is None:
            if "ready" not in self.logs.phases:  # a silent engine: its readiness is its /health answer
                self.on_event(Phase("ready", f"GET {self.readiness.health_path}: {health.describe()}", elapsed,
                                    0 if self.multi else None))
            if self.answer_s is None:
                self.logs.phases.setdefault("ready", elapsed)
                return self._settle(now)
            self.logs.phases.setdefault("healthy", elapsed)
            self.on_event(Step("request", f"a real request to the head ({self.url}, max_tokens 1, up to "
                                          f"{self.answer_s:g} s): the worker must take part") if self.multi else
                          Step("health", "healthy; asking for one answer (the engine loads on first use)"))
            self.request = FirstAnswer(self.url, self.answer_s, self.headers)
            self.request.start()
        if not self.request.finished.is_set():
            return False
        answer = self.request.result or Health(None, "", "no result")
        if answer.status in (200, 401, 403):
            if answer.status != 200:
                self.on_event(Warning_(f"the {'head' if self.multi else 'engine'} wants credentials (HTTP "
                                       f"{answer.status}): a real request could not be sent, so whether "
                                       f"{'the worker takes part' if self.multi else 'it has loaded'} is unchecked"))
            self.logs.phases["ready"] = elapsed
            return self._settle(now)
        raise self._unanswered(answer)

    def _settle(self, now: float) -> bool:
        """Ready, unless a rank logged a failure signature while starting: then it must stay up HOLD_S first
        (e.g. a first OOM-watchdog reading: it may still exit seconds after ready)."""
        flagged = [(w, w.boot.failure) for w in self.ranks if w.boot.failure is not None]
        if not flagged:
            return True
        self.hold_until = now + HOLD_S
        who, signature = flagged[0]
        self.on_event(Step("holding", f"rank {who.rank} logged `{signature.message}` while starting: checking both "
                                      f"ranks stay up for {HOLD_S:g} s" if self.multi else
                           f"the engine logged `{signature.message}` while starting: checking it stays up for "
                           f"{HOLD_S:g} s"))
        return False

    def _unanswered(self, answer: Health) -> LaunchFailed:
        what = f"{self.readiness.health_path} {self.readiness.ready_status}"
        if answer.status is not None:
            who = "head" if self.multi else "engine"
            return self.fail(self.head, Diagnosis("request-failed", f"the {who} answered a 1-token request with HTTP "
                                                  f"{answer.status}: {answer.body[:200]}",
                                                  f"see the {who}'s log lines above"))
        if not self.multi:
            return self.fail(self.head, Diagnosis("request-failed", f"the engine answers {what}, but a 1-token "
                                                  f"request got no answer ({answer.error})",
                                                  "see the engine's log lines above"))
        worker = self.ranks[-1]
        return self.fail(worker, Diagnosis(
            "requests-hang", f"rank {worker.rank} ({worker.role} on {worker.where}) is not taking part: the head "
            f"answers {what}, but a 1-token request got no answer ({answer.error})", REMEDIES["requests-hang"]))

    def _check_running(self) -> None:
        down = [(w, w.runtime.inspect(w.container_id)) for w in self.ranks]
        down = [(w, info) for w, info in down if info is None or not info.running]
        if not down:
            return
        self.logs.drain({w.rank for w, _ in down})
        down.sort(key=lambda d: (d[0].boot.failure is None, -d[0].rank))  # a rank that said why, else the worker
        watched, info = down[0]
        diagnosis = diagnose_exit(info.exit_code if info else None, bool(info and info.oom_killed), watched.boot)
        if diagnosis.cause == "exited" and self.multi:
            others = [w for w in self.ranks if all(w is not d[0] for d in down)]
            waiting = f" while {others[0].label} kept running" if others else ""
            diagnosis = Diagnosis("rank-exited", f"exited with code {info.exit_code if info else '?'} while "
                                  f"starting{waiting}", REMEDIES["rank-exited"])
        raise self.fail(watched, diagnosis)

    def _stalled(self, health: HealthState) -> Diagnosis:
        head = self.head.boot
        if self.multi and any(w.boot.phase == "rendezvous" for w in self.ranks) and not head.ready_line_seen \
                and health.kind != "ready":
            return Diagnosis("nccl-stuck", f"stuck at \"all ranks ready\" for {self.clock.stall_timeout_s:g} s: NCCL "
                             f"never finished initialising over {self.network} (the ranks disagree on the "
                             "interface, or the link is down)", REMEDIES["nccl-stuck"])
        return stall_diagnosis(head, health, self.url, self.clock.stall_timeout_s,
                               where=" on any rank" if self.multi else "")

    def fail(self, watched: Watched, diagnosis: Diagnosis) -> LaunchFailed:
        """The failure, named by rank in a multi-rank launch: its last lines first, then a few of every other's."""
        if not self.multi:
            return LaunchFailed(diagnosis, list(watched.boot.tail)[-30:], str(watched.log_path))
        if not diagnosis.message.startswith("rank "):
            diagnosis = Diagnosis(diagnosis.cause, f"{watched.label}: {diagnosis.message}", diagnosis.remedy)
        others = [w for w in self.ranks if w is not watched]
        tail = [f"r{watched.rank}│ {line}" for line in list(watched.boot.tail)[-30:]]
        for other in others:
            tail += [f"r{other.rank}│ {line}" for line in list(other.boot.tail)[-5:]]
        paths = "; ".join(f"{w.log_path} (rank {w.rank})" for w in [watched, *others])
        return LaunchFailed(diagnosis, tail, paths)
