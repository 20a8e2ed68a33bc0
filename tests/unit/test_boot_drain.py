"""After a container is found down, the diagnosis waits for its log follower to reach the end of the log
(not a fixed second): a remote daemon's stream can deliver the last words well after the exit."""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path

from metralectl.lifecycle import launch, multinode
from metralectl.lifecycle.boot import BootLog as _BootLog
from tests.unit.recipe_helpers import catalog


def BootLog() -> _BootLog:  # noqa: N802 - reads as the class it builds
    return _BootLog(catalog().engines["metrale"], "127.0.0.1", 8888)


def _late(lines: queue.Queue, items: list, after_s: float) -> None:
    def feed() -> None:
        time.sleep(after_s)
        for item in items:
            lines.put(item)

    threading.Thread(target=feed, daemon=True).start()


def test_single_node_drain_waits_for_a_lagging_follower(tmp_path: Path) -> None:
    lines: queue.Queue = queue.Queue()
    _late(lines, ["error: failed to start", None], 1.5)
    seen: list[str] = []
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT)
    try:
        launch._drain(lines, fd, BootLog(), lambda e: seen.append(e.line), ended=False)
    finally:
        os.close(fd)
    assert seen == ["error: failed to start"]
    assert (tmp_path / "log").read_text() == "error: failed to start\n"


def test_single_node_drain_returns_at_once_when_the_log_had_ended(tmp_path: Path) -> None:
    lines: queue.Queue = queue.Queue()
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT)
    t0 = time.monotonic()
    try:
        launch._drain(lines, fd, BootLog(), lambda e: None, ended=True)
    finally:
        os.close(fd)
    assert time.monotonic() - t0 < 0.5


def test_multi_rank_drain_waits_for_the_down_ranks_only(tmp_path: Path) -> None:
    lines: queue.Queue = queue.Queue()
    lines.put((0, "head still loading"))
    _late(lines, [(1, "error: failed to start"), (1, None)], 1.5)
    seen: list[tuple[int, str]] = []
    fds = {r: os.open(tmp_path / f"r{r}", os.O_WRONLY | os.O_CREAT) for r in (0, 1)}
    ended: set[int] = set()
    t0 = time.monotonic()
    try:
        multinode._drain(lines, fds, {0: BootLog(), 1: BootLog()}, lambda e: seen.append((e.rank, e.line)),
                         down={1}, ended=ended)
    finally:
        for fd in fds.values():
            os.close(fd)
    assert seen == [(0, "head still loading"), (1, "error: failed to start")] and ended == {1}
    assert time.monotonic() - t0 < 3.0  # rank 0 (still running) is not waited for
