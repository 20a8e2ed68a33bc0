"""Byte accounting for long transfers: done/total, a smoothed rate and an ETA. Pure, thread-safe.

The core measures; front ends only render. Downloads report bytes from several worker threads,
so every update takes the lock; the rate is computed over a sliding window (not since the start)
so that a stall or a burst shows within seconds.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 8.0


@dataclass(frozen=True)
class Rate:
    done: int
    total: int | None
    rate_bps: float | None  # None until two samples a measurable time apart exist
    eta_s: float | None  # None when the rate or the total is unknown

    @property
    def fraction(self) -> float | None:
        return None if not self.total else min(1.0, self.done / self.total)


class Meter:
    """Counts bytes; `reading()` says how fast and how long is left."""

    def __init__(self, total: int | None = None, done: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self.total = total
        self._done = done
        self._samples: deque[tuple[float, int]] = deque([(clock(), done)])

    def add(self, n: int) -> None:
        with self._lock:
            self._done = max(0, self._done + n)
            now = self._clock()
            self._samples.append((now, self._done))
            while len(self._samples) > 2 and now - self._samples[0][0] > WINDOW_S:
                self._samples.popleft()

    @property
    def done(self) -> int:
        with self._lock:
            return self._done

    def reading(self) -> Rate:
        with self._lock:
            done = self._done
            (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
            now = self._clock()
        span = max(now, t1) - t0
        rate = (d1 - d0) / span if span >= 0.2 else None
        if rate is not None and rate < 0:
            rate = 0.0
        eta = None
        if rate and self.total is not None:
            eta = max(0.0, (self.total - done) / rate)
        return Rate(done, self.total, rate, eta)


def human_bytes(n: float | None) -> str:
    """1.5 GB, 312.0 MB, 12 B (decimal units, as disks and the Hub count)."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"
