"""The one HTTP client for what metralectl asks over HTTP besides the Hub: a served engine's endpoints (control
calls, `chat`'s stream, `ps`'s health probe), a peer's listener, and the local agent's API.

Two transports behind one vocabulary, both imported where they are used (`list`, `ps` and the routed CLI start
light):
  - `Client` (httpx): streamed requests whose answers are read through seams/bounded.py only — `body` to a
    cap (TooLarge, exit 65, past it), `peek` at the first bytes, `lines` each capped; trust_env is off (an
    engine or a peer is local or on the RoCE link, never behind the user's HTTP proxy);
  - `get_once` and `loopback` (http.client): one plain request, for `ps`'s health probe (importing httpx would
    cost it more than all its other work) and for the agent on 127.0.0.1 (the routed path imports neither
    docker nor httpx). The headers they send are the caller's, as given: the agent's Host check, its bearer
    token and the peers' signatures are the callers' to build and to check.
Whatever goes wrong on the way is a `Failed` (what the library called it, and its words): a timeout, nothing
listening, a connection cut mid-answer, a URL that cannot be used. No httpx or http.client exception leaves.
The benchmark's transports (bench/transport*.py) are the measuring instrument and stay apart.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

from metralectl.seams import bounded

if TYPE_CHECKING:
    import httpx


class Failed(Exception):
    """No answer, or no complete one. `kind` is the failure's name as the library gave it (ConnectError,
    ReadTimeout, ConnectionRefusedError, ...), `detail` its words; `timed_out` when a deadline passed,
    `bad_url` when the URL (or a header) could not be sent at all."""

    def __init__(self, kind: str, detail: str, *, timed_out: bool = False, bad_url: bool = False) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.timed_out = timed_out
        self.bad_url = bad_url

    @property
    def named(self) -> str:
        """`Kind: words` (`Kind` alone when the library said nothing)."""
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


def _failed(exc: BaseException) -> Failed | None:
    """httpx's exception (or the ValueError it lets through for a URL or header that is not ASCII) as a Failed."""
    import httpx

    if isinstance(exc, httpx.InvalidURL) or (isinstance(exc, ValueError) and not isinstance(exc, httpx.HTTPError)):
        return Failed(type(exc).__name__, str(exc), bad_url=True)
    if isinstance(exc, httpx.HTTPError):
        return Failed(type(exc).__name__, str(exc), timed_out=isinstance(exc, httpx.TimeoutException))
    return None


class Reply:
    """An answer being streamed: its status and headers, its body read only through the bounded readers."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status = response.status_code
        self.headers: Mapping[str, str] = response.headers

    @property
    def encoding(self) -> str:
        """The declared charset, else UTF-8 (httpx's rule)."""
        return self._response.encoding or "utf-8"

    def chunks(self) -> Iterator[bytes]:
        """The raw body as it arrives; a connection that fails mid-way is a Failed."""
        try:
            yield from self._response.iter_bytes()
        except Exception as exc:
            failed = _failed(exc)
            if failed is None:
                raise
            raise failed from None

    def body(self, limit: int, what: str) -> bytes:
        """The whole body, bounded.TooLarge past `limit` bytes."""
        return bounded.read_chunks(self.chunks(), limit, what)

    def peek(self, limit: int = bounded.PEEK_LIMIT) -> bytes:
        """The first `limit` bytes; the rest is not read."""
        return bounded.peek(self.chunks(), limit)

    def lines(self, limit: int, what: str) -> Iterator[bytes]:
        """The body's lines (without the newline), each at most `limit` bytes."""
        return bounded.lines(self.chunks(), limit, what)

    def raise_for_status(self) -> None:
        """Failed for an answer other than 2xx, in httpx's words (`Client error '404 Not Found' for url ...`)."""
        import httpx

        try:
            self._response.raise_for_status()
        except httpx.HTTPStatusError as exc:
            raise Failed(type(exc).__name__, str(exc)) from None


class Client:
    """Streamed requests to one kind of server (an engine, a peer); close it, or use it in a `with`."""

    def __init__(self, *, timeout: float, connect_timeout: float | None = None, read_timeout: float | None = None,
                 headers: dict[str, str] | None = None) -> None:
        import httpx

        limits = {"connect": connect_timeout} if connect_timeout is not None else {}
        if read_timeout is not None:
            limits["read"] = read_timeout
        self._http = httpx.Client(timeout=httpx.Timeout(timeout, **limits), trust_env=False, headers=headers or {})

    @contextmanager
    def stream(self, method: str, url: str, *, json: Any = None, content: bytes | None = None,
               headers: dict[str, str] | None = None, timeout: float | None = None) -> Iterator[Reply]:
        """One request; the answer's head is in, its body is read through the Reply. A failure to send it or to
        get its head is a Failed; the caller's own exceptions inside the `with` pass untouched."""
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        try:
            request = self._http.build_request(method, url, json=json, content=content, headers=headers, **extra)
            response = self._http.send(request, stream=True)
        except Exception as exc:
            failed = _failed(exc)
            if failed is None:
                raise
            raise failed from None
        try:
            yield Reply(response)
        finally:
            response.close()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class Plain(NamedTuple):
    """One answer over http.client: status, reason phrase, headers, and the body as far as it was read."""

    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes
    charset: str | None


def get_once(host: str, port: int, target: str, timeout: float, *, limit: int,
             headers: dict[str, str] | None = None) -> Plain:
    """GET http://host:port/target over http.client, reading at most `limit` bytes of the body (the rest is not
    read); Failed when nothing answers, or bad_url when host or target cannot be sent."""
    return _plain(host, port, "GET", target, None, headers or {}, timeout, lambda reply: reply.read(limit))


def loopback(port: int, method: str, path: str, *, headers: dict[str, str], body: bytes | None = None,
             timeout: float, limit: int, what: str | None) -> Plain:
    """One request to a listener on 127.0.0.1 (the agent): the body read to `limit` bytes, TooLarge past it
    (bounded.read_file) — or, with `what` None, only its first `limit` bytes, the rest not read."""
    def read(reply: Any) -> bytes:
        return reply.read(limit) if what is None else bounded.read_file(reply, limit, what)

    return _plain("127.0.0.1", port, method, path, body, headers, timeout, read)


def _plain(host: str, port: int, method: str, target: str, body: bytes | None, headers: dict[str, str],
           timeout: float, read: Any) -> Plain:
    import http.client

    try:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    except (ValueError, http.client.InvalidURL) as exc:  # a control character or a space in the host
        raise Failed(type(exc).__name__, str(exc), bad_url=True) from None
    try:
        conn.request(method, target, body=body, headers=headers)
        reply = conn.getresponse()
        data = read(reply)
    except (ValueError, http.client.InvalidURL) as exc:  # a control character in the target
        raise Failed(type(exc).__name__, str(exc), bad_url=True) from None
    except (OSError, http.client.HTTPException) as exc:
        raise Failed(type(exc).__name__, str(exc), timed_out=isinstance(exc, TimeoutError)) from None
    finally:
        conn.close()
    return Plain(reply.status, reply.reason, dict(reply.headers.items()), data, reply.headers.get_content_charset())
