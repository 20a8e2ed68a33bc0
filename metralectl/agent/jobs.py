"""Lifecycle jobs the agent runs for the API: one at a time, each under the machine's lifecycle lock.

A POST starts a job and answers at once (202 + the job), or 409 when the lock is held (by another job,
or by a CLI `run`/`swap`/`stop` on the box). The job's events are kept so the page can follow them.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

from metralectl.errors import MetralError

MAX_EVENTS = 500
MAX_JOBS = 20


def event_json(event: Any) -> dict[str, Any]:
    kind = type(event).__name__.rstrip("_")
    body = asdict(event) if is_dataclass(event) and not isinstance(event, type) else {"text": str(event)}
    return {"kind": kind, "t": time.time(), **body}


@dataclass
class Job:
    id: str
    kind: str  # run | swap | stop
    target: str | None
    state: str = "starting"  # starting | running | done | failed
    started: float = field(default_factory=time.time)
    finished: float | None = None
    events: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=MAX_EVENTS))
    result: Any = None
    error: str | None = None
    hint: str | None = None

    def to_json(self, *, events: bool = True) -> dict[str, Any]:
        out = {"id": self.id, "kind": self.kind, "target": self.target, "state": self.state, "started": self.started,
               "finished": self.finished, "result": self.result, "error": self.error, "hint": self.hint}
        if events:
            out["events"] = list(self.events)
        return out


Work = Callable[[Callable[[Any], None]], Any]  # work(on_event) -> a JSON-ready result


class JobRunner:
    def __init__(self, lock: Callable[[str], Any] | None = None) -> None:
        if lock is None:
            from metralectl.store import lifecycle_lock

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

    def start(self, kind: str, target: str | None, work: Work) -> Job:
        """Start work under the lifecycle lock; raises store.Busy (without starting) if the lock is held."""
        with self._mutex:
            job = Job(f"{kind}-{int(time.time())}-{next(self._ids)}", kind, target)
        got = threading.Event()
        refused: list[BaseException] = []

        def run() -> None:
            try:
                with self._lock_factory(f"{kind} {target or ''} (agent)".replace("  ", " ")):
                    job.state = "running"
                    got.set()
                    job.result = work(lambda event: job.events.append(event_json(event)))
                    job.state = "done"
            except MetralError as exc:
                if not got.is_set():
                    refused.append(exc)
                job.state, job.error, job.hint = "failed", exc.message, exc.hint
            except BaseException as exc:  # noqa: BLE001 - a job thread must record, never vanish
                job.state, job.error = "failed", f"internal error: {type(exc).__name__}: {exc}"
            finally:
                job.finished = time.time()
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
