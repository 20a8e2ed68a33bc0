"""One Docker connection for a long-lived watcher (`metralectl top`, the dashboard), instead of one per poll.

`SharedRuntime()` is a runtime factory like `open_runtime`: callers keep writing
`with factory() as runtime:`. What they get is a lease on the one kept connection: leaving the
`with` does not close it. The connection is opened on first use, and dropped (closed) when a call on it
fails to reach the daemon (DockerUnavailable: the daemon restarted or went away), so the next lease
opens a new one. `close()` ends it. Thread-safe: the dashboard's workers poll from several threads; the
runtime underneath is itself safe to share (client.DaemonClient: the socket reader locks its one kept-alive
connection, docker-py's requests pool hands each thread its own socket).

Not for the long actions (run, swap, stop, pull): they change the client's timeout while they run
(`api.timeout` for pulls and waits), which a concurrent poll would inherit; they open
their own connection, as the CLI does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from metralectl.seams.docker.protocol import ContainerRuntime


def _open_default() -> ContainerRuntime:
    from metralectl.seams.docker.runtime import open_runtime  # looked up at call time (tests replace it)

    return open_runtime()


class SharedRuntime:
    def __init__(self, factory: Callable[[], ContainerRuntime] | None = None) -> None:
        self._factory = factory or _open_default
        self._runtime: ContainerRuntime | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.opened = 0  # connections opened so far (tests and diagnostics)

    def __call__(self) -> ContainerRuntime:
        """A lease on the kept connection (opened now if there is none; raises what opening raises)."""
        with self._lock:
            if self._closed:  # a straggling poll after the end must not open a connection nobody closes
                from metralectl.errors import MetralError

                raise MetralError("the Docker connection was closed (the watcher is ending)")
            if self._runtime is None:
                self._runtime = self._factory()
                self.opened += 1
            runtime = self._runtime
        return cast("ContainerRuntime", _Lease(self, runtime))

    def drop(self, runtime: ContainerRuntime) -> None:
        """Forget (and close) `runtime` if it is still the kept one: the next lease reconnects."""
        with self._lock:
            if self._runtime is not runtime:
                return  # another thread already replaced it
            self._runtime = None
        _close_quietly(runtime)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            runtime, self._runtime = self._runtime, None
        if runtime is not None:
            _close_quietly(runtime)


def _close_quietly(runtime: ContainerRuntime) -> None:
    try:
        runtime.close()
    except Exception:  # noqa: BLE001 - a connection that is already broken may fail to close; it is gone either way
        pass


def _is_connection_failure(exc: BaseException) -> bool:
    from metralectl.seams.docker.errors import DockerUnavailable  # no docker-py import: the module is light

    return isinstance(exc, DockerUnavailable)


class _Lease:
    """The kept runtime, minus closing: every method is the runtime's; a DockerUnavailable from one drops
    the connection (a daemon refusal such as "no such container" does not: the connection is fine)."""

    def __init__(self, owner: SharedRuntime, runtime: ContainerRuntime) -> None:
        self._owner = owner
        self._runtime = runtime
        self.endpoint = runtime.endpoint

    # object, not Any: a lease is only ever seen as the ContainerRuntime it is cast to; this is the proxying
    def __getattr__(self, name: str) -> object:
        attr = getattr(self._runtime, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> object:
            try:
                return attr(*args, **kwargs)
            except Exception as exc:
                if _is_connection_failure(exc):
                    self._owner.drop(self._runtime)
                raise

        return call

    def close(self) -> None:
        """Borrowed: the SharedRuntime closes it."""

    def __enter__(self) -> _Lease:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None and _is_connection_failure(exc):
            self._owner.drop(self._runtime)
