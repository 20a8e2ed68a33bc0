"""Lifecycle jobs the agent runs for the API: one at a time, each under the machine's lifecycle lock.

A POST starts a job and answers at once (202 + the job), or 409 when the lock is held (by another job,
or by a CLI `run`/`swap`/`stop` on the box). Every event gets a sequence number (`seq` 1, 2, ...), so a
follower asks for "what came after N" (`wait_events`, a long-poll) and never sees a gap or a repeat.

Cancelling works as Ctrl-C does in the CLI, cooperatively: it cancels the job's token (metralectl/cancel.py),
which is bound to the job's thread, and the work stops at its next check — its next event, or the
lifecycle's next phase boundary or wait tick (an engine loading silently is polled every few tens of ms).
The check raises Cancelled, a KeyboardInterrupt, once, so the lifecycle's own cleanup runs (the
half-started container is removed; an interrupted swap leaves its journal for the next run to repair)
and is never cut short by a second one.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from metralectl.cancel import CancelToken
from metralectl.errors import ExitCode, MetralError
from metralectl.seams.store import AGENT_JOB

MAX_EVENTS = 2000
MAX_JOBS = 20
MAX_WAIT_S = 25.0
ACTIVE_STATES = ("starting", "running")


def event_json(event: Any) -> dict[str, Any]:
    from metralectl.lifecycle.events import to_json

    return {"t": time.time(), **to_json(event)}


@dataclass
class Job:
    id: str
    kind: str  # run | swap | stop
    target: str | None
    state: str = "starting"  # starting | running | done | failed | cancelled
    started: float = field(default_factory=time.time)
    finished: float | None = None
    events: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=MAX_EVENTS))
    result: Any = None
    error: str | None = None
    hint: str | None = None
    exit_code: ExitCode | None = None  # OK done; the MetralError's code when failed; INTERRUPTED cancelled
    cancel_requested: bool = False
    cancelled_by: str | None = None  # "a client" (POST .../cancel) | "the agent stopping"
    seq: int = 0  # the last event's number
    who: str = "a local API client"  # for the agent's log (metralectl/joblog.py)
    what: str = ""  # ... what it does, escaped (joblog.describe); default: kind and target
    token: CancelToken = field(default_factory=CancelToken, repr=False, compare=False)  # bound to the job's thread
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False, compare=False)

    def to_json(self, *, events: bool = True) -> dict[str, Any]:
        with self._cond:
            out = {"id": self.id, "kind": self.kind, "target": self.target, "state": self.state,
                   "started": self.started, "finished": self.finished, "result": self.result, "error": self.error,
                   "hint": self.hint, "exit_code": self.exit_code, "cancel_requested": self.cancel_requested,
                   "cancelled_by": self.cancelled_by, "last_seq": self.seq}
            if events:
                out["events"] = list(self.events)
        return out

    # -- events -----------------------------------------------------------------------------------
    def emit(self, event: Any) -> None:
        """The lifecycle's on_event: record the event; every event is also a place the cancel stops the job."""
        self.token.check()
        body = event_json(event)
        with self._cond:
            self.seq += 1
            self.events.append({"seq": self.seq, **body})
            self._cond.notify_all()

    def wait_events(self, after: int, wait_s: float) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
        """(events with seq > after, the job without its events, how many of them were dropped from memory),
        waiting up to wait_s (at most MAX_WAIT_S) for at least one new event or the job's end."""
        deadline = time.monotonic() + min(max(wait_s, 0.0), MAX_WAIT_S)
        with self._cond:
            while self.seq <= after and self.finished is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            new = [e for e in self.events if e["seq"] > after]
            missed = (new[0]["seq"] - after - 1) if new else 0
            return new, self.to_json(events=False), missed

    # -- cancelling --------------------------------------------------------------------------------
    def cancel(self, by: str = "a client") -> bool:
        """Ask the job to stop (as Ctrl-C would); False when it had already ended."""
        with self._cond:
            if self.finished is not None:
                return False
            self.cancel_requested = True
            self.cancelled_by = self.cancelled_by or by
            self._cond.notify_all()
        self.token.cancel(f"cancelled by {self.cancelled_by}")
        return True

    def wait_finished(self, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.finished is not None, timeout_s)

    def _finish(self, state: str, *, result: Any = None, error: str | None = None, hint: str | None = None,
                exit_code: ExitCode) -> None:
        with self._cond:
            self.state, self.result, self.error, self.hint, self.exit_code = state, result, error, hint, exit_code
            self.finished = time.time()
            self._cond.notify_all()


Work = Callable[[Callable[[Any], None]], Any]  # work(on_event) -> a JSON-ready result


class JobRunner:
    def __init__(self, lock: Callable[[str], Any] | None = None) -> None:
        if lock is None:
            from metralectl.seams.store import lifecycle_lock

            lock = lifecycle_lock
        self._lock_factory = lock
        self._jobs: dict[str, Job] = {}
        self._order: deque[str] = deque()
        self._ids = itertools.count(1)
        self._mutex = threading.Lock()

    def get(self, job_id: str) -> Job | None:
        with self._mutex:
            return self._jobs.get(job_id)

    def list(self) -> list[Job]:
        with self._mutex:
            return [self._jobs[i] for i in self._order]

    def cancel(self, job_id: str) -> Job | None:
        job = self.get(job_id)
        if job is not None:
            job.cancel()
        return job

    def shutdown(self, timeout_s: float) -> tuple[Job, ...]:
        """Cancel the jobs still running and wait (bounded) for their cleanup; the ones that did not end."""
        active = [job for job in self.list() if job.finished is None]
        for job in active:
            job.cancel("the agent stopping")
        deadline = time.monotonic() + timeout_s
        return tuple(job for job in active if not job.wait_finished(max(0.0, deadline - time.monotonic())))

    def start(self, kind: str, target: str | None, work: Work, *, who: str = "a local API client",
              what: str | None = None) -> Job:
        """Start work under the lifecycle lock; raises store.Busy (without starting) if the lock is held.
        `who` asked for it and `what` it does (escaped) go to the agent's log, at its start and its end."""
        from metralectl import joblog

        with self._mutex:
            job = Job(f"{kind}-{int(time.time())}-{next(self._ids)}", kind, target, who=who,
                      what=what if what is not None else joblog.describe(kind, target))
        got = threading.Event()
        refused: list[BaseException] = []

        def run() -> None:
            outcome: list[Any] = []  # [result] once the work has returned
            try:
                with self._lock_factory(f"{kind} {target or ''}".strip() + AGENT_JOB):  # store.busy_because says so
                    with job._cond:
                        job.state = "running"
                    joblog.started(job.id, job.who, job.what)
                    got.set()
                    with job.token.bound():  # the lifecycle's checkpoints and waits see the job's cancel
                        outcome.append(work(job.emit))
                job._finish("done", result=outcome[0], exit_code=ExitCode.OK)
            except KeyboardInterrupt:  # the token's Cancelled (signals reach the main thread, never a job's)
                job._finish("cancelled", error=f"cancelled by {job.cancelled_by}; what it had started was cleaned up",
                            exit_code=ExitCode.INTERRUPTED)
            except MetralError as exc:
                if not got.is_set():
                    refused.append(exc)
                if job.token.raised:  # what the cancel became (a swap's SwapInterrupted says what serves)
                    job._finish("cancelled", error=f"cancelled by {job.cancelled_by} ({exc.message})", hint=exc.hint,
                                exit_code=ExitCode.INTERRUPTED)
                else:
                    job._finish("failed", error=exc.message, hint=exc.hint, exit_code=exc.exit_code)
            except BaseException as exc:  # noqa: BLE001 - a job thread must record, never vanish
                job._finish("failed", error=f"internal error: {type(exc).__name__}: {exc}",
                            exit_code=ExitCode.SOFTWARE)
            finally:
                if got.is_set() and not refused:  # a job that started (a refusal is the caller's to report)
                    joblog.ended(job.id, job.who, job.what, outcome=job.state, exit_code=job.exit_code,
                                 duration_s=(job.finished or time.time()) - job.started, error=job.error)
                got.set()

        threading.Thread(target=run, name=f"agent-job-{job.id}", daemon=True).start()
        got.wait()
        if refused:
            raise refused[0]
        with self._mutex:
            self._jobs[job.id] = job
            self._order.append(job.id)
            while len(self._order) > MAX_JOBS:
                self._jobs.pop(self._order.popleft(), None)
        return job
