"""Run a campaign over admitted nodes: one worker thread per node, the plan's rule at run time (pure parts in
campaign_plan.py), thermal parking, retiring, and only verified records counting. Emits events; never prints.

Per node, in a loop: if it has something it may take, read its temperature first — at or above the
class's park line (or throttled) it is parked and re-read every `thermal_poll_s` until at or below the
resume line (at most `thermal_max_wait_s`, then it resumes with a warning); a node that cannot report
a temperature is never parked (said once). Then it takes its pick, submits it under the key
`certify-<run>-<node>-<unit>`, follows the unit's event stream (re-attaching after lost links), and
fetches the record, which counts only once verified (signed by that node, for that unit, completed).
A failure puts the unit back for another node (never the same one; at most `attempts` nodes), and a
node that fails `retire_after` times in a row is retired. A FAIL verdict stops new dispatches unless
`keep_going`. `abort()` (Ctrl-C) cancels every node's running unit.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from metralectl.seams import store
from metralectl.campaign.plan import PlannedUnit, pick
from metralectl.errors import ExitCode, MetralError
from metralectl.peers.remote_units import UnitRefused
from metralectl.telemetry.thermal import ThermalLines, ThermalState, thermal_status

ABORT_WAIT_S = 45.0  # after Ctrl-C: how long to wait for the nodes' cancelled units to end (a node SIGKILLs at 30 s)


class NodeHandle(Protocol):
    name: str
    fingerprint: str

    def submit(self, spec: dict[str, Any]) -> tuple[dict[str, Any], bool]: ...

    def follow(self, key: str, on_event: Callable[[dict[str, Any]], None],
               on_loss: Callable[[int, str], None]) -> dict[str, Any]: ...

    def fetch(self, key: str, dest: Path, suite: str) -> dict[str, Any]: ...

    def cancel(self, key: str) -> None: ...

    def thermal(self) -> dict[str, Any]: ...


@dataclass
class CampaignOptions:
    keep_going: bool = False
    ignore_thermals: bool = False
    thermal_poll_s: float = 60.0
    thermal_max_wait_s: float = 1800.0
    retire_after: int = 2  # consecutive failures
    attempts: int = 2  # nodes a unit may be tried on
    timeout_factor: float = 3.0
    allowance_s: float = 120.0  # a unit's fixed allowance on top of expected x factor
    busy_backoff_s: float = 30.0  # a node that answers "not admitted now" (busy, floors) is asked again after this
    busy_limit: int = 20  # ... this many times in a row, then it is retired


@dataclass
class UnitResult:
    unit: PlannedUnit
    state: str = "pending"  # pending | running | accepted | failed | not-run | cancelled
    node: str | None = None
    key: str | None = None
    verdict: str | None = None
    headline: dict[str, Any] = field(default_factory=dict)
    record_dir: str | None = None
    error: str | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"unit": self.unit.to_json(), "state": self.state, "node": self.node, "key": self.key,
                "verdict": self.verdict, "headline": self.headline, "record_dir": self.record_dir,
                "error": self.error, "attempts": self.attempts}


Emit = Callable[[str, dict[str, Any]], None]


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:40] or "node"


class Campaign:
    def __init__(self, run_id: str, units: list[PlannedUnit], nodes: list[NodeHandle], reference: str,
                 lines: dict[str, ThermalLines | None], directory: Path, *, options: CampaignOptions | None = None,
                 on_event: Emit = lambda kind, data: None) -> None:
        self.run_id, self.reference, self.lines, self.directory = run_id, reference, lines, directory
        self.options = options or CampaignOptions()
        self.nodes = {n.name: n for n in nodes}
        self.emit_to = on_event
        self.results = {u.id: UnitResult(u) for u in units}
        self.pending = list(units)
        self.excluded: dict[str, set[str]] = {}
        self.groups_on: dict[str, set[str]] = {n: set() for n in self.nodes}
        self.running: dict[str, UnitResult] = {}
        self.failures = {n: 0 for n in self.nodes}
        self.busy = {n: 0 for n in self.nodes}
        self.retired: dict[str, str] = {}
        self.thermal: dict[str, ThermalState] = {n: "ok" for n in self.nodes}
        self.thermal_log: list[dict[str, Any]] = []
        self.halted: str | None = None
        self.aborting = threading.Event()
        self.cond = threading.Condition()
        self.started = time.time()

    # -- events and the record ------------------------------------------------------------------
    def emit(self, kind: str, **data: Any) -> None:
        data["at"] = time.time()
        if kind == "thermal":
            with self.cond:
                self.thermal_log.append(data)
        self.emit_to(kind, data)

    def to_json(self) -> dict[str, Any]:
        with self.cond:
            return {"kind": "metralectl-bench-campaign", "schema": 1, "run_id": self.run_id,
                    "started": self.started, "reference": self.reference, "nodes": list(self.nodes),
                    "retired": dict(self.retired), "halted": self.halted, "aborted": self.aborting.is_set(),
                    "thermal": list(self.thermal_log), "units": [r.to_json() for r in self.results.values()]}

    def save(self) -> None:
        store.write_json(self.directory / "campaign.json", self.to_json())

    # -- running --------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run to the end (or until abort() from another thread); returns the campaign record."""
        self.save()
        # Each worker says it has ended through an Event, never through Thread.join: a Ctrl-C landing inside
        # join() can leave the thread marked stopped while it still runs (CPython <= 3.11), and the campaign
        # would then conclude without waiting for a node's cancelled unit to end.
        ended = {name: threading.Event() for name in self.nodes}
        for name in self.nodes:
            threading.Thread(target=self._worker_until_ended, args=(name, ended[name]), name=f"campaign-{name}",
                             daemon=True).start()
        try:
            for flag in ended.values():
                while not flag.wait(0.2):
                    pass
        except KeyboardInterrupt:
            self.abort()
            deadline = time.monotonic() + ABORT_WAIT_S
            for flag in ended.values():
                flag.wait(max(0.1, deadline - time.monotonic()))
            self._conclude()
            raise
        self._conclude()
        return self.to_json()

    def abort(self) -> None:
        """Ctrl-C: stop dispatching and cancel every node's running unit."""
        self.aborting.set()
        with self.cond:
            running = [(name, r.key) for name, r in self.running.items() if r.key]
            self.cond.notify_all()
        for name, key in running:
            try:
                self.nodes[name].cancel(key)
                self.emit("cancel", node=name, key=key, ok=True)
            except MetralError as exc:
                self.emit("cancel", node=name, key=key, ok=False, error=exc.message)

    def _conclude(self) -> None:
        with self.cond:
            for r in self.results.values():
                if r.state == "pending":
                    r.state = "cancelled" if self.aborting.is_set() else "not-run"
                    r.error = r.error or ("cancelled" if self.aborting.is_set() else self._why_not_run(r.unit))
                elif r.state == "running":
                    r.state, r.error = "cancelled", "the campaign was interrupted"
        self.save()
        self.emit("summary", **summarize(self.to_json()))

    def _why_not_run(self, unit: PlannedUnit) -> str:
        if self.halted:
            return f"not started: {self.halted}"
        if unit.speed and self.reference in self.retired:
            return f"the reference node {self.reference} was retired (speed-class units run only there)"
        return "no admitted node could run it"

    def _could_get_work(self, name: str) -> bool:
        """Is there anything now pending, or running elsewhere (it may come back), that this node may take?"""
        from metralectl.campaign.plan import may_run

        def takes(u: PlannedUnit) -> bool:
            return may_run(u, name, self.reference) and name not in self.excluded.get(u.id, set())

        return any(takes(u) for u in self.pending) or any(takes(r.unit) for n, r in self.running.items() if n != name)

    def _worker_until_ended(self, name: str, ended: threading.Event) -> None:
        try:
            self._worker(name)
        finally:
            ended.set()

    def _worker(self, name: str) -> None:
        while True:
            with self.cond:
                while True:
                    if self.aborting.is_set() or self.halted or name in self.retired:
                        return
                    if pick(self.pending, name, self.reference, self.groups_on[name], self.excluded) is not None:
                        break
                    if not self._could_get_work(name):
                        return
                    self.cond.wait(0.5)
            if not self._cool_down(name):
                return
            with self.cond:
                if self.aborting.is_set() or self.halted:
                    return
                unit = pick(self.pending, name, self.reference, self.groups_on[name], self.excluded)
                if unit is None:
                    continue
                self.pending.remove(unit)
                result = self.results[unit.id]
                result.state, result.node = "running", name
                result.key = f"certify-{slug(self.run_id)}-{slug(name)}-{unit.id}"[:128]
                self.running[name] = result
                self.groups_on[name].add(unit.group)
            self._run_unit(name, result)
            with self.cond:
                self.running.pop(name, None)
                self.cond.notify_all()
            self.save()

    def _run_unit(self, name: str, result: UnitResult) -> None:
        unit, node, key = result.unit, self.nodes[name], str(result.key)
        spec = {"key": key, "suite": unit.suite, "params": unit.params, "gates": list(unit.gates),
                "recipe": unit.recipe, "campaign": slug(self.run_id),
                "timeout_s": round(self.options.allowance_s + unit.expected_s * self.options.timeout_factor, 1)}
        self.emit("start", node=name, unit=unit.id, key=key, expected_s=unit.expected_s)
        t0 = time.monotonic()
        error: str | None = None
        try:
            try:
                node.submit(spec)
            except UnitRefused as exc:
                if exc.status != 503:
                    raise
                self._not_now(name, result, exc.message)
                return
            self.busy[name] = 0
            end = node.follow(key, lambda e: self.emit("line", node=name, unit=unit.id, event=e),
                              lambda n, why: self.emit("link-lost", node=name, unit=unit.id, losses=n, why=why))
            state = (end.get("data") or {}).get("state")
            if state == "completed":
                record = node.fetch(key, self.directory / "records" / unit.id, unit.suite)
                result.verdict = str(record.get("verdict") or "none")
                result.headline = dict((record.get("summary") or {}).get("headline") or {})
                result.record_dir = str(self.directory / "records" / unit.id)
            elif state == "cancelled" and self.aborting.is_set():
                error = "cancelled"
            else:
                error = f"the unit ended {state}: {end.get('message')}"
        except MetralError as exc:
            error = exc.message
        attempt = {"node": name, "key": key, "seconds": round(time.monotonic() - t0, 2), "error": error}
        with self.cond:
            result.attempts.append(attempt)
            if error is None:
                result.state, result.error = "accepted", None
                self.failures[name] = 0
                if result.verdict == "fail" and not self.options.keep_going and not self.halted:
                    self.halted = f"unit {unit.id} failed its gate on {name}"
            elif self.aborting.is_set():
                result.state, result.error = "cancelled", error
            else:
                self._failed(name, result, error)
        self.emit("done", node=name, unit=unit.id, key=key, state=result.state, verdict=result.verdict,
                  error=result.error, seconds=attempt["seconds"], headline=result.headline)
        if self.halted and result.verdict == "fail":
            self.emit("halt", reason=self.halted)

    def _not_now(self, name: str, result: UnitResult, why: str) -> None:
        """The node refused for now (busy, below its floors, queue full): not a failure of the unit; the unit
        goes back as it was and the node waits busy_backoff_s (retired after busy_limit refusals in a row)."""
        with self.cond:
            self.busy[name] += 1
            result.state, result.node, result.key = "pending", None, None
            self.pending.append(result.unit)
            self.groups_on[name].discard(result.unit.group)
            if self.busy[name] >= self.options.busy_limit:
                self.retired[name] = f"not admitted {self.busy[name]} times in a row (last: {why})"
        self.emit("busy", node=name, unit=result.unit.id, times=self.busy[name], why=why)
        if name in self.retired:
            self.emit("retired", node=name, reason=self.retired[name])
        else:
            self.aborting.wait(self.options.busy_backoff_s)

    def _failed(self, name: str, result: UnitResult, error: str) -> None:
        """A harness failure on `name` (under the lock): put the unit back for another node, maybe retire."""
        self.failures[name] += 1
        self.excluded.setdefault(result.unit.id, set()).add(name)
        if self.failures[name] >= self.options.retire_after:
            self.retired[name] = f"failed {self.failures[name]} times in a row (last: {error})"
            self.emit("retired", node=name, reason=self.retired[name])
        from metralectl.campaign.plan import may_run

        elsewhere = [n for n in self.nodes if n not in self.retired and n not in self.excluded[result.unit.id]
                     and may_run(result.unit, n, self.reference)]
        if len(result.attempts) < self.options.attempts and elsewhere:
            result.state, result.node, result.key, result.error = "pending", None, None, error
            self.pending.append(result.unit)
        else:
            result.state, result.error = "failed", error

    # -- thermal --------------------------------------------------------------------------------
    def _cool_down(self, name: str) -> bool:
        """False only when the campaign is aborting while the node is parked."""
        lines = self.lines.get(name)
        if lines is None:
            return True
        node = self.nodes[name]
        waited_since = time.monotonic()
        while True:
            try:
                reading = node.thermal()
            except MetralError as exc:
                reading = {"temp_c": None, "clock_reasons": None, "reason": exc.message}
            previous = self.thermal[name]
            status = thermal_status(reading.get("temp_c"), reading.get("clock_reasons"), park_c=lines.park_c,
                                    resume_c=lines.resume_c, previous=previous)
            if status.state == "unknown":
                if previous != "unknown":
                    self.emit("thermal", node=name, state="unknown", temp_c=None,
                              reason=f"cannot report a temperature ({reading.get('reason') or 'none given'}): never parked")
                self.thermal[name] = "unknown"
                return True
            if status.state == "ok":
                if previous == "parked":
                    self.emit("thermal", node=name, state="resumed", temp_c=status.temp_c, reason=status.reason)
                self.thermal[name] = "ok"
                return True
            if self.options.ignore_thermals:
                self.emit("thermal", node=name, state="ignored", temp_c=status.temp_c,
                          reason=f"{status.reason}; --dangerous-ignore-thermals: taking units anyway")
                return True
            if previous != "parked":
                self.emit("thermal", node=name, state="parked", temp_c=status.temp_c, reason=status.reason,
                          resume_c=lines.resume_c)
            self.thermal[name] = "parked"
            if time.monotonic() - waited_since > self.options.thermal_max_wait_s:
                self.emit("thermal", node=name, state="resumed", temp_c=status.temp_c,
                          reason=f"still parked after {self.options.thermal_max_wait_s:g} s: resuming with a WARNING")
                self.thermal[name] = "ok"
                return True
            if self.aborting.wait(self.options.thermal_poll_s):
                return False


def summarize(record: dict[str, Any]) -> dict[str, Any]:
    units = record.get("units") or []
    count: dict[str, int] = {}
    for u in units:
        count[u["state"]] = count.get(u["state"], 0) + 1
    failed_gates = [u["unit"]["id"] for u in units if u.get("verdict") == "fail"]
    return {"units": len(units), "states": count, "failed_gates": failed_gates, "retired": record.get("retired"),
            "exit_code": exit_code(record)}


def exit_code(record: dict[str, Any]) -> ExitCode:
    """0 every unit accepted and no gate failed; 2 a gate said no; 1 a unit failed or did not run;
    130 interrupted."""
    if record.get("aborted"):
        return ExitCode.INTERRUPTED
    units = record.get("units") or []
    gate_said_no = any(u.get("verdict") == "fail" for u in units)
    if any(u["state"] != "accepted" for u in units):
        return ExitCode.GATE if gate_said_no else ExitCode.FAILED
    return ExitCode.GATE if gate_said_no else ExitCode.OK
