"""A server's answer read with a cap: nothing metralectl reads from a server grows without bound.

Every reader of a body that some other program sends (the engine's control endpoints and /metrics, `ps`'s
health probe, the agent's API, a peer's answers and streams, doctor's call to the agent) reads through
here: at most `limit` bytes, then TooLarge (a clear error, exit 65: the answer is not what a server of
that kind sends). A stream is cut per record: LINE_LIMIT for a line of NDJSON, and the SSE splitter
(bench/sse.py) cuts an event at its own EVENT_LIMIT. docs/security.md lists the caps.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from metralectl.errors import ExitCode, MetralError

CONTROL_LIMIT = 4 << 20  # a JSON answer of a control endpoint (models, serve-config, tokenize, the agent's API)
METRICS_LIMIT = 16 << 20  # Prometheus text of one /metrics scrape
LINE_LIMIT = 1 << 20  # one line of a streamed answer (a peer's NDJSON events)
PEEK_LIMIT = 64 << 10  # a body of which only the first characters are kept (health, an error's text)


class TooLarge(MetralError):
    """A server sent more than metralectl reads of that answer."""

    exit_code = ExitCode.DATA


class _Reads(Protocol):
    def read(self, amt: int) -> bytes: ...


def too_large(what: str, limit: int) -> TooLarge:
    return TooLarge(f"{what} sent more than {_size(limit)}; metralectl stopped reading it",
                    "a server of this kind never answers that much: check what answers at that address")


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"


def read_chunks(chunks: Iterable[bytes], limit: int, what: str) -> bytes:
    """The bytes of `chunks` (an httpx response's iter_bytes()), TooLarge past `limit`."""
    data = bytearray()
    for chunk in chunks:
        data += chunk
        if len(data) > limit:
            raise too_large(what, limit)
    return bytes(data)


def read_file(reply: _Reads, limit: int, what: str) -> bytes:
    """All of an http.client / urllib answer, TooLarge past `limit` (never more than limit + 1 bytes read)."""
    data = reply.read(limit + 1)
    if len(data) > limit:
        raise too_large(what, limit)
    return data


def peek(chunks: Iterable[bytes], limit: int = PEEK_LIMIT) -> bytes:
    """The first `limit` bytes of a body whose rest does not matter (the caller closes the response)."""
    data = bytearray()
    for chunk in chunks:
        data += chunk
        if len(data) >= limit:
            break
    return bytes(data[:limit])


def lines(chunks: Iterable[bytes], limit: int, what: str) -> Iterator[bytes]:
    """The lines of a streamed body (without the newline), each at most `limit` bytes, TooLarge beyond."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if len(line) > limit:
                raise too_large(f"{what} (one line)", limit)
            yield line
        if len(pending) > limit:
            raise too_large(f"{what} (one line)", limit)


def httpx_body(response: Any, limit: int, what: str) -> bytes:
    """The body of an httpx response opened with stream=True (client.stream / send(stream=True))."""
    return read_chunks(response.iter_bytes(), limit, what)
