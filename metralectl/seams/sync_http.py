"""`recipes sync` over HTTP: what a release server may do, and the bounds on what it sends.

- Scheme: https anywhere; plain http only to a loopback host (a test server, a local mirror) unless the
  user passed --allow-http. Decided from the URL alone, before any connection or name lookup.
- Redirects: followed by urllib only to https, or to http under the same rule; an https URL is never
  redirected to http (even on loopback), and never to another scheme (file:, ftp:, data:).
- Size: a Content-Length above the asset's cap is refused before the body; the body is read at most
  cap + 1 bytes, whatever the header said (an endless body stops at the cap).
- Time: TIMEOUT_S for each read, and DEADLINE_S for the whole asset (connection, TLS, headers and
  body): a watchdog shuts the connection when the deadline passes, so a server that drips a byte at a
  time cannot hold the sync forever.
"""

from __future__ import annotations

import http.client
import ipaddress
import os
import re
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from metralectl.core.release_archive import ReleaseError
from metralectl.errors import ExitCode
from metralectl.safetext import clean
from metralectl.seams.local_address import holds_address

if TYPE_CHECKING:
    from metralectl.seams.sync_fetch import Progress, Source

TIMEOUT_S = 30.0  # one read, connect or TLS step
DEADLINE_S = 300.0  # one asset, start to end
CHUNK = 1 << 16
_LENGTH_RE = re.compile(r"[0-9]{1,19}")
_KEEP = "nothing was installed; the previous synced recipes stay"


def size_text(limit: int) -> str:
    """A cap for a message: 64 MB, 4 KB, 100 bytes."""
    return f"{limit >> 20} MB" if limit >= 1 << 20 else f"{limit >> 10} KB" if limit >= 1 << 10 else f"{limit} bytes"


def is_loopback(host: str | None) -> bool:
    """Whether a URL's host is this machine, from its text alone (no lookup): localhost, 127/8 or ::1 written
    out (not `foo.localhost`, `127.1` or `0x7f000001`: those would take a resolver's or a parser's word)."""
    if not host:
        return False
    name = host.lower().rstrip(".")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def is_this_machine(host: str | None) -> bool:
    """Whether a URL's host is this machine without asking a resolver: loopback as is_loopback() reads it, this
    machine's own host name, or an IP address holds_address() says is here."""
    if is_loopback(host) or not host:
        return bool(host)
    name = host.lower().rstrip(".").strip("[]")
    return name == socket.gethostname().lower().rstrip(".") or holds_address(name)


def transport_problem(url: str, allow_http: bool, came_from: str | None = None) -> str | None:
    """Why metralectl will not fetch `url` (None: it will). `came_from`: the URL that redirected here."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return f"{clean(url, 200)} is not a URL"
    before = urllib.parse.urlsplit(came_from).scheme if came_from else None
    if parts.scheme not in ("http", "https"):
        return f"a redirect to {clean(url, 200)} (only http and https are fetched)"
    if parts.scheme == "http" and before == "https":
        return f"a redirect from https to plain http ({clean(url, 200)}); metralectl never downgrades"
    if parts.scheme == "http" and not allow_http and not is_loopback(parts.hostname):
        what = f"a redirect to {clean(url, 200)}" if came_from else clean(url, 200)
        return f"{what} is plain http to a host that is not this machine"
    return None


def check_start(url: str, allow_http: bool) -> None:
    why = transport_problem(url, allow_http)
    if why is not None:
        raise ReleaseError(f"refusing {why}", "use https, or pass --allow-http if plain http to that host is "
                                              "what you want (anyone on the way can change what it sends)",
                           exit_code=ExitCode.USAGE)


class _Watch:
    """The sockets of one asset's fetch, shut when its deadline passes (a blocked read then returns)."""

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._fds: list[int] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def add(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._fds.append(os.dup(sock.fileno()))  # a duplicate: TLS takes the original's descriptor over
            if self.expired:
                self._shut(self._fds[-1])
        return sock

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for fd in self._fds:
                self._shut(fd)

    @staticmethod
    def _shut(fd: int) -> None:
        try:
            socket.socket(fileno=os.dup(fd)).shutdown(socket.SHUT_RDWR)  # the socket object closes its own dup
        except OSError:
            pass  # already closed by the other side

    def __enter__(self) -> _Watch:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        with self._lock:
            for fd in self._fds:
                os.close(fd)
            self._fds.clear()


def _watched(base: type[http.client.HTTPConnection], watch: _Watch) -> Callable[..., http.client.HTTPConnection]:
    """`base` whose socket is registered with the watch as soon as it is connected (before TLS)."""
    def factory(*args: Any, **kwargs: Any) -> http.client.HTTPConnection:
        conn = base(*args, **kwargs)
        create = conn._create_connection  # type: ignore[attr-defined]
        conn._create_connection = lambda *a, **k: watch.add(create(*a, **k))  # type: ignore[attr-defined]
        return conn
    return factory


class _Http(urllib.request.HTTPHandler):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self.watch = watch

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched(http.client.HTTPConnection, self.watch), req)


class _Https(urllib.request.HTTPSHandler):
    def __init__(self, watch: _Watch, context: Any) -> None:
        super().__init__(context=context)
        self.watch = watch
        self.ssl_context = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched(http.client.HTTPSConnection, self.watch), req, context=self.ssl_context)


class _Redirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, each target checked by transport_problem before it is requested."""

    max_redirections = 5

    def __init__(self, allow_http: bool) -> None:
        super().__init__()
        self.allow_http = allow_http

    def http_error_302(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                       headers: http.client.HTTPMessage) -> object:
        target = headers.get("location") or headers.get("uri")
        if target:
            try:
                url = urllib.parse.urljoin(req.full_url, str(target))
            except ValueError:
                url = str(target)
            why = transport_problem(url, self.allow_http, came_from=req.full_url)
            if why is not None:
                fp.close()
                raise ReleaseError(f"{clean(req.full_url, 200)} answered with {why}; it was not followed", _KEEP)
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def _opener(source: Source, watch: _Watch) -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(_Http(watch), _Https(watch, source.context), _Redirects(source.allow_http))


def fetch(source: Source, name: str, limit: int, progress: Progress | None = None) -> bytes:
    """One asset of the release under `source` (an http(s) download base), at most `limit` bytes."""
    base = source.location if source.location.endswith("/") else source.location + "/"
    url = urllib.parse.urljoin(base, name)
    request = urllib.request.Request(url, headers={"User-Agent": "metralectl recipes sync"})
    shown = clean(url, 200)
    with _Watch(DEADLINE_S) as watch:
        try:
            data, expected = _download(_opener(source, watch), request, name, limit, progress, watch)
        except urllib.error.HTTPError as exc:
            raise ReleaseError(f"{shown} answered HTTP {exc.code}", "is this the download base of an engine release?",
                               exit_code=ExitCode.UNAVAILABLE if exc.code >= 500 else None) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            if watch.expired:
                raise _late(shown) from None
            reason = getattr(exc, "reason", None) or exc
            raise ReleaseError(f"fetching {shown} failed: {clean(str(reason), 200)}", _KEEP,
                               exit_code=ExitCode.UNAVAILABLE) from None
        if watch.expired:
            raise _late(shown)
    if expected is not None and len(data) != expected:
        raise ReleaseError(f"{name}: the server closed the connection after {len(data)} of {expected} bytes", _KEEP,
                           exit_code=ExitCode.UNAVAILABLE)
    return data


def _late(shown: str) -> ReleaseError:
    return ReleaseError(f"fetching {shown} did not finish within {DEADLINE_S:g} s; the connection was closed",
                        "the server is too slow or holds the connection open; " + _KEEP,
                        exit_code=ExitCode.UNAVAILABLE)


def _download(opener: urllib.request.OpenerDirector, request: urllib.request.Request, name: str, limit: int,
              progress: Progress | None, watch: _Watch) -> tuple[bytes, int | None]:
    with opener.open(request, timeout=TIMEOUT_S) as response:
        if response.status != 200:
            raise ReleaseError(f"{clean(request.full_url, 200)} answered HTTP {response.status}, not 200")
        length = str(response.headers.get("Content-Length") or "").strip()
        expected = int(length) if _LENGTH_RE.fullmatch(length) else None
        if expected is not None and expected > limit:
            raise ReleaseError(f"{name} is {expected} bytes, more than the {size_text(limit)} this asset may be",
                               "the server sends more than a release asset may be; " + _KEEP)
        data = bytearray()
        while not watch.expired:
            chunk = response.read1(CHUNK)  # what has arrived, not CHUNK bytes: the deadline is checked between
            if not chunk:
                break
            data += chunk
            if len(data) > limit:
                raise ReleaseError(f"{name} is more than the {size_text(limit)} this asset may be",
                                   "the server sends more than a release asset may be; " + _KEEP)
            if progress is not None:
                progress(name, len(data), expected)
    return bytes(data), expected
