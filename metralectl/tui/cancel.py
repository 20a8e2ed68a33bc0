"""Cancelling a core call that runs on a worker thread, the way Ctrl-C cancels it in the CLI.

The core's lifecycle and transfer code already cleans up on KeyboardInterrupt (a half-started
container is removed, partial downloads are dropped). `Cancelled` is a KeyboardInterrupt, raised
from the event listener the core calls, so the same cleanup runs. A core call that emits no event
for a while (an engine loading silently) gets the exception delivered asynchronously into its
thread after `grace_s`, at the next Python instruction it executes.

It is delivered once, whichever way comes first: the core's cleanup (removing a half-started container)
runs after the exception and may call the listener or take longer than `grace_s`; a second Cancelled
landing there would cut the cleanup short and leave the mess it exists to remove.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Cancelled(KeyboardInterrupt):
    """The operator cancelled the action from the dashboard."""


class CancelToken:
    def __init__(self, grace_s: float = 1.5) -> None:
        self.grace_s = grace_s
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._thread_id: int | None = None
        self._injected = False
        self._delivered = False  # Cancelled has been raised in the bound thread (by check() or injection)
        self._timer: threading.Timer | None = None

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        """Raise Cancelled when cancel() was called (call it from the core's event listener); once only."""
        if not self._event.is_set():
            return
        with self._lock:
            if self._delivered:
                return
            self._delivered = True
        raise Cancelled()

    def cancel(self) -> None:
        if self._event.is_set():
            return
        self._event.set()
        self._timer = threading.Timer(self.grace_s, self._inject)
        self._timer.daemon = True
        self._timer.start()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)

    @contextmanager
    def bound(self) -> Iterator[None]:
        """Mark the current thread as the one running the cancellable call."""
        with self._lock:
            self._thread_id = threading.get_ident()
        try:
            self.check()
            yield
        finally:
            with self._lock:
                tid, self._thread_id = self._thread_id, None
                if self._injected and tid is not None:
                    # the call ended on its own just as the exception was scheduled: withdraw it
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), None)
            if self._timer is not None:
                self._timer.cancel()

    def _inject(self) -> None:
        with self._lock:
            if self._thread_id is None or self._delivered:
                return
            self._injected = self._delivered = True
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._thread_id), ctypes.py_object(Cancelled))
