"""Lifecycle pieces that need no daemon: boot-log reading, diagnosis, port probe, the lock, the store."""

from __future__ import annotations

import multiprocessing
import socket
from pathlib import Path

import pytest

from metralectl.seams import store
from metralectl.lifecycle.boot import BootLog, diagnose_exit
from metralectl.lifecycle.launch import port_free
from tests.ports import own_port
from tests.unit.recipe_helpers import catalog


def _log(port: int = 8888) -> BootLog:
    return BootLog(catalog().engines["metrale"], "127.0.0.1", port)


def test_book_phases_in_order_and_ready_line() -> None:
    log = _log()
    assert log.feed("loading Sehyo/Qwen3.5-35B-A3B-NVFP4") is None
    assert log.feed("loaded 125000 tensors in 34s") == "loading"
    assert log.feed("captured graph for batch=1") == "capturing-graphs"
    assert not log.ready_line_seen
    assert log.feed("Listening on 127.0.0.1:8888") == "ready"
    assert log.ready_line_seen and log.failure is None


def test_book_ready_line_for_another_port_is_not_ours() -> None:
    log = _log(9000)
    assert log.feed("Listening on 127.0.0.1:8888") is None
    assert not log.ready_line_seen and log.phase == "starting"


@pytest.mark.parametrize("line,cause", [
    ("loaded 0 tensors in 0.1s", "empty-cache"),
    ("error: out of memory while allocating the KV pool", "out-of-memory"),
    ("error: no kernel target for model_type foo; available targets: qwen3_5_moe", "no-kernel-target"),
    ("Error: no compatible GPU found", "no-gpu"),
    ("error: Address already in use (os error 98)", "port-in-use"),
])
def test_failure_signatures(line: str, cause: str) -> None:
    log = _log()
    log.feed(line)
    assert log.failure is not None and log.failure.cause == cause and log.failure.remedy


def test_exit_diagnosis() -> None:
    log = _log()
    assert diagnose_exit(137, False, log).cause == "out-of-memory"
    assert diagnose_exit(1, True, log).cause == "out-of-memory"
    assert diagnose_exit(3, False, log).cause == "exited" and "code 3" in diagnose_exit(3, False, log).message
    log.feed("loaded 0 tensors in 0.0s")
    assert diagnose_exit(1, False, log).cause == "empty-cache"


def test_port_free_sees_a_listener() -> None:
    port = own_port()  # held beside the listener, so nobody else takes it once the listener is gone
    with socket.create_server(("127.0.0.1", port)):
        assert not port_free("127.0.0.1", port)
    assert port_free("127.0.0.1", port)


def _try_lock(path: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    import os

    os.environ["METRALECTL_LOCK_DIR"] = path
    try:
        with store.lifecycle_lock("second"):
            out.put("got it")
    except store.Busy as exc:
        out.put(f"busy: {exc.message}")


def test_lifecycle_lock_answers_busy_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METRALECTL_LOCK_DIR", str(tmp_path))
    with store.lifecycle_lock("swap to x"):
        assert store.lock_held()
        queue: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
        proc = multiprocessing.get_context("fork").Process(target=_try_lock, args=(str(tmp_path), queue))
        proc.start()
        proc.join(10)
        answer = queue.get(timeout=5)
        assert answer.startswith("busy:") and "swap to x" in answer
    assert not store.lock_held()


def test_atomic_json_and_jsonl_survive_a_torn_line(tmp_path: Path) -> None:
    store.write_json(tmp_path / "a.json", {"x": 1})
    assert store.read_json(tmp_path / "a.json") == {"x": 1}
    path = tmp_path / "r.jsonl"
    store.append_jsonl(path, {"n": 1})
    with open(path, "a") as handle:
        handle.write('{"n": 2, "cut')  # what a kill mid-write would leave
    store.append_jsonl(path, {"n": 3})
    assert [r["n"] for r in store.read_jsonl(path)] == [1, 3]  # the torn line is skipped, nothing else is lost
