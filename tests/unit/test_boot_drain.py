"""After a container is found down, the diagnosis waits for its log follower to reach the end of the log
(not a fixed second): a remote daemon's stream can deliver the last words well after the exit. One drain
serves every launch: a single rank is the one-rank case of a multi-rank launch's."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from metralectl.lifecycle.boot import BootLog as _BootLog
from metralectl.lifecycle import logfollow
from metralectl.lifecycle.logfollow import Logs, Watched
from tests.fakes.runtime import FakeRuntime
from tests.unit.recipe_helpers import catalog


def BootLog() -> _BootLog:  # noqa: N802 - reads as the class it builds
    return _BootLog(catalog().engines["metrale"], "127.0.0.1", 8888)


def _logs(tmp_path: Path, ranks: int, listener) -> Logs:
    rt = FakeRuntime()
    return Logs([Watched(r, rt, f"c{r}", BootLog(), tmp_path / f"r{r}", *(("head", "here") if ranks > 1 else ()))
                 for r in range(ranks)], time.monotonic(), listener)


def _late(logs: Logs, items: list, after_s: float) -> None:
    def feed() -> None:
        time.sleep(after_s)
        for item in items:
            logs.lines.put(item)

    threading.Thread(target=feed, daemon=True).start()


def _drained(logs: Logs, down: set[int]) -> bool:
    """Run drain in a thread; True when it returned on its own. DRAIN_S is patched far away by the tests, so
    returning says the followers of the down ranks ended, not that a deadline fired (a liveness bound, not a
    timing window: a loaded machine can delay the feeding thread by seconds)."""
    runner = threading.Thread(target=logs.drain, args=(down,), daemon=True)
    runner.start()
    runner.join(120)
    logs.close()
    return not runner.is_alive()


@pytest.fixture(autouse=True)
def _no_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logfollow, "DRAIN_S", 1e6)


def test_single_node_drain_waits_for_a_lagging_follower(tmp_path: Path) -> None:
    seen: list[str] = []
    logs = _logs(tmp_path, 1, lambda e: seen.append(e.line))
    _late(logs, [(0, "error: failed to start"), (0, None)], 1.5)
    assert _drained(logs, {0})
    assert seen == ["error: failed to start"]
    assert (tmp_path / "r0").read_text() == "error: failed to start\n"


def test_single_node_drain_returns_at_once_when_the_log_had_ended(tmp_path: Path) -> None:
    logs = _logs(tmp_path, 1, lambda e: None)
    logs.ended.add(0)
    assert _drained(logs, {0})


def test_multi_rank_drain_waits_for_the_down_ranks_only(tmp_path: Path) -> None:
    seen: list[tuple[int, str]] = []
    logs = _logs(tmp_path, 2, lambda e: seen.append((e.rank, e.line)))
    logs.lines.put((0, "head still loading"))
    _late(logs, [(1, "error: failed to start"), (1, None)], 1.5)
    assert _drained(logs, {1})  # rank 0 (still running, its log never ends) is not waited for
    assert seen == [(0, "head still loading"), (1, "error: failed to start")] and logs.ended == {1}


def test_the_drain_gives_up_at_its_deadline_when_a_follower_never_ends(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logfollow, "DRAIN_S", 0.2)
    logs = _logs(tmp_path, 1, lambda e: None)
    assert _drained(logs, {0}) and logs.ended == set()
