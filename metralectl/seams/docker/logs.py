"""A container's output on a Docker daemon: its last lines, and its lines as they are written (followed until it
exits, or until the caller stops)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from metralectl.seams.docker.client import LogStream, Resource, connect
from metralectl.seams.docker.errors import Refused, refused_failure


class LogsMixin(Resource):
    """The runtime's log calls (runtime.DockerRuntime)."""

    def log_tail(self, name_or_id: str, lines: int = 50) -> list[str]:
        try:
            raw: bytes = self.api.logs(name_or_id, stdout=True, stderr=True, tail=lines)
        except Refused as exc:
            if exc.not_found:
                return []
            raise refused_failure(exc) from None
        return raw.decode("utf-8", "replace").splitlines()

    def follow_logs(self, name_or_id: str, *, tail: int | str = "all", stop: threading.Event | None = None,
                    since: int | None = None) -> Iterator[str]:
        """Lines as they are written; ends when the container exits or `stop` is set.

        docker-py's followed streams read without a socket timeout, so a daemon that keeps the
        stream open after the container is gone would hang the reader: a watchdog closes it.
        """
        try:
            stream = self.api.logs_stream(name_or_id, stdout=True, stderr=True, tail=tail, since=since)
        except Refused as exc:
            if exc.not_found:
                return
            raise refused_failure(exc) from None
        finished = threading.Event()
        watchdog = threading.Thread(target=self._watch_stream, args=(name_or_id, stream, finished, stop), daemon=True)
        watchdog.start()
        buffer = b""
        try:
            for chunk in stream:
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                for line in complete:
                    yield line.decode("utf-8", "replace").rstrip("\r")
        except Exception:  # noqa: BLE001 - a stream closed under us by the watchdog ends the iteration
            pass
        finally:
            finished.set()
            stream.close()
        if buffer:
            yield buffer.decode("utf-8", "replace")

    def _watch_stream(self, name_or_id: str, stream: LogStream, finished: threading.Event,
                      stop: threading.Event | None) -> None:
        watcher = connect(self.endpoint, 5)  # its own connection: the stream holds the other
        try:
            while not finished.is_set():
                if stop is not None and stop.is_set():
                    break
                try:
                    state = (watcher.inspect_container(name_or_id).get("State") or {}).get("Status")
                except Exception:  # noqa: BLE001 - gone or daemon gone: either way, stop reading
                    state = "gone"
                if state not in ("running", "created", "restarting", "paused"):
                    finished.wait(0.5)  # let the daemon flush the last lines first
                    break
                finished.wait(0.25)
        finally:
            watcher.close()
            if not finished.is_set():
                stream.close()
