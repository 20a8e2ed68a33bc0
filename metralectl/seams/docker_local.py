"""docker-py's low-level client for a daemon on a local unix socket, minus docker-py for what `ps` asks.

Importing docker-py (requests, urllib3, paramiko for ssh://, cryptography) costs more than the rest
of `ps` together, and `ps` only reads a few JSON documents. LocalAPI answers those reads (version,
ping, info, containers, inspect_container, inspect_image) over the socket with http.client, as
docker-py would: the same URLs under the API version the daemon reports, the same results, the same
exceptions (docker.errors for the daemon's refusals, requests' ConnectionError for a lost socket;
both imported only when raised). Every other attribute is a real docker-py client's, made on first
use with the same settings, so writes, streams and anything new go through docker-py as before.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse
from typing import TYPE_CHECKING, Any, Callable, cast

if TYPE_CHECKING:
    from docker import APIClient

PREFIX = "http+docker://localhost"  # how docker-py names a unix-socket daemon in its URLs and errors


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class LocalAPI:
    """The part of docker.APIClient that `ps` uses, for unix:///PATH; the rest delegated to docker-py."""

    def __init__(self, url: str, timeout: float | None, docker_client: Callable[[], APIClient]) -> None:
        self._path = url[len("unix://"):]
        self._timeout = timeout
        self._make_docker_client = docker_client
        self._docker: APIClient | None = None
        self._conn: _UnixConnection | None = None
        self._version: str | None = None  # as docker-py's version="auto": what the daemon says it speaks
        self._lock = threading.Lock()  # one kept-alive connection; callers may share the runtime across threads
        self._docker_lock = threading.Lock()  # docker-py's client is built once, on the first call it answers

    # --- docker-py's names -----------------------------------------------------------------------
    @property
    def timeout(self) -> float | None:
        return self._timeout

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        self._timeout = value
        if self._conn is not None:
            self._conn.timeout = value
            if self._conn.sock is not None:
                self._conn.sock.settimeout(value)
        if self._docker is not None:
            self._docker.timeout = value

    def __getattr__(self, name: str) -> object:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._docker_client(), name)

    def _docker_client(self) -> APIClient:
        client = self._docker
        if client is None:
            with self._docker_lock:  # two threads' first calls (a shared runtime) must not each build one
                if self._docker is None:
                    made = self._make_docker_client()
                    made.timeout = self._timeout
                    self._docker = made
                client = self._docker
        return client

    def version(self, api_version: bool = True) -> dict[str, Any]:
        return cast("dict[str, Any]", self._get("/version", versioned=api_version))  # the daemon's JSON

    def ping(self) -> bool:
        """The connect check: a socket that cannot be reached raises its OSError as is (the caller
        classifies it from the error and the filesystem, without importing docker-py)."""
        return bool(self._get("/_ping", raw_errors=True) == "OK")

    def info(self) -> dict[str, Any]:
        return cast("dict[str, Any]", self._get("/info"))

    def containers(self, all: bool = False, filters: dict[str, Any] | None = None,  # noqa: A002
                   **other: Any) -> list[dict[str, Any]]:
        if other:  # a listing this class does not build: docker-py's
            return cast("list[dict[str, Any]]", self._docker_client().containers(all=all, filters=filters, **other))
        params: dict[str, Any] = {"limit": -1, "all": 1 if all else 0, "size": 0, "trunc_cmd": 0}
        if filters:
            params["filters"] = _convert_filters(filters)
        return cast("list[dict[str, Any]]", self._get("/containers/json?" + urllib.parse.urlencode(params)))

    def inspect_container(self, container: str) -> dict[str, Any]:
        return cast("dict[str, Any]", self._get(f"/containers/{_quote(container)}/json"))

    def inspect_image(self, image: str) -> dict[str, Any]:
        return cast("dict[str, Any]", self._get(f"/images/{_quote(image)}/json"))

    def close(self) -> None:
        with self._lock:
            self._drop()
        if self._docker is not None:
            self._docker.close()

    # --- the wire --------------------------------------------------------------------------------
    def _get(self, path: str, *, versioned: bool = True, raw_errors: bool = False) -> object:
        """The answer's JSON (text when it is not JSON)."""
        with self._lock:
            if versioned and self._version is None:
                self._version = str(cast("dict[str, Any]", self._fetch("/version", raw_errors))["ApiVersion"])
            return self._fetch(f"/v{self._version}{path}" if versioned else path, raw_errors)

    def _fetch(self, path: str, raw_errors: bool) -> object:
        for attempt in (1, 2):
            reused = self._conn is not None
            if self._conn is None:
                self._conn = _UnixConnection(self._path, self._timeout)
            try:
                self._conn.request("GET", path, headers={"User-Agent": "metralectl"})
                reply = self._conn.getresponse()
                body = reply.read()
                break
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                if reused and attempt == 1 and isinstance(exc, (http.client.RemoteDisconnected, ConnectionResetError,
                                                                BrokenPipeError)):
                    continue  # the daemon closed the kept-alive connection: a new one, as urllib3 does
                if raw_errors and isinstance(exc, OSError):
                    raise
                raise _lost(exc) from exc
        if reply.will_close:
            self._drop()
        if not 200 <= reply.status < 300:
            raise _refused(reply.status, reply.reason, PREFIX + path, body)
        if (reply.getheader("Content-Type") or "").startswith("application/json"):
            return json.loads(body)
        return body.decode("utf-8", "replace")

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _quote(value: str) -> str:
    return urllib.parse.quote(value, safe="/:")  # docker-py's _url


def _convert_filters(filters: dict[str, Any]) -> str:
    """docker.utils.convert_filters."""
    result = {}
    for key, value in filters.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        if not isinstance(value, list):
            value = [value]
        result[key] = [str(v) if not isinstance(v, str) else v for v in value]
    return json.dumps(result)


def _lost(exc: BaseException) -> Exception:
    """What requests raises for a socket that failed mid-way (callers catch RequestException)."""
    import requests

    return requests.exceptions.ConnectionError(exc)


def _refused(status: int, reason: str, url: str, body: bytes) -> Exception:
    """What docker-py raises for the daemon's non-2xx answer (APIError, NotFound, ImageNotFound), made by
    docker-py's own function (it raises it; it is returned here to be raised where it happened)."""
    import requests
    from docker.errors import create_api_error_from_http_exception

    response = requests.Response()
    response.status_code, response.reason, response.url = status, reason, url
    response._content = body
    response.encoding = "utf-8"
    kind = "Client" if status < 500 else "Server"
    try:
        create_api_error_from_http_exception(
            requests.exceptions.HTTPError(f"{status} {kind} Error: {reason} for url: {url}", response=response))
    except Exception as exc:  # noqa: BLE001 - the function's whole purpose is to raise it
        return exc
    return RuntimeError(f"docker-py made no error of {status} {reason} for {url}")
