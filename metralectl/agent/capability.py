"""Can this machine run models? The agent's own answer, re-checked by itself every few seconds.

It is the doctor's verdict on the checks that decide it (Docker reachable and permitted, the NVIDIA
runtime, the driver and a GPU), gathered afresh each round (a new Docker connection, a new NVML
open), so starting Docker or fixing a permission changes the answer within one interval, without a
restart. The heavy check that starts a probe container is left to `metralectl doctor`.

A machine without a usable GPU still runs the recipes of a class with no accelerator (`accelerator:
none`, e.g. `demo-cpu`) when their CPU architecture is this machine's: then the answer is `can_run`
with `scope: "cpu"`, the GPU's problems kept as `limits` (what stands between it and the GPU recipes),
never "cannot run models" while `metralectl run demo-cpu` would work.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from metralectl.safetext import clean

log = logging.getLogger("metralectl.agent")

CAPABILITY_CHECKS = ("docker.daemon", "docker.nvidia-runtime", "gpu.driver", "gpu.model")
GPU_CHECKS = frozenset({"docker.nvidia-runtime", "gpu.driver", "gpu.model"})  # not needed by a CPU class
DEFAULT_INTERVAL_S = 3.0


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def doctor_capability(check_ids: Sequence[str] = CAPABILITY_CHECKS,
                      context_factory: Callable[[], Any] | None = None) -> dict[str, Any]:
    """One round: the chosen doctor checks, and the verdict (see the module docstring)."""
    from metralectl.doctor import CHECKS, Context, run_checks

    ctx = context_factory() if context_factory is not None else Context()
    try:
        results = run_checks(ctx, [c for c in CHECKS if c.id in check_ids])
        checks = [r.to_json() for r in results]
        problems = [c for c in checks if c["status"] == "problem"]
        gpu_only = bool(problems) and all(p["id"] in GPU_CHECKS for p in problems)
        cpu_recipes = _cpu_recipes(ctx) if gpu_only else []
    finally:
        ctx.close(grace_s=1.0)
    return verdict(checks, cpu_recipes, time.time())


def verdict(checks: list[dict[str, Any]], cpu_recipes: list[str], now: float) -> dict[str, Any]:
    """The answer from the checks' results; `cpu_recipes`: the recipes this machine runs without a GPU."""
    problems = [{"id": c["id"], "title": c["title"], "detail": c["detail"], "remedy": c["remedy"]}
                for c in checks if c["status"] == "problem"]
    answer: dict[str, Any] = {"checked_at": _iso(now), "checked_at_unix": now, "checks": checks}
    if not problems:
        return {**answer, "can_run": True, "scope": "gpu", "summary": "this machine can run models",
                "problems": [], "limits": []}
    if cpu_recipes and all(p["id"] in GPU_CHECKS for p in problems):
        shown = ", ".join(cpu_recipes[:3]) + (f" and {len(cpu_recipes) - 3} more" if len(cpu_recipes) > 3 else "")
        return {**answer, "can_run": True, "scope": "cpu", "problems": [], "limits": problems,
                "summary": f"this machine can run CPU recipes only ({shown}): {problems[0]['detail']}"}
    return {**answer, "can_run": False, "scope": None, "problems": problems, "limits": [],
            "summary": f"this machine cannot run models: {problems[0]['detail']}"}


def _cpu_recipes(ctx: Any) -> list[str]:
    """The catalog's recipes of a class without an accelerator whose CPU architecture is this machine's."""
    try:
        machine = ctx.cpu_arch()
        catalog = ctx.catalog()
    except Exception as exc:  # a broken or unanswered catalog: no claim made from it (`doctor` says why)
        log.info("capability: no catalog to look for CPU recipes in: %s", clean(str(exc), 200))
        return []
    names = []
    for name, recipe in catalog.recipes.items():
        hardware = catalog.hardware.get(recipe.hardware)
        if hardware is not None and not hardware.has_accelerator and hardware.cpu_arch == machine:
            names.append(name)
    return sorted(names)


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
