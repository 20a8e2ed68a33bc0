"""A booting launch's engine logs: every rank's container followed in its own thread into one queue.

Each line is cleaned and written to the rank's kept log, read by the rank's BootLog (phases, the ready
line, failure signatures) and passed on as a LogLine (and a Phase when it starts one). A single-rank
launch is the one-rank case: its events carry no rank. After a container is found down, `drain` takes
the lines its follower still holds, so the diagnosis sees the engine's last words.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from metralectl.errors import MetralError
from metralectl.lifecycle.boot import BootLog, message_of
from metralectl.lifecycle.events import Listener, LogLine, Phase
from metralectl.seams.docker.protocol import ContainerRuntime

DRAIN_S = 5.0  # after a container is down: how long its last log lines may take to arrive


@dataclass
class Watched:
    """One started rank, as the waiting loop sees it."""

    rank: int
    runtime: ContainerRuntime
    container_id: str
    boot: BootLog
    log_path: Path
    role: str = ""  # "head" | "worker" in a multi-rank launch; "" for a single rank
    where: str = ""  # its node: "this machine", "tcp://10.77.0.2:2375 (context spark2)", ...

    @property
    def label(self) -> str:
        return rank_label(self.rank, self.role, self.where)


def rank_label(rank: int, role: str, where: str) -> str:
    """How messages name a rank: "rank 1 (worker) on tcp://…"; empty for a single rank (no role)."""
    return f"rank {rank} ({role}) on {where}" if role else ""


class Logs:
    """The followed logs of a launch's ranks. `phases`: seconds from `started` to each phase's first line
    (the head's by name, another rank's as "rank1:rendezvous"); `ended`: ranks whose log reached its end."""

    def __init__(self, ranks: Sequence[Watched], started: float, on_event: Listener) -> None:
        self.ranks = {r.rank: r for r in ranks}
        self.tagged = len(ranks) > 1  # a multi-rank launch names each line's rank
        self.started = started
        self.on_event = on_event
        self.lines: queue.Queue[tuple[int, str | None]] = queue.Queue()
        self.phases: dict[str, float] = {}
        self.ended: set[int] = set()
        self._stop = threading.Event()
        self._fds = {r.rank: os.open(r.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) for r in ranks}

    def follow(self) -> None:
        for watched in self.ranks.values():
            threading.Thread(target=self._follow, args=(watched,), daemon=True, name=f"log-r{watched.rank}").start()

    def close(self) -> None:
        self._stop.set()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def take(self, wait_s: float) -> bool:
        """Take the next line, waiting up to wait_s; True when it was one (progress), not an end or nothing."""
        try:
            rank, line = self.lines.get(timeout=wait_s)
        except queue.Empty:
            return False
        if line is None:
            self.ended.add(rank)
            return False
        if not line:
            return False
        self._take(rank, line, time.monotonic() - self.started)
        return True

    def drain(self, down: set[int]) -> None:
        """Take the lines the followers still hold: until the followers of the ranks that are down have reached
        the end of their logs (a remote daemon's stream can lag the container's exit by more than a second on a
        loaded machine), at most DRAIN_S. Phases are not read any more: the boot is over."""
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            try:
                rank, line = self.lines.get(timeout=0.05)
            except queue.Empty:
                if down <= self.ended:
                    return
                continue
            if line is None:
                self.ended.add(rank)
            elif line:
                self._write(rank, line)

    def _write(self, rank: int, raw: str) -> str | None:
        boot = self.ranks[rank].boot
        phase = boot.feed(raw)
        clean = boot.tail[-1]
        if rank in self._fds:
            os.write(self._fds[rank], (clean + "\n").encode())
        self.on_event(LogLine(clean, rank if self.tagged else None))
        return phase

    def _take(self, rank: int, raw: str, elapsed: float) -> None:
        phase = self._write(rank, raw)
        if phase is None:
            return
        key = phase if rank == 0 else f"rank{rank}:{phase}"
        if key not in self.phases:
            self.phases[key] = elapsed
            boot = self.ranks[rank].boot
            self.on_event(Phase(phase, message_of(boot.tail[-1], boot.contract.log_prefix), elapsed,
                                rank if self.tagged else None))

    def _follow(self, watched: Watched) -> None:
        try:
            for line in watched.runtime.follow_logs(watched.container_id, stop=self._stop):
                self.lines.put((watched.rank, line))
                if self._stop.is_set():
                    break
        except MetralError:
            pass
        finally:
            self.lines.put((watched.rank, None))
