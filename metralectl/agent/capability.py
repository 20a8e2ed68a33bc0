"""Can this machine run models? The agent's own answer, re-checked by itself every few seconds.

It is the doctor's verdict on the checks that decide it (Docker reachable and permitted, the NVIDIA
runtime, the driver and a GPU), gathered afresh each round (a new Docker connection, a new NVML
open), so starting Docker or fixing a permission changes the answer within one interval, without a
restart. The heavy check that starts a probe container is left to `metralectl doctor`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

log = logging.getLogger("metralectl.agent")

CAPABILITY_CHECKS = ("docker.daemon", "docker.nvidia-runtime", "gpu.driver", "gpu.model")
DEFAULT_INTERVAL_S = 3.0


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def doctor_capability(check_ids: Sequence[str] = CAPABILITY_CHECKS,
                      context_factory: Callable[[], Any] | None = None) -> dict[str, Any]:
    """One round: the chosen doctor checks, and the verdict (can_run: no check found a problem)."""
    from metralectl.doctor import CHECKS, Context, run_checks

    ctx = context_factory() if context_factory is not None else Context()
    try:
        results = run_checks(ctx, [c for c in CHECKS if c.id in check_ids])
    finally:
        ctx.close(grace_s=1.0)
    checks = [r.to_json() for r in results]
    problems = [c for c in checks if c["status"] == "problem"]
    now = time.time()
    return {"can_run": not problems, "checked_at": _iso(now), "checked_at_unix": now,
            "summary": ("this machine can run models" if not problems
                        else f"this machine cannot run models: {problems[0]['detail']}"),
            "problems": [{"id": p["id"], "title": p["title"], "detail": p["detail"], "remedy": p["remedy"]}
                         for p in problems],
            "checks": checks}


class CapabilityMonitor:
    """Runs `check()` now and then every `interval_s` on its own thread; `latest()` is the newest answer."""

    def __init__(self, check: Callable[[], dict[str, Any]] = doctor_capability, *,
                 interval_s: float = DEFAULT_INTERVAL_S, on_change: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._check = check
        self.interval_s = interval_s
        self._on_change = on_change
        self._latest: dict[str, Any] | None = None
        self._rounds = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> CapabilityMonitor:
        self._thread = threading.Thread(target=self._loop, name="agent-capability", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _round(self) -> None:
        try:
            answer = self._check()
        except Exception as exc:
            log.exception("capability check failed")
            answer = {"can_run": False, "checked_at": _iso(time.time()), "checked_at_unix": time.time(),
                      "summary": f"the agent could not check this machine: {type(exc).__name__}: {exc}",
                      "problems": [{"id": "agent", "title": "Agent self-check", "detail": str(exc),
                                    "remedy": "run `metralectl doctor` for details"}], "checks": []}
        with self._cond:
            before = self._latest
            self._latest = answer
            self._rounds += 1
            self._cond.notify_all()
        if self._on_change is not None and (before is None or before.get("can_run") != answer.get("can_run")):
            self._on_change(answer)

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self._round()
            self._stop.wait(max(0.2, self.interval_s - (time.monotonic() - started)))

    def latest(self, wait_s: float = 0.0) -> dict[str, Any] | None:
        with self._cond:
            if self._latest is None and wait_s > 0:
                self._cond.wait_for(lambda: self._latest is not None, timeout=wait_s)
            return self._latest

    def wait_rounds(self, n: int, timeout: float) -> bool:
        """Wait until n more rounds have completed (tests, and `agent --once`)."""
        with self._cond:
            target = self._rounds + n
            return self._cond.wait_for(lambda: self._rounds >= target, timeout=timeout)
