"""The gateway's own time per relayed request, measured inside it, so that its cost is a number the engine's
noise does not touch (benchmarks/gateway_overhead.py reads it; docs/gateway.md says how).

Off unless METRALECTL_GATEWAY_TIMING names a file when the gateway starts: then each relayed request keeps
    up_ns      from the read of its last byte to its bytes handed to the engine's socket (its head and body
               parsed, routing, JSON, a pooled or new connection, the head written; and any wait in a model's queue
               while it loads, so a benchmark measures a model already served)
    first_ns   from the engine's first body piece read to that piece handed to the client's socket
    pieces     every later piece's read-to-client-write time (their count, sum and worst)
    resent     true when it was written again on a new connection: the kept one it went on first had been closed
               by the engine (its up_ns then holds that round trip too)
    tasked     true when it was sent from its connection's task, a turn of the event loop after its read (a model
               loading, no connection made at once: server.Gateway.arrived says when), not from the read callback
    up_cpu_ns  the gateway thread's CPU time over up_ns (time.thread_time_ns from the read to the send): well below
               up_ns, the thread stood still (another thread held the interpreter, or the kernel ran something else)
and each window of the gateway's own periodic work (`{"window": kind, "at_ns", "ns"}`: `lifecycle`, the poll of the
lock and the swap journal; `scan`, the engines' table, on a thread), so a slow request can be set against them.
and the gateway writes them as JSON lines to that file as it stops (nothing is written while it serves: the
relay's path stays free of file I/O). Off, the relay pays one `is None` test per piece.
What it cannot see: the event loop's wake-up after a socket becomes readable (shared with every asyncio
server), and a stop of the whole process before a request's last byte is read; the benchmark's paired
client-side figure includes both. One such stop it names: each garbage collection (`watch_collections`: a line
`{"gc": generation, "at_ns", "pause_ns"}` per collection, beside the requests' lines), which holds every thread of
the gateway while it walks the heap (loops.settle_heap says why the heap is frozen).
"""

from __future__ import annotations

import gc
import json
import os
import time
from pathlib import Path

ENV = "METRALECTL_GATEWAY_TIMING"
ON = [False]  # the time is kept (the server sets it as it starts): the read callback also notes its CPU time
_records: list[tuple[int, int, int, list[int], bool, int, bool]] = []  # (received at, monotonic ns; up_ns; first_ns;
# later pieces; resent; up_cpu_ns, -1 unknown; tasked)
_windows: list[tuple[int, int, str]] = []  # the gateway's periodic work: (its start, perf_counter ns; ns; kind)
_pauses: list[tuple[int, int, int]] = []  # each garbage collection: (its start, perf_counter ns; generation; ns)
_collecting = [0]  # the running collection's start (gc calls back from one thread at a time: it holds the GIL)


def target() -> Path | None:
    """The file to write when the gateway stops (read once by the server as it starts)."""
    value = os.environ.get(ENV, "").strip()
    return Path(value) if value else None


def now() -> int:
    return time.perf_counter_ns()


def cpu() -> int:
    return time.thread_time_ns()


def keep(received: int, sent: int, pieces: list[int], resent: bool = False, up_cpu: int = -1,
         tasked: bool = False) -> None:
    """One relayed request: `received`/`sent` from now(); pieces: each body piece's read-to-write ns, in order;
    resent: sent again on a new connection after the kept one was found closed; up_cpu: the thread's CPU time from
    its read to its send (cpu()); tasked: sent from its connection's task."""
    _records.append((received, sent - received, pieces[0] if pieces else 0, pieces[1:], resent, up_cpu, tasked))


def window(kind: str, started: int) -> None:
    """A stretch of the gateway's own periodic work, from `started` (now()) to now."""
    _windows.append((started, now() - started, kind))


def _on_collection(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _collecting[0] = time.perf_counter_ns()
    else:
        _pauses.append((_collecting[0], info.get("generation", -1), time.perf_counter_ns() - _collecting[0]))


def watch_collections() -> None:
    """Keep each garbage collection's pause from here on (the gateway, from its start while its time is kept)."""
    if _on_collection not in gc.callbacks:
        gc.callbacks.append(_on_collection)


def unwatch_collections() -> None:
    """No more pauses kept (the gateway, as it stops)."""
    if _on_collection in gc.callbacks:
        gc.callbacks.remove(_on_collection)


def dump(path: Path) -> int:
    """Writes (appends) every kept request as a JSON line; returns how many. `at_ns` is CLOCK_MONOTONIC, which a
    benchmark on the same machine compares with its own phases."""
    offset = time.monotonic_ns() - time.perf_counter_ns()  # both CLOCK_MONOTONIC on Linux: 0 there; kept general
    with open(path, "a", encoding="utf-8") as out:
        for received, up, first, later, resent, up_cpu, tasked in _records:
            out.write(json.dumps({"at_ns": received + offset, "up_ns": up, "first_ns": first,
                                  "pieces": len(later), "pieces_sum_ns": sum(later),
                                  "pieces_max_ns": max(later, default=0), "resent": resent,
                                  "up_cpu_ns": up_cpu, "tasked": tasked}) + "\n")
        for started, generation, pause in _pauses:
            out.write(json.dumps({"gc": generation, "at_ns": started + offset, "pause_ns": pause}) + "\n")
        for started, took, kind in _windows:
            out.write(json.dumps({"window": kind, "at_ns": started + offset, "ns": took}) + "\n")
    count = len(_records)
    _records.clear()
    _pauses.clear()
    _windows.clear()
    return count
