"""The one client of a Docker daemon's Engine API: docker-py's low-level client, with a faster transport for reads.

Every call the runtime makes (runtime.py and its resource mixins: containers, images, logs) goes through a
`DaemonClient`, under the Engine API's own names. For a daemon on a local unix socket, the reads `ps` needs
(ping, version, info, the container list, inspecting a container or an image) travel over transport.py's
SocketReader, so that `ps` imports no docker-py; everything else, and every call to a remote daemon (ssh://,
tcp:// with TLS), goes through docker-py's APIClient, built on first use. Either way what comes back is the
daemon's JSON, and what goes wrong is ours: the daemon's refusal is a `Refused` (errors.py: status and the
daemon's words, whichever transport carried it) and a connection that fails is a DockerUnavailable
(errors.classify_connect_error). Nothing outside this package sees docker-py's or requests' exceptions.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from metralectl.seams.docker.endpoints import Endpoint
from metralectl.seams.docker.errors import DockerUnavailable, Refused, classify_connect_error, refused_failure
from metralectl.seams.docker.transport import AnswerTooLarge, SocketReader, convert_filters, quote

if TYPE_CHECKING:  # docker-py is imported lazily at run time (cold start); this is for the checker only
    from docker import APIClient

T = TypeVar("T")


class LogStream(Protocol):
    def __iter__(self) -> Iterator[bytes]: ...
    def close(self) -> None: ...


class DaemonClient:
    """One daemon's Engine API. Thread-safe as its transports are (the socket reader locks its connection,
    docker-py's pool hands each thread a socket of its own); `timeout` applies to both."""

    def __init__(self, endpoint: Endpoint, timeout: float | None, *, socket_reads: bool = True) -> None:
        self.endpoint = endpoint
        self._timeout = timeout
        local = socket_reads and endpoint.url.startswith("unix:///")
        self._reader = SocketReader(endpoint.url, timeout) if local else None
        self._docker: APIClient | None = None
        self._docker_lock = threading.Lock()  # docker-py's client is built once, by the first call that needs it

    @property
    def timeout(self) -> float | None:
        return self._timeout

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        self._timeout = value
        if self._reader is not None:
            self._reader.timeout = value
        if self._docker is not None:
            self._docker.timeout = value

    # --- reads: the socket reader where there is one --------------------------------------------------------
    def ping(self) -> bool:
        if self._reader is None:
            return bool(self._py(lambda api: api.ping()))
        return self._read("/_ping") == "OK"

    def version(self) -> dict[str, Any]:
        if self._reader is None:
            return cast("dict[str, Any]", self._py(lambda api: api.version()))
        return cast("dict[str, Any]", self._read("/version"))  # the daemon's JSON

    def info(self) -> dict[str, Any]:
        if self._reader is None:
            return cast("dict[str, Any]", self._py(lambda api: api.info()))
        return cast("dict[str, Any]", self._read("/info"))

    def containers(self, all: bool = False, filters: dict[str, Any] | None = None) -> list[dict[str, Any]]:  # noqa: A002
        if self._reader is None:
            return cast("list[dict[str, Any]]", self._py(lambda api: api.containers(all=all, filters=filters)))
        params: dict[str, Any] = {"limit": -1, "all": 1 if all else 0, "size": 0, "trunc_cmd": 0}  # docker-py's
        if filters:
            params["filters"] = convert_filters(filters)
        return cast("list[dict[str, Any]]", self._read("/containers/json", params))

    def inspect_container(self, container: str) -> dict[str, Any]:
        if self._reader is None:
            return cast("dict[str, Any]", self._py(lambda api: api.inspect_container(container)))
        return cast("dict[str, Any]", self._read(f"/containers/{quote(container)}/json"))

    def inspect_image(self, image: str) -> dict[str, Any]:
        if self._reader is None:
            return cast("dict[str, Any]", self._py(lambda api: api.inspect_image(image)))
        return cast("dict[str, Any]", self._read(f"/images/{quote(image)}/json"))

    # --- everything else: docker-py ---------------------------------------------------------------------------
    def images(self) -> list[dict[str, Any]]:
        return cast("list[dict[str, Any]]", self._py(lambda api: api.images()))

    def remove_image(self, image: str) -> None:
        self._py(lambda api: api.remove_image(image))

    def create_host_config(self, **kwargs: Any) -> dict[str, Any]:
        return cast("dict[str, Any]", self._py(lambda api: api.create_host_config(**kwargs)))

    def create_container(self, **kwargs: Any) -> dict[str, Any]:
        return cast("dict[str, Any]", self._py(lambda api: api.create_container(**kwargs)))

    def start(self, container: str) -> None:
        self._py(lambda api: api.start(container))

    def stop(self, container: str, timeout: int) -> None:
        self._py(lambda api: api.stop(container, timeout=timeout))

    def kill(self, container: str) -> None:
        self._py(lambda api: api.kill(container))

    def remove_container(self, container: str, force: bool = False, v: bool = False) -> None:
        self._py(lambda api: api.remove_container(container, force=force, v=v))

    def wait(self, container: str) -> dict[str, Any] | None:
        """The daemon's answer once the container has stopped; None when none came within the timeout."""
        try:
            return cast("dict[str, Any]", self._docker_client().wait(container))
        except Exception as exc:
            import requests.exceptions

            if isinstance(exc, (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError)):
                return None
            ours = translate(self.endpoint, exc)
            if ours is None:
                raise
            raise ours from None

    def logs(self, container: str, **kwargs: Any) -> bytes:
        """The container's output so far."""
        return cast(bytes, self._py(lambda api: api.logs(container, **kwargs)))

    def logs_stream(self, container: str, **kwargs: Any) -> LogStream:
        """The container's output as it is written (docker-py's followed stream: chunks of bytes, close())."""
        return cast(LogStream, self._py(lambda api: api.logs(container, stream=True, follow=True, **kwargs)))

    def top(self, container: str, ps_args: str) -> dict[str, Any]:
        return cast("dict[str, Any]", self._py(lambda api: api.top(container, ps_args=ps_args)))

    def pull(self, repository: str, tag: str | None, platform: str | None) -> Iterator[dict[str, Any]]:
        """The pull's progress events, decoded; a failure while they stream is ours as well."""
        events = self._py(lambda api: api.pull(repository, tag=tag, stream=True, decode=True, platform=platform))
        try:
            yield from events
        except Exception as exc:
            ours = translate(self.endpoint, exc)
            if ours is None:
                raise
            raise ours from None

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        if self._docker is not None:
            self._docker.close()

    # --- the transports ---------------------------------------------------------------------------------------
    def _read(self, path: str, params: dict[str, Any] | None = None) -> object:
        assert self._reader is not None
        try:
            return self._reader.get(path, params)
        except AnswerTooLarge as big:
            raise DockerUnavailable(
                "answer-too-large", f"what answers at {self.endpoint.url} ({self.endpoint.source}) sent more than "
                f"{big.cap // (1024 * 1024)} MiB for GET {big.path}: not an answer metralectl reads",
                "check that the socket is Docker's own (`docker version`), or point DOCKER_HOST at the daemon") from None
        except (OSError, http.client.HTTPException) as exc:
            raise classify_connect_error(self.endpoint, exc) from None

    def _py(self, call: Callable[[APIClient], T]) -> T:
        try:
            return call(self._docker_client())
        except Exception as exc:
            ours = translate(self.endpoint, exc)
            if ours is None:
                raise
            raise ours from None

    def _docker_client(self) -> APIClient:
        client = self._docker
        if client is None:
            with self._docker_lock:  # two threads' first calls (a shared runtime) must not each build one
                if self._docker is None:
                    import docker

                    url = self.endpoint.url
                    self._docker = docker.APIClient(base_url=url, timeout=self._timeout, version="auto",
                                                    tls=self.endpoint.tls or False,
                                                    use_ssh_client=url.startswith("ssh://"))
                client = self._docker
        return client


def translate(endpoint: Endpoint, exc: Exception) -> Exception | None:
    """docker-py's or requests' exception as ours: the daemon's refusal (APIError) a Refused, a failure to reach
    it a DockerUnavailable; None for any other exception (it is no transport's)."""
    import sys

    errors = sys.modules.get("docker.errors")  # loaded whenever docker-py raised one of its own
    requests = sys.modules.get("requests.exceptions")
    if errors is not None and isinstance(exc, errors.APIError):
        return Refused(exc.status_code, exc.explanation, str(exc))
    if (errors is not None and isinstance(exc, errors.DockerException)) or (
            requests is not None and isinstance(exc, requests.RequestException)):
        return classify_connect_error(endpoint, exc)
    return None


class Resource:
    """What the runtime's resource mixins (containers, images, logs) share: the client, the endpoint, and
    `_call`, which turns the daemon's refusal into a RuntimeFailure with its cause."""

    api: DaemonClient
    endpoint: Endpoint

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except Refused as exc:
            raise refused_failure(exc) from None


def connect(endpoint: Endpoint, timeout: float | None) -> DaemonClient:
    """The client the runtime uses (tests replace it to compare the transports)."""
    return DaemonClient(endpoint, timeout)
