"""Remote benchmark units on this node: an idempotent queue, one unit at a time, events kept for re-attaching.

    <METRALE_HOME>/units/<key>/unit.json     the unit: spec, digest, requester, state, run dir (atomic)
    <METRALE_HOME>/units/<key>/events.jsonl  its events, numbered 1, 2, ... (appended)

A unit is queued -> running -> completed | failed | cancelled. Events are kept (and persisted), so a
follower that lost its link asks again from the last sequence number it saw and misses nothing; a
unit that was running when the agent stopped is failed on the next start (its record, if any, says
how far it got). A unit runs under the machine's lifecycle lock, so nobody launches, swaps or stops the
model it is measuring (they are told which unit holds it and how to cancel it); a unit whose turn comes
while a launch, swap or stop holds the lock waits for it, cancellably, at most its own timeout. The work
itself is done by an Executor (unit_exec.SubprocessExecutor runs
`metralectl bench run` as a child process, so a load generator never shares the agent's interpreter).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ContextManager, Protocol

from metralectl import joblog
from metralectl.seams import store
from metralectl.errors import ExitCode, MetralError
from metralectl.peers.unit_spec import KEY_RE, UnitSpec
from metralectl.wording import count, noun

log = logging.getLogger("metralectl.peers")
FINAL = frozenset({"completed", "failed", "cancelled"})
MAX_WAITING = 8  # queued (not yet running) units; more is refused, not silently delayed
KEEP_FINISHED = 200  # finished units kept on disk (their records stay under runs/ regardless)

Emit = Callable[[dict[str, Any]], None]
Lock = Callable[[str], ContextManager[None]]  # store.lifecycle_lock: hold it or raise store.Busy at once
LOCK_POLL_S = 1.0


class UnitConflict(MetralError):
    """The idempotency key is taken by a unit with another body (409)."""

    exit_code = ExitCode.FAILED


class QueueFull(MetralError):
    """Too many units waiting (503)."""

    exit_code = ExitCode.BUSY


class UnitNotFound(MetralError):
    """No such unit for this requester (404)."""

    exit_code = ExitCode.USAGE


@dataclass(frozen=True)
class ExecOutcome:
    run_dir: Path | None  # where the bench run left its record (None: it never started one)
    exit_code: ExitCode  # the bench run's own exit (the process's code, read through the table)
    error: str | None = None  # the run's own error, or why it could not run
    record: dict[str, Any] | None = None


class Executor(Protocol):
    def run(self, unit: Unit, emit: Emit, cancel: threading.Event) -> ExecOutcome: ...


@dataclass
class Unit:
    spec: UnitSpec
    requester: str  # fingerprint of the peer that submitted it
    state: str = "queued"
    submitted: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    run_dir: str | None = None
    run_id: str | None = None
    record_status: str | None = None  # the record's own status (completed, client-bound, interrupted, failed)
    verdict: str | None = None
    exit_code: ExitCode | None = None
    error: str | None = None
    cancel_requested: bool = False
    events: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def key(self) -> str:
        return self.spec.key

    @property
    def done(self) -> bool:
        return self.state in FINAL

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "spec": self.spec.body(), "digest": self.spec.digest, "requester": self.requester,
                "state": self.state, "submitted": self.submitted, "started": self.started, "finished": self.finished,
                "run_id": self.run_id, "record_status": self.record_status, "verdict": self.verdict,
                "exit_code": self.exit_code, "error": self.error, "cancel_requested": self.cancel_requested,
                "events": len(self.events), "run_dir": self.run_dir}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Unit:
        spec = UnitSpec(**{**raw["spec"], "gates": tuple(raw["spec"].get("gates") or ())})
        return cls(spec, str(raw["requester"]), str(raw["state"]), float(raw["submitted"]), raw.get("started"),
                   raw.get("finished"), raw.get("run_dir"), raw.get("run_id"), raw.get("record_status"),
                   raw.get("verdict"),
                   None if raw.get("exit_code") is None else ExitCode.of(raw["exit_code"]),
                   raw.get("error"), bool(raw.get("cancel_requested")))


def read_units(home: Path) -> list[dict[str, Any]]:
    """The units on disk, newest first, read-only (a CLI must never take them over from a running agent)."""
    out = []
    for path in (home / "units").glob("*/unit.json"):
        raw = store.read_json(path)
        if isinstance(raw, dict) and isinstance(raw.get("spec"), dict):
            out.append(raw)
    return sorted(out, key=lambda u: float(u.get("submitted") or 0), reverse=True)


class UnitQueue:
    def __init__(self, home: Path, executor: Executor, *, max_waiting: int = MAX_WAITING,
                 lock: Lock = store.lifecycle_lock) -> None:
        self.root = home / "units"
        self.executor = executor
        self.lock = lock
        self.max_waiting = max_waiting
        self._units: dict[str, Unit] = {}
        self._waiting: deque[str] = deque()
        self._cond = threading.Condition()
        self._cancel: dict[str, threading.Event] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._load()

    # -- persistence ----------------------------------------------------------------------------
    def _dir(self, key: str) -> Path:
        assert KEY_RE.fullmatch(key)
        return self.root / key

    def _save(self, unit: Unit) -> None:
        store.write_json(self._dir(unit.key) / "unit.json", unit.to_json())

    def _load(self) -> None:
        if not self.root.is_dir():
            return
        found: list[Unit] = []
        for path in self.root.glob("*/unit.json"):
            raw = store.read_json(path)
            try:
                if not isinstance(raw, dict):
                    raise TypeError("not a JSON object")
                unit = Unit.from_json(raw)
            except (KeyError, TypeError, ValueError):
                log.warning("ignoring an unreadable unit record %s", path)
                continue
            unit.events = [e for e in store.read_jsonl(path.parent / "events.jsonl") if isinstance(e, dict)]
            found.append(unit)
        found.sort(key=lambda u: u.submitted)
        for unit in found:
            self._units[unit.key] = unit
            if unit.state == "queued":
                self._waiting.append(unit.key)

    # -- events ---------------------------------------------------------------------------------
    def _emit(self, unit: Unit, kind: str, message: str = "", **data: Any) -> None:
        with self._cond:
            event = {"seq": len(unit.events) + 1, "t": time.time(), "kind": kind, "message": message, "data": data}
            unit.events.append(event)
            store.append_jsonl(self._dir(unit.key) / "events.jsonl", event)
            self._cond.notify_all()

    def _finish(self, unit: Unit, state: str, **changes: Any) -> None:
        with self._cond:  # one critical section: whoever sees the final state also sees the "end" event
            for name, value in changes.items():
                setattr(unit, name, value)
            unit.state = state
            unit.finished = time.time()
            self._save(unit)
            self._emit(unit, "end", f"unit {state}" + (f": {unit.error}" if unit.error else ""), state=state,
                       verdict=unit.verdict, record_status=unit.record_status, run_id=unit.run_id)
        joblog.ended(unit.key, *_job_words(unit), outcome=state, exit_code=unit.exit_code,
                     duration_s=(unit.finished or time.time()) - (unit.started or unit.submitted), error=unit.error)

    # -- what the listener asks -----------------------------------------------------------------
    def submit(self, spec: UnitSpec, requester: str) -> tuple[Unit, bool]:
        """(the unit, True when it was created now). Same key + same body: the existing unit."""
        with self._cond:
            existing = self._units.get(spec.key)
            if existing is not None:
                if existing.requester != requester or existing.spec.digest != spec.digest:
                    raise UnitConflict(f"unit key {spec.key} is already used with a different body",
                                       "an idempotency key names one unit: send the same body, or use a new key")
                return existing, False
            if len(self._waiting) >= self.max_waiting:
                raise QueueFull(f"{count(len(self._waiting), 'unit')} {noun(len(self._waiting), 'is', 'are')} already waiting on this node",
                                "submit again when the queue has drained")
            unit = Unit(spec, requester)
            self._units[spec.key] = unit
            self._waiting.append(spec.key)
            self._save(unit)
        self._emit(unit, "queued", f"queued ({len(self._waiting)} waiting)", position=len(self._waiting))
        return unit, True

    def get(self, key: str, requester: str | None = None) -> Unit:
        with self._cond:
            unit = self._units.get(key)
        if unit is None or (requester is not None and unit.requester != requester):
            raise UnitNotFound(f"no unit {key} (from you) on this node")
        return unit

    def cancel(self, key: str, requester: str | None) -> Unit:
        """Cancel a unit for its requester, or (requester None) for this node's operator."""
        unit = self.get(key, requester)
        by = "" if requester is not None else " by this node's operator"
        with self._cond:
            if unit.done:
                return unit
            unit.cancel_requested = True
            self._save(unit)
            if unit.state == "queued":
                self._waiting.remove(key)
                cancelled_now = True
            else:
                cancelled_now = False
                event = self._cancel.get(key)
                if event is not None:
                    event.set()
        if cancelled_now:
            self._finish(unit, "cancelled", error=f"cancelled{by} before it started")
        else:
            self._emit(unit, "note", f"cancel requested{by}: stopping the benchmark")
        return unit

    def events_after(self, key: str, after: int, wait_s: float) -> tuple[list[dict[str, Any]], bool]:
        """Events with seq > after (waiting up to wait_s for one), and whether the unit has ended."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            unit = self._units[key]
            while len(unit.events) <= after and not unit.done:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return list(unit.events[after:]), unit.done

    def list_for(self, requester: str) -> list[Unit]:
        with self._cond:
            return sorted((u for u in self._units.values() if u.requester == requester), key=lambda u: u.submitted)

    def waiting(self) -> int:
        """Units queued or running (admission's "nothing queued" check)."""
        with self._cond:
            return sum(1 for u in self._units.values() if u.state in ("queued", "running"))

    # -- the worker -----------------------------------------------------------------------------
    def start(self) -> UnitQueue:
        """Take the queue over (the agent's peer listener does; a CLI that only reads never calls this)."""
        if self._thread is None:
            finished = sorted((u for u in self._units.values() if u.done), key=lambda u: u.submitted)
            for old in finished[:-KEEP_FINISHED] if len(finished) > KEEP_FINISHED else []:
                shutil.rmtree(self._dir(old.key), ignore_errors=True)
                del self._units[old.key]
            for unit in list(self._units.values()):
                if unit.state == "running":  # the agent stopped under it: say so, and never run it twice
                    self._finish(unit, "failed", error="the agent stopped while this unit ran")
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="peer-units", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 35.0) -> None:
        self._stop.set()
        with self._cond:
            for event in self._cancel.values():
                event.set()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _next(self) -> Unit | None:
        with self._cond:
            while not self._waiting and not self._stop.is_set():
                self._cond.wait(0.5)
            if self._stop.is_set():
                return None
            unit = self._units[self._waiting.popleft()]
            unit.state, unit.started = "running", time.time()
            self._cancel[unit.key] = threading.Event()
            self._save(unit)
            return unit

    def _loop(self) -> None:
        while True:
            unit = self._next()
            if unit is None:
                return
            cancel = self._cancel[unit.key]
            with contextlib.ExitStack() as held:
                why_not = self._hold_lock(unit, cancel, held)
                if why_not is not None:
                    outcome = ExecOutcome(None, ExitCode.FAILED, why_not)
                else:
                    self._emit(unit, "started", f"running {unit.spec.suite}")
                    joblog.started(unit.key, *_job_words(unit))
                    try:
                        outcome = self.executor.run(unit, functools.partial(self._relay, unit), cancel)
                    except Exception as exc:  # noqa: BLE001 - a unit that breaks is a failed unit, never a dead worker
                        log.exception("unit %s broke", unit.key)
                        outcome = ExecOutcome(None, ExitCode.SOFTWARE,
                                              f"internal error: {type(exc).__name__}: {exc}")
            self._conclude(unit, outcome)
            with self._cond:
                self._cancel.pop(unit.key, None)

    def _hold_lock(self, unit: Unit, cancel: threading.Event, held: contextlib.ExitStack) -> str | None:
        """Take the lifecycle lock for the unit's run (into `held`); None once held, else why the unit cannot run."""
        holder = f"{store.UNIT_HOLDER}{unit.key} for peer {unit.requester[:9]}"
        deadline = time.monotonic() + unit.spec.timeout_s
        said: str | None = None
        while True:
            try:
                held.enter_context(self.lock(holder))
                return None
            except store.Busy as exc:
                if exc.message != said:
                    said = exc.message
                    self._emit(unit, "waiting", f"waiting for the lifecycle lock: {exc.message.removeprefix('busy: ')}")
            if cancel.wait(LOCK_POLL_S) or self._stop.is_set():
                if self._stop.is_set() and not unit.cancel_requested:
                    return "the agent stopped while this unit waited for the lifecycle lock"
                return "cancelled while it waited for the lifecycle lock"
            if time.monotonic() > deadline:
                return f"the node stayed busy for {unit.spec.timeout_s:g} s ({said})"

    def _relay(self, unit: Unit, event: dict[str, Any]) -> None:
        raw = event.get("data")
        data: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if data.get("run_id") and unit.run_id is None:
            unit.run_id, unit.run_dir = str(data["run_id"]), str(data.get("dir") or "")
            with self._cond:
                self._save(unit)
        self._emit(unit, str(event.get("kind") or "note"), str(event.get("message") or ""), **data)

    def _conclude(self, unit: Unit, outcome: ExecOutcome) -> None:
        record = outcome.record or {}
        changes: dict[str, Any] = {"exit_code": outcome.exit_code, "record_status": record.get("status"),
                                   "verdict": record.get("verdict"), "error": outcome.error or record.get("error")}
        if outcome.run_dir is not None:
            changes["run_dir"] = str(outcome.run_dir)
            changes["run_id"] = record.get("run_id") or unit.run_id
        if unit.cancel_requested:
            state = "cancelled"
        elif record.get("status") == "completed":
            state = "completed"
        else:
            state = "failed"
            changes["error"] = changes["error"] or f"the benchmark ended with exit code {outcome.exit_code} and no record"
        self._finish(unit, state, **changes)


def _job_words(unit: Unit) -> tuple[str, str]:
    """(who, what) of a unit for the agent's log (metralectl/joblog.py escapes them)."""
    params = " ".join(f"{k}={v}" for k, v in sorted(unit.spec.params.items()))
    return (f"peer {unit.requester}",
            joblog.describe("bench unit", unit.spec.suite, extra=" ".join(
                filter(None, [params, f"recipe {unit.spec.recipe}" if unit.spec.recipe else ""]))))
