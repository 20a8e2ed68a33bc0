"""HTTP/1.1 framing for the gateway: a client's request read from its asyncio stream under caps, an engine's
answer head parsed (its body is relayed by upstream.py), hop-by-hop headers dropped, and errors in OpenAI's
shape.

Plain asyncio rather than a web framework: the gateway's job is a byte relay that must cost well under a
millisecond, and the project has no async server among its dependencies (httpx is a client; aiohttp, uvicorn
and friends would be new ones). The framing here is the small strict subset an OpenAI client and an engine
speak: Content-Length or chunked bodies, keep-alive, no upgrades.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HEAD_LIMIT = 64 * 1024  # a request's or a response's head (request line + headers)
CHUNK_SIZE_RE = re.compile(rb"[0-9A-Fa-f]{1,15}")
# an answer's chunk-size line and trailer lines as the strictest client reads them: CRLF-ended, no control byte but
# HTAB in an extension or a trailer (a bare CR or LF there is where two parsers would find two different ends)
CHUNK_LINE_RE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(?:;[^\x00-\x08\x0a-\x1f\x7f]*)?\r\n")
TRAILER_LINE_RE = re.compile(rb"[^\x00-\x08\x0a-\x1f\x7f:]+:[^\x00-\x08\x0a-\x1f\x7f]*\r\n")
# RFC 9110 5.6.2: a method and a header name are tokens; a request target is visible ASCII (no space, no control).
TOKEN_RE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
TARGET_RE = re.compile(rb"[\x21-\x7e]+")
# RFC 9110 5.5: a field value with CR, LF or NUL is invalid. Forwarded as it came to an engine that splits lines on
# a bare LF, a client could add headers of its choosing, a second Content-Length among them, and smuggle a request
# onto a pooled engine connection another client's answer uses (llama-server refuses such a head; not every parser
# does, and the gateway does not rely on the engine behind it).
BAD_VALUE_RE = re.compile(rb"[\r\n\x00]")
# An engine's status line (RFC 9112 4): a version, three ASCII digits, a reason of visible characters, space, tab.
STATUS_LINE_RE = re.compile(rb"HTTP/1\.[01] [1-5][0-9][0-9](?: [\t\x20-\x7e\x80-\xff]*)?")
# RFC 9110 7.6.1 and the headers that only describe one connection: never forwarded either way.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
                        "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length"})


class BadRequest(Exception):
    """The client's request cannot be read: answered with `status` and closed."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


class Closed(Exception):
    """The peer closed the connection before a whole head arrived (an idle keep-alive ending is no error)."""


@dataclass
class Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    body: bytes = b""
    keep_alive: bool = True
    received: int = 0  # timing.now() as its last byte was read, when the gateway keeps its own time (timing.py)

    def header(self, name: str) -> str | None:
        name = name.lower()
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


@dataclass
class Response:
    status: int
    reason: str
    headers: list[tuple[str, str]] = field(default_factory=list)
    length: int | None = None  # Content-Length; None with chunked (or until close)
    chunked: bool = False
    keep_alive: bool = True


def _headers(lines: list[bytes]) -> list[tuple[str, str]]:
    out = []
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep or not TOKEN_RE.fullmatch(name):
            raise BadRequest(400, "a header line is not `Name: value`")
        if BAD_VALUE_RE.search(value):
            raise BadRequest(400, "a header value holds a line break or a NUL")
        out.append((name.decode("latin-1"), value.strip(b" \t").decode("latin-1")))
    return out


def _framing(request: Request) -> tuple[bool, str | None]:
    """(chunked, Content-Length) of a request, or a 400/501 where they could be read two ways (RFC 9112 6.1, 6.3):
    both headers, two Transfer-Encodings, or two different lengths. One reader taking the first and another the
    last is how a request is smuggled past a proxy."""
    encodings = [v for k, v in request.headers if k.lower() == "transfer-encoding"]
    lengths = {v for k, v in request.headers if k.lower() == "content-length"}
    if encodings and lengths:
        raise BadRequest(400, "the request has both Transfer-Encoding and Content-Length")
    if len(encodings) > 1:
        raise BadRequest(400, "the request has more than one Transfer-Encoding header")
    if len(lengths) > 1:
        raise BadRequest(400, "the request has two different Content-Length values")
    if encodings and encodings[0].lower() != "chunked":
        raise BadRequest(501, "only a chunked or a Content-Length request body is understood")
    return bool(encodings), next(iter(lengths), None)


async def read_head(reader: asyncio.StreamReader) -> list[bytes]:
    """The head's lines (the blank line excluded), at most HEAD_LIMIT bytes; Closed on EOF before a byte."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as short:
        if not short.partial.strip():
            raise Closed() from None
        raise BadRequest(400, "the connection closed in the middle of a request head") from None
    except asyncio.LimitOverrunError:
        raise BadRequest(431, f"the request head is over {HEAD_LIMIT // 1024} KiB") from None
    return raw[:-4].split(b"\r\n")


async def read_request(reader: asyncio.StreamReader, body_limit: int) -> Request:
    lines = await read_head(reader)
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0") or not TOKEN_RE.fullmatch(parts[0]) \
            or not TARGET_RE.fullmatch(parts[1]):
        raise BadRequest(400, "the request line is not `METHOD TARGET HTTP/1.x`")
    method, target, version = (part.decode("ascii") for part in parts)
    request = Request(method, target, version, _headers(lines[1:]))
    connection = (request.header("connection") or "").lower()
    request.keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
    chunked, content_length = _framing(request)
    if chunked:
        request.body = await read_chunked_body(reader, body_limit)
    else:
        length = content_length or "0"
        if not (length.isascii() and length.isdigit() and len(length) <= 18):  # not '²', not 5000 digits
            raise BadRequest(400, f"Content-Length {length[:20]!r} is not a number")
        if int(length) > body_limit:
            raise BadRequest(413, f"the request body ({int(length)} bytes) is over the gateway's cap of {body_limit} "
                                  "bytes (`metralectl gateway --max-body`)")
        request.body = await reader.readexactly(int(length)) if int(length) else b""
    return request


async def read_chunked_body(reader: asyncio.StreamReader, limit: int) -> bytes:
    body = bytearray()
    while True:
        size = await _chunk_size(reader)
        if size == 0:
            await _trailers(reader)
            return bytes(body)
        if len(body) + size > limit:
            raise BadRequest(413, f"the request body is over the gateway's cap of {limit} bytes "
                                  "(`metralectl gateway --max-body`)")
        body += await reader.readexactly(size)
        if await reader.readexactly(2) != b"\r\n":
            raise BadRequest(400, "a chunk of the body does not end with CRLF")


async def _chunk_size(reader: asyncio.StreamReader) -> int:
    line = await _line(reader, "a chunk size line")
    digits = line[:-2].split(b";", 1)[0].strip()
    if not CHUNK_SIZE_RE.fullmatch(digits):  # int(x, 16) would take '-5', '0x10', '1_0'
        raise BadRequest(400, "a chunk size is not hexadecimal")
    return int(digits, 16)


async def _line(reader: asyncio.StreamReader, what: str) -> bytes:
    """One CRLF-ended line of a chunked body, a 400 when it passes the reader's limit or the connection ends."""
    try:
        return await reader.readuntil(b"\r\n")
    except asyncio.LimitOverrunError:
        raise BadRequest(400, f"{what} is too long") from None


async def _trailers(reader: asyncio.StreamReader) -> bytes:
    raw = b""
    while True:
        line = await _line(reader, "a trailer of the chunked body")
        raw += line
        if line == b"\r\n":
            return raw
        if len(raw) > HEAD_LIMIT:
            raise BadRequest(400, "the chunked body's trailers are too long")


def parse_response_head(lines: list[bytes]) -> Response:
    """An engine's answer head (its lines, the blank line excluded); BadRequest(502) when it is not HTTP/1.x."""
    if not STATUS_LINE_RE.fullmatch(lines[0]):  # its reason goes into the client's head: no CR, LF or NUL in it
        raise BadRequest(502, "the engine's answer is not HTTP/1.x")
    parts = lines[0].decode("latin-1").split(" ", 2)
    try:
        response = Response(int(parts[1]), parts[2] if len(parts) > 2 else "", _headers(lines[1:]))
    except BadRequest as bad:
        raise BadRequest(502, f"the engine's answer head: {bad.message}") from None
    for name, value in response.headers:
        low = name.lower()
        if low == "transfer-encoding" and "chunked" in value.lower():
            response.chunked = True
        elif low == "content-length":  # read one way only (RFC 9112 6.3): a second, different length is a fault
            if not (value.isascii() and value.isdigit() and len(value) <= 18) or \
                    response.length not in (None, int(value)):
                raise BadRequest(502, "the engine's answer has a Content-Length that is not one plain number")
            response.length = int(value)
        elif low == "connection" and "close" in value.lower():
            response.keep_alive = False
    if parts[0] == "HTTP/1.0":
        response.keep_alive = False
    if not response.chunked and response.length is None and response.status not in (204, 304):
        response.keep_alive = False  # its body runs until the engine closes
    return response


def forwarded(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Headers with the hop-by-hop ones dropped (and any the Connection header names)."""
    named = {v.strip().lower() for k, value in headers if k.lower() == "connection" for v in value.split(",")}
    return [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP and k.lower() not in named]


def head_bytes(first_line: str, headers: list[tuple[str, str]]) -> bytes:
    return (first_line + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n").encode("latin-1")


def answer_head(response: Response) -> bytes:
    """The client's head for an engine's answer: its status and end-to-end headers, and the framing the gateway
    sends it in (the engine's Content-Length, else chunked: an answer that runs until close is re-framed)."""
    out = forwarded(response.headers)
    if response.length is not None:
        out.append(("Content-Length", str(response.length)))
    elif response.status not in (204, 304):
        out.append(("Transfer-Encoding", "chunked"))
    return head_bytes(f"HTTP/1.1 {response.status} {response.reason}".rstrip(), out)


class ChunkEnd:
    """Follows a chunked body's framing over pieces split anywhere; feed() returns where the body ends (the
    offset just past the last chunk's trailers in that piece), else None. Malformed framing: ConnectionResetError.
    The framing is read as strictly as the strictest client would (CRLF line ends, the CRLF after each chunk's
    data checked, no control bytes in a size line's extension or a trailer): the relay passes the engine's bytes on
    verbatim, and a client that found another end than ours would read the rest as its next answer."""

    LINE_LIMIT = 4096

    def __init__(self) -> None:
        self.partial = b""  # a size or trailer line cut by a piece's end
        self.left = 0  # bytes of the current chunk's data and its CRLF still to come
        self.last = False  # the 0-size chunk was seen: trailers until an empty line

    def feed(self, data: bytes) -> int | None:
        i, n = 0, len(data)
        while i < n:
            if self.left:
                take = min(self.left, n - i)
                if take > self.left - 2:  # this piece holds (part of) the CRLF that ends the chunk's data
                    start = max(0, self.left - 2)
                    if data[i + start:i + take] != b"\r\n"[2 - (self.left - start):2 - (self.left - take)]:
                        raise ConnectionResetError("the engine's chunked answer has a chunk not ended by CRLF")
                i, self.left = i + take, self.left - take
                continue
            j = data.find(b"\n", i)
            if j < 0:
                self.partial += data[i:]
                if len(self.partial) > self.LINE_LIMIT:
                    raise ConnectionResetError("the engine's chunked answer has a line too long")
                return None
            line, self.partial, i = self.partial + data[i:j + 1], b"", j + 1
            if self.last:
                if line == b"\r\n":
                    return i
                if not TRAILER_LINE_RE.fullmatch(line):
                    raise ConnectionResetError("the engine's chunked answer has a malformed trailer")
                continue
            size = CHUNK_LINE_RE.fullmatch(line)  # int(x, 16) takes '-6': a size that walked back, forever
            if size is None:
                raise ConnectionResetError("the engine's chunked answer is malformed")
            if size[1] == b"0" * len(size[1]):
                self.last = True
            else:
                self.left = int(size[1], 16) + 2
        return None


def error_body(status: int, message: str, kind: str, code: str | None = None, **extra: object) -> bytes:
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}} (plus what the gateway adds)."""
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code, **extra}}).encode()


REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 411: "Length Required",
           413: "Content Too Large", 431: "Request Header Fields Too Large", 501: "Not Implemented",
           502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}


def simple_response(status: int, body: bytes, content_type: str = "application/json", *, keep_alive: bool = True,
                    extra: list[tuple[str, str]] | None = None) -> bytes:
    headers = [("Content-Type", content_type), ("Content-Length", str(len(body))), *(extra or [])]
    if not keep_alive:
        headers.append(("Connection", "close"))
    return head_bytes(f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}", headers) + body


class ClientReader(asyncio.StreamReader):
    """A StreamReader that says when its peer went away (EOF or an error), whether or not anyone reads."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit=limit)
        self.gone = False
        self.on_gone: Callable[[], object] | None = None  # the relay's cancel while one runs

    def _went(self) -> None:
        self.gone = True
        if self.on_gone is not None:
            self.on_gone()

    def feed_eof(self) -> None:
        super().feed_eof()
        self._went()

    def set_exception(self, exc: Exception) -> None:
        super().set_exception(exc)
        self._went()


class _ReadBuffer(threading.local):
    """One read buffer per thread (per event loop), shared by every connection on it: each read is copied out
    before the callback that made it returns, so no two reads ever hold it at once. A buffer per connection was
    64 KiB allocated and zeroed as each client connected, on the path of its first token."""

    def __init__(self) -> None:
        self.view = memoryview(bytearray(READ_SIZE))


READ_SIZE = 64 * 1024  # the most one read takes (under glibc's mmap threshold: upstream.py says why that matters)
_read_buffer = _ReadBuffer()


def read_buffer() -> memoryview:
    """This thread's read buffer (get_buffer() of a BufferedProtocol); what is read into it must be copied out in
    the buffer_updated() that follows, before anything else runs."""
    return _read_buffer.view


class ClientProtocol(asyncio.StreamReaderProtocol, asyncio.BufferedProtocol):
    """A client connection's protocol: its bytes read into the thread's shared buffer (upstream.py says why not
    asyncio's default read, which allocates 256 KiB each time), then fed to its ClientReader as a
    StreamReaderProtocol does."""

    def get_buffer(self, sizehint: int) -> memoryview:
        return _read_buffer.view

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(_read_buffer.view[:nbytes]))


class NotSent(Exception):
    """Nothing of the request reached a live engine: safe to send again."""


class Answered(Exception):
    """A request the gateway answers itself (an error in OpenAI's shape)."""

    def __init__(self, status: int, message: str, kind: str, code: str, reason: str, *,
                 retry_after: int | None = None, **extra: object) -> None:
        super().__init__(message)
        self.status, self.reason, self.retry_after = status, reason, retry_after
        self.body = error_body(status, message, kind, code, **extra)
