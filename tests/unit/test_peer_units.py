"""The node's unit queue and unit bodies, with a fake executor: idempotency, conflicts, a full queue,
cancel, numbered events, restart recovery, and that a read-only reader never takes units over."""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from metralectl.seams import store
from metralectl.peers.unit_spec import UnitSpec, UnitSpecError
from metralectl.peers.units import ExecOutcome, QueueFull, Unit, UnitConflict, UnitNotFound, UnitQueue, read_units


class FakeExecutor:
    def __init__(self, hold: bool = False) -> None:
        self.hold = hold
        self.release = threading.Event()
        self.ran: list[str] = []

    def run(self, unit: Unit, emit: Any, cancel: threading.Event) -> ExecOutcome:
        self.ran.append(unit.key)
        emit({"kind": "note", "message": "run r1 -> /tmp/x", "data": {"run_id": "r1", "dir": "/tmp/x"}})
        emit({"kind": "stage", "message": "[1/1] decode", "data": {}})
        while self.hold and not cancel.is_set() and not self.release.is_set():
            time.sleep(0.01)
        status = "interrupted" if cancel.is_set() else "completed"
        return ExecOutcome(Path("/tmp/x"), 1 if cancel.is_set() else 0, None,
                           {"status": status, "verdict": "pass", "run_id": "r1"})


def spec(key: str = "k1", **params: Any) -> UnitSpec:
    return UnitSpec.from_json({"key": key, "suite": "decode", "params": {"repeats": 3, **params}})


def wait_for(cond: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_bodies_are_checked_and_canonical() -> None:
    assert spec(max_tokens=16).digest == UnitSpec.from_json(
        {"key": "k1", "suite": "decode", "params": {"max_tokens": "16", "repeats": "3"}}).digest
    for bad, why in [({"key": "../x", "suite": "decode"}, "key"), ({"key": "k", "suite": "nope"}, "no benchmark suite"),
                     ({"key": "k", "suite": "decode", "params": {"x": 1}}, "unknown parameter"),
                     ({"key": "k", "suite": "decode", "colour": 1}, "unknown unit field"),
                     ({"key": "k", "suite": "decode", "gates": ["fast"]}, "METRIC OP NUMBER"),
                     ({"key": "k", "suite": "decode", "timeout_s": 0}, "timeout_s")]:
        with pytest.raises(UnitSpecError, match=why):
            UnitSpec.from_json(bad)


def test_idempotent_submit_conflict_and_events(tmp_path: Path) -> None:
    ex = FakeExecutor()
    q = UnitQueue(tmp_path, ex).start()
    try:
        unit, created = q.submit(spec(), "FP-A")
        again, created_again = q.submit(spec(), "FP-A")
        assert created and not created_again and again is unit
        with pytest.raises(UnitConflict):
            q.submit(spec(repeats=4), "FP-A")
        with pytest.raises(UnitConflict):
            q.submit(spec(), "FP-B")  # another peer cannot take (or see) my key
        wait_for(lambda: unit.done)
        events, done = q.events_after("k1", 0, 0)
        assert done and [e["seq"] for e in events] == list(range(1, len(events) + 1))
        assert [e["kind"] for e in events] == ["queued", "started", "note", "stage", "end"]
        assert unit.state == "completed" and unit.run_id == "r1" and q.waiting() == 0
        assert q.events_after("k1", len(events), 0.05) == ([], True)
        with pytest.raises(UnitNotFound):
            q.get("k1", "FP-B")
    finally:
        q.stop()


def test_full_queue_and_cancel(tmp_path: Path) -> None:
    ex = FakeExecutor(hold=True)
    q = UnitQueue(tmp_path, ex, max_waiting=2).start()
    try:
        running, _ = q.submit(spec("run"), "FP")
        wait_for(lambda: running.state == "running")
        q.submit(spec("w1"), "FP")
        waiting, _ = q.submit(spec("w2"), "FP")
        with pytest.raises(QueueFull):
            q.submit(spec("w3"), "FP")
        assert q.waiting() == 3
        q.cancel("w2", "FP")
        assert waiting.state == "cancelled" and "before it started" in (waiting.error or "")
        q.cancel("run", "FP")
        wait_for(lambda: running.done)
        assert running.state == "cancelled" and running.record_status == "interrupted"
        ex.release.set()
        wait_for(lambda: q.get("w1").done)
        assert ex.ran == ["run", "w1"]
    finally:
        q.stop()


def test_restart_recovery_and_read_only_readers(tmp_path: Path) -> None:
    ex = FakeExecutor(hold=True)
    # the agent about to die holds its lifecycle lock elsewhere: its SIGKILL would have released the real one
    q = UnitQueue(tmp_path, ex, lock=functools.partial(store.lifecycle_lock, path=tmp_path / "dead.lock")).start()
    running, _ = q.submit(spec("a"), "FP")
    wait_for(lambda: running.state == "running")
    q.submit(spec("b"), "FP")
    # another process only reading (e.g. `metralectl nodes` judging this box) changes nothing
    reader = UnitQueue(tmp_path, FakeExecutor())
    assert reader.waiting() == 2 and reader.get("a").state == "running"
    assert {u["key"]: u["state"] for u in read_units(tmp_path)} == {"a": "running", "b": "queued"}
    q._thread = None  # the agent dies without stopping (SIGKILL): nothing is saved any more
    q._stop.set()
    restarted = UnitQueue(tmp_path, FakeExecutor()).start()
    try:
        a, b = restarted.get("a"), restarted.get("b")
        assert a.state == "failed" and "agent stopped" in (a.error or "")  # never run twice
        wait_for(lambda: b.done)
        assert b.state == "completed"
        events, _ = restarted.events_after("a", 0, 0)
        assert events[-1]["kind"] == "end" and [e["seq"] for e in events] == list(range(1, len(events) + 1))
    finally:
        restarted.stop()
        ex.release.set()


def test_a_unit_waiting_for_the_lifecycle_lock_is_cancellable_and_bounded(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from metralectl.peers import units as units_mod

    monkeypatch.setattr(units_mod, "LOCK_POLL_S", 0.05)
    ex = FakeExecutor()
    q = UnitQueue(tmp_path, ex).start()
    try:
        with store.lifecycle_lock("run qwen"):
            waits, _ = q.submit(UnitSpec.from_json({"key": "w1", "suite": "decode", "timeout_s": 1}), "FP-A")
            wait_for(lambda: waits.done)
            assert waits.state == "failed" and "stayed busy for 1 s" in str(waits.error) and ex.ran == []
            assert "run qwen (pid" in str(waits.error)
            asked, _ = q.submit(spec("w2"), "FP-A")
            wait_for(lambda: any(e["kind"] == "waiting" for e in asked.events))
            q.cancel("w2", None)  # this node's operator
            wait_for(lambda: asked.done)
            assert asked.state == "cancelled" and "waited for the lifecycle lock" in str(asked.error)
            assert any("by this node's operator" in e["message"] for e in asked.events) and ex.ran == []
        free, _ = q.submit(spec("w3"), "FP-A")
        wait_for(lambda: free.done)
        assert free.state == "completed" and ex.ran == ["w3"] and store.lock_holder() is None
    finally:
        q.stop()


def test_the_agent_stopping_ends_a_waiting_unit_as_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from metralectl.peers import units as units_mod

    monkeypatch.setattr(units_mod, "LOCK_POLL_S", 0.05)
    q = UnitQueue(tmp_path, FakeExecutor()).start()
    with store.lifecycle_lock("swap qwen"):
        unit, _ = q.submit(spec("w4"), "FP-A")
        wait_for(lambda: any(e["kind"] == "waiting" for e in unit.events))
        q.stop()
    assert unit.state == "failed" and unit.error == "the agent stopped while this unit waited for the lifecycle lock"
