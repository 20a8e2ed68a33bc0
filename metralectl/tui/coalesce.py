"""Thread → UI hand-over that cannot flood the event loop.

A producer thread pushes items as fast as they come (log lines, telemetry views); the UI is told
"there is something" with at most one notification in flight. When the UI drains, it takes
everything pushed so far in one batch, so a burst of 2,000 log lines costs one message and one
widget update, not 2,000.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Coalescer(Generic[T]):
    def __init__(self, notify: Callable[[], object], maxlen: int | None = None) -> None:
        """notify: called (on the producer's thread) when the buffer goes from drained to non-empty.
        maxlen: keep only the newest items; older ones are counted in `dropped`."""
        self._notify = notify
        self._items: collections.deque[T] = collections.deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self._pending = False
        self.dropped = 0
        self.pushed = 0

    def push(self, item: T) -> None:
        self.extend((item,))

    def extend(self, items: Iterable[T]) -> None:
        with self._lock:
            before = len(self._items)
            added = 0
            for item in items:
                self._items.append(item)
                added += 1
            self.pushed += added
            maxlen = self._items.maxlen
            if maxlen is not None and before + added > maxlen:
                self.dropped += before + added - maxlen
            if self._pending or not self._items:
                return
            self._pending = True
        self._notify()

    def drain(self) -> list[T]:
        """Everything pushed since the last drain (oldest first); re-arms the notification."""
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._pending = False
            return items


class Throttle:
    """Run `callback` on the UI thread at most once per `interval_s`: a request inside the interval
    schedules one run at its end (on `node`'s timers), later requests until then are absorbed."""

    def __init__(self, node: Any, interval_s: float, callback: Callable[[], None]) -> None:
        self._node = node
        self.interval_s = interval_s
        self._callback = callback
        self._last = 0.0
        self._scheduled = False

    def request(self) -> None:
        wait = self._last + self.interval_s - time.monotonic()
        if wait > 0:
            if not self._scheduled:
                self._scheduled = True
                self._node.set_timer(wait, self._run)
            return
        self._run()

    def _run(self) -> None:
        self._scheduled = False
        self._last = time.monotonic()
        self._callback()
