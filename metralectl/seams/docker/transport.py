"""The fast transport under the Docker client: GETs of the Engine API over a local unix socket, with http.client.

Importing docker-py (requests, urllib3, paramiko for ssh://, cryptography) costs more than the rest of `ps`
together, and `ps` only reads a few JSON documents. For a daemon on a local socket the client (client.py)
sends those reads here: the same URLs docker-py asks (under the API version the daemon reports), one
kept-alive connection. What comes back is the daemon's JSON, a `Refused` for an answer other than 2xx (as
docker-py words it), or the socket's own error (OSError, http.client.HTTPException) for the client to
classify. Writes, streams and every other endpoint go through docker-py, in the same client.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse
from typing import Any

from metralectl.seams.docker.errors import Refused

PREFIX = "http+docker://localhost"  # how docker-py names a unix-socket daemon in its URLs and errors
# The most of one answer kept: a container list of a thousand containers with their labels is a few MB; what
# listens on the socket is read as data, and a socket that never ends its answer must not take the memory.
ANSWER_CAP = 64 * 1024 * 1024


class AnswerTooLarge(http.client.HTTPException):
    """What answered on the daemon's socket sent more than ANSWER_CAP bytes for one request."""

    def __init__(self, path: str, cap: int) -> None:
        super().__init__(f"the answer to GET {path} is over {cap // (1024 * 1024)} MiB")
        self.path, self.cap = path, cap


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


class SocketReader:
    """GET /PATH of a daemon at unix:///SOCKET: its JSON (text when it is not JSON)."""

    def __init__(self, url: str, timeout: float | None) -> None:
        self._path = url[len("unix://"):]
        self._timeout = timeout
        self._conn: _UnixConnection | None = None
        self._version: str | None = None  # as docker-py's version="auto": what the daemon says it speaks
        self._lock = threading.Lock()  # one kept-alive connection; callers may share the runtime across threads

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

    def get(self, path: str, params: dict[str, Any] | None = None, *, versioned: bool = True) -> object:
        """The answer to GET path (under /vVERSION unless not versioned), parameters in docker-py's encoding."""
        if params:
            path += "?" + urllib.parse.urlencode(params)
        with self._lock:
            if versioned and self._version is None:
                answer = self._fetch("/version")
                self._version = str(answer["ApiVersion"]) if isinstance(answer, dict) else "?"
            return self._fetch(f"/v{self._version}{path}" if versioned else path)

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _fetch(self, path: str) -> object:
        for attempt in (1, 2):
            reused = self._conn is not None
            if self._conn is None:
                self._conn = _UnixConnection(self._path, self._timeout)
            try:
                self._conn.request("GET", path, headers={"User-Agent": "metralectl"})
                reply = self._conn.getresponse()
                body = reply.read(ANSWER_CAP + 1)
                if len(body) > ANSWER_CAP:
                    self._drop()  # the rest is never read: the connection cannot be used again
                    raise AnswerTooLarge(path.split("?", 1)[0], ANSWER_CAP)
                break
            except AnswerTooLarge:
                raise
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                if reused and attempt == 1 and isinstance(exc, (http.client.RemoteDisconnected, ConnectionResetError,
                                                                BrokenPipeError)):
                    continue  # the daemon closed the kept-alive connection: a new one, as urllib3 does
                raise
        if reply.will_close:
            self._drop()
        if not 200 <= reply.status < 300:
            raise refused(reply.status, reply.reason, PREFIX + path, body)
        if (reply.getheader("Content-Type") or "").startswith("application/json"):
            return json.loads(body)
        return body.decode("utf-8", "replace")

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def quote(value: str) -> str:
    return urllib.parse.quote(value, safe="/:")  # docker-py's _url


def convert_filters(filters: dict[str, Any]) -> str:
    """docker.utils.convert_filters."""
    result = {}
    for key, value in filters.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        if not isinstance(value, list):
            value = [value]
        result[key] = [str(v) if not isinstance(v, str) else v for v in value]
    return json.dumps(result)


def refused(status: int, reason: str, url: str, body: bytes) -> Refused:
    """The daemon's non-2xx answer, read as docker-py reads it (create_api_error_from_http_exception): the
    explanation is the JSON's `message`, else the body's text; the wording is APIError's."""
    text = body.decode("utf-8", "replace")
    try:
        data = json.loads(text)
        explanation = data["message"] if isinstance(data, dict) and "message" in data else text.strip()
    except ValueError:
        explanation = text.strip()
    kind = "Client" if status < 500 else "Server"
    wording = f"{status} {kind} Error for {url}: {reason}"
    return Refused(status, explanation, f'{wording} ("{explanation}")' if explanation else wording)
