"""The container runtime: one Docker daemon, with our errors and our labels (protocol.ContainerRuntime).

`DockerRuntime` is its resources put together (containers, images, logs: one mixin each, as docker-py's own
APIClient is built) over the one client (client.DaemonClient). Opening one connects and pings; a daemon that
cannot be reached is told apart here (errors.classify_connect_error), before any work starts.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any

from metralectl.seams.docker.client import connect
from metralectl.seams.docker.containers import ContainersMixin
from metralectl.seams.docker.endpoints import Endpoint, resolve_endpoint
from metralectl.seams.docker.errors import CONNECT_TIMEOUT_S, DockerUnavailable, classify_connect_error
from metralectl.seams.docker.images import ImagesMixin
from metralectl.seams.docker.logs import LogsMixin

if TYPE_CHECKING:
    from metralectl.seams.docker.protocol import ContainerRuntime


class DockerRuntime(ContainersMixin, ImagesMixin, LogsMixin):
    """Containers and images through the Docker Engine API, with our errors and our labels."""

    def __init__(self, endpoint: Endpoint | None = None, timeout: float = 30.0,
                 connect_timeout: float = CONNECT_TIMEOUT_S) -> None:
        self.endpoint = endpoint or resolve_endpoint()
        try:
            self.api = connect(self.endpoint, connect_timeout)
            self.api.ping()
        except DockerUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - every way of failing to connect is classified
            raise classify_connect_error(self.endpoint, exc) from None
        self.api.timeout = timeout

    # --- the daemon -----------------------------------------------------------------------------------------
    def server_version(self) -> str:
        return str(self._call(self.api.version).get("Version", "?"))

    def info(self) -> dict[str, Any]:
        return dict(self._call(self.api.info))

    def daemon_identity(self) -> tuple[str, str, str]:
        """(identity, host name, CPU architecture) of the daemon this endpoint reaches. The identity is
        the daemon ID with its host name and root dir: Docker 20.10 derives the ID from /etc/docker/key.json,
        which machines cloned from one image share."""
        info = self.info()
        identity = f"{info.get('ID') or '?'}|{info.get('Name') or '?'}|{info.get('DockerRootDir') or '?'}"
        return identity, str(info.get("Name") or "?"), str(info.get("Architecture") or "")

    # --- the connection -------------------------------------------------------------------------------------
    def close(self) -> None:
        self.api.close()

    def __enter__(self) -> DockerRuntime:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def container_pids(runtime: ContainerRuntime, name_or_id: str) -> set[int]:
    """Host PIDs of a running container's processes (empty when it is not running)."""
    return runtime.container_pids(name_or_id)


def open_runtime(endpoint: Endpoint | None = None, *, timeout: float = 30.0) -> ContainerRuntime:
    """A connected runtime for `endpoint` (default: DOCKER_HOST / the current context / the default socket; the
    process endpoint, process://local, is this machine's engines run as host processes: seams/process).
    Use it as a context manager, so the connection is closed on every path: `with open_runtime() as rt:`."""
    if endpoint is not None and endpoint.is_process:
        from metralectl.seams.process.runtime import ProcessRuntime

        return ProcessRuntime(endpoint)
    return DockerRuntime(endpoint, timeout=timeout)
