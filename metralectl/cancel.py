"""Cooperative cancellation: a token the work checks where stopping is safe, never an exception pushed into
a thread from outside.

A change of what is served is asked to stop through a `CancelToken`, whoever asks: the CLI's Ctrl-C or
SIGTERM (its handler only cancels the token: cli/serve_cmds._ctrl_c_cancels), the dashboard's Cancel (its
worker's thread), the agent's job cancel (the job's thread). Whoever runs the work binds the token to
that thread (`with token.bound():`), and the lifecycle checks it at its phase boundaries (`checkpoint()`)
and in its waits (`sleep()`, or a wait on `token.event`), which return within their short tick once the
token is cancelled. A cancelled check raises `Cancelled`, a KeyboardInterrupt, so the cleanup Ctrl-C runs
(a half-started container removed, a swap's journal kept for the repair) runs for it too.

`Cancelled` is raised once per token: the cleanup after it may pass checkpoints of its own and must not be
cut short (after that, `sleep()` sleeps its whole length again).

The token is found through a context variable, not passed down every signature between a front end and
the wait it must end (launch → preflight → stage → pull, swap → drain/stop/boot/restore, stop → the memory
wait, ...): it is bound once by whoever runs the work, and every wait below honours it. With no token bound
(a command that leaves Ctrl-C to interrupt it where it lands), checkpoint() does nothing and sleep() sleeps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class Cancelled(KeyboardInterrupt):
    """The work was cancelled (Ctrl-C in the CLI, the dashboard's Cancel, the agent's job cancel): a
    KeyboardInterrupt, so every cleanup written for Ctrl-C runs for it."""

    def __init__(self, reason: str = "cancelled") -> None:
        super().__init__(reason)
        self.reason = reason


class CancelToken:
    """A threading.Event and the reason it was set; raised into the work once, at its next check."""

    def __init__(self) -> None:
        self.event = threading.Event()  # set by cancel(): a wait on it ends at once
        self.reason = ""
        self._raised = False
        self._lock = threading.RLock()  # re-entrant: a signal handler (the CLI's Ctrl-C) may cancel mid-check

    @property
    def cancelled(self) -> bool:
        return self.event.is_set()

    @property
    def raised(self) -> bool:
        """Cancelled has been raised into the work: what runs now is its cleanup."""
        return self._raised

    def cancel(self, reason: str = "cancelled") -> bool:
        """Ask the work to stop; True the first time (a second call keeps the first reason)."""
        with self._lock:
            if self.event.is_set():
                return False
            self.reason = reason
            self.event.set()
            return True

    def check(self) -> None:
        """Raise Cancelled when cancel() was called and it has not been raised yet."""
        if not self.event.is_set():
            return
        with self._lock:
            if self._raised:
                return
            self._raised = True
        raise Cancelled(self.reason or "cancelled")

    def sleep(self, seconds: float) -> None:
        """Sleep, ending at once (with Cancelled) when the token is cancelled; a cleanup's sleep is whole."""
        if self._raised:
            time.sleep(seconds)
            return
        self.event.wait(max(0.0, seconds))
        self.check()

    @contextmanager
    def bound(self) -> Iterator[CancelToken]:
        """Make this the token checkpoint() and sleep() see on this thread (and in what it runs: asyncio
        tasks copy it) until the block ends."""
        reset = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(reset)


_current: ContextVar[CancelToken | None] = ContextVar("metralectl_cancel_token", default=None)


def current() -> CancelToken | None:
    """The token bound to this thread's work, or None (nothing to check: Ctrl-C interrupts where it lands)."""
    return _current.get()


def checkpoint() -> None:
    """A phase boundary: raise Cancelled here when the work's token was cancelled."""
    token = _current.get()
    if token is not None:
        token.check()


def sleep(seconds: float) -> None:
    """time.sleep that a cancel ends at once (Cancelled)."""
    token = _current.get()
    if token is None:
        time.sleep(seconds)
    else:
        token.sleep(seconds)
