"""HTTP/1.1 framing for the gateway: a client's request head checked (client.py reads it under caps), an engine's
answer head parsed (its body is relayed by upstream.py), hop-by-hop headers dropped, and errors in OpenAI's
shape.

Plain asyncio rather than a web framework: the gateway's job is a byte relay that must cost well under a
millisecond, and the project has no async server among its dependencies (httpx is a client; aiohttp, uvicorn
and friends would be new ones). The framing here is the small strict subset an OpenAI client and an engine
speak: Content-Length or chunked bodies, keep-alive, no upgrades.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any

HEAD_LIMIT = 64 * 1024  # a request's or a response's head (request line + headers)
CHUNK_SIZE_RE = re.compile(rb"[0-9A-Fa-f]{1,15}")
# an answer's chunk-size line and trailer lines as the strictest client reads them: CRLF-ended, no control byte but
# HTAB in an extension or a trailer (a bare CR or LF there is where two parsers would find two different ends)
CHUNK_LINE_RE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(?:;[^\x00-\x08\x0a-\x1f\x7f]*)?\r\n")
TRAILER_LINE_RE = re.compile(rb"[^\x00-\x08\x0a-\x1f\x7f:]+:[^\x00-\x08\x0a-\x1f\x7f]*\r\n")
# Heads are read as latin-1 text (one byte, one character) and checked whole by one regex each, so that reading one
# costs a few C calls rather than Python per header line (the gateway's own time per request is mostly this kind of
# Python, on caches that the engine's work between requests has left cold). RFC 9110 5.6.2: a method and a header
# name are tokens; a request target is visible ASCII (no space, no control).
TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
# RFC 9110 5.5: a field value with CR, LF or NUL is invalid. Forwarded as it came to an engine that splits lines on
# a bare LF, a client could add headers of its choosing, a second Content-Length among them, and smuggle a request
# onto a pooled engine connection another client's answer uses (llama-server refuses such a head; not every parser
# does, and the gateway does not rely on the engine behind it).
FIELD_LINES = rf"(?:{TOKEN}:[^\r\n\x00]*\r\n)*"
REQUEST_HEAD_RE = re.compile(rf"({TOKEN}) ([\x21-\x7e]+) (HTTP/1\.[01])\r\n({FIELD_LINES})", re.ASCII)
# An engine's status line (RFC 9112 4): a version, three ASCII digits, a reason of visible characters, space, tab.
RESPONSE_HEAD_RE = re.compile(rf"HTTP/1\.([01]) ([1-5][0-9][0-9])(?: ([\t\x20-\x7e\x80-\xff]*))?\r\n({FIELD_LINES})",
                              re.ASCII)
FIELD_RE = re.compile(rf"({TOKEN}):[ \t]*([^\r\n\x00]*)\r\n", re.ASCII)
# RFC 9110 7.6.1 and the headers that only describe one connection: never forwarded either way.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
                        "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length"})
HOP_LINE_RE = re.compile(rf"^(?:{'|'.join(sorted(HOP_BY_HOP))}):[^\r\n]*\r\n", re.ASCII | re.IGNORECASE | re.MULTILINE)
HOP_AUTH_LINE_RE = re.compile(rf"^(?:{'|'.join(sorted(HOP_BY_HOP | {'authorization'}))}):[^\r\n]*\r\n",
                              re.ASCII | re.IGNORECASE | re.MULTILINE)
SPECIAL = frozenset({"content-length", "transfer-encoding", "connection", "authorization"})  # read as a head is
FRAMING = frozenset({"content-length", "transfer-encoding"})  # a request's body: the parser's, not header()'s
PLAIN_CONNECTION = frozenset({"", "keep-alive", "close"})  # a Connection header that names no other header


class BadRequest(Exception):
    """The client's request cannot be read: answered with `status` and closed."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


class Closed(Exception):
    """The peer closed the connection before a whole head arrived (an idle keep-alive ending is no error)."""


@dataclass(slots=True)
class Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    body: bytes = b""
    keep_alive: bool = True
    received: int = 0  # timing.now() as its last byte was read, when the gateway keeps its own time (timing.py)
    block: str | None = None  # its header lines as read (checked): forwarded from as they are, unless the
    # Connection header names others to drop (then None)
    special: dict[str, str] | None = None  # the first value of each SPECIAL header but the framing ones, as its head
    # was read (never changed: requests of one head share it, heads.py)

    def fresh(self) -> Request:
        """A new request with this one's head (heads.py: one parsed before)."""
        return Request(self.method, self.target, self.version, self.headers, b"", self.keep_alive, 0, self.block,
                       self.special)

    def header(self, name: str) -> str | None:
        """The first value of header `name`. None for the framing ones (Content-Length, Transfer-Encoding): the
        parser reads them, and requests of one head but different lengths share what is kept of it (heads.py)."""
        name = name.lower()
        if name in FRAMING:
            return None
        if self.special is not None and name in SPECIAL:
            return self.special.get(name)
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


@dataclass(slots=True)
class Response:
    status: int
    reason: str
    headers: list[tuple[str, str]] = field(default_factory=list)
    length: int | None = None  # Content-Length; None with chunked (or until close)
    chunked: bool = False
    keep_alive: bool = True
    block: str | None = None  # its header lines as read: Request.block says when
    client_head: bytes | None = None  # answer_head()'s, once made (a Response is never changed after its parse)


def _fields(block: str) -> list[tuple[str, str]]:
    """The (name, value) pairs of header lines that the head's regex has checked."""
    pairs: list[tuple[str, str]] = FIELD_RE.findall(block)
    if " \r\n" in block or "\t\r\n" in block:
        pairs = [(name, value.rstrip(" \t")) for name, value in pairs]
    return pairs


def _specials(headers: list[tuple[str, str]]) -> dict[str, list[str]]:
    seen: dict[str, list[str]] = {}
    for name, value in headers:
        low = name.lower()
        if low in SPECIAL:
            seen.setdefault(low, []).append(value)
    return seen


def _named(seen: dict[str, list[str]]) -> set[str]:
    """What the Connection headers name (lowercase tokens)."""
    return {token.strip().lower() for value in seen.get("connection", ()) for token in value.split(",")}


def _why_not(text: str, status: int, first: str) -> BadRequest:
    """The reason a head failed its regex, for the one who sent it: its first line (first: what it must be), or a
    header line."""
    lines = text.split("\r\n")[:-1]
    line_re = REQUEST_HEAD_RE if status == 400 else RESPONSE_HEAD_RE
    where = "the engine's answer head: " if status == 502 else ""
    if not line_re.fullmatch(lines[0] + "\r\n"):
        return BadRequest(status, first)
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not re.fullmatch(TOKEN, name, re.ASCII):
            return BadRequest(status, f"{where}a header line is not `Name: value`")
    return BadRequest(status, f"{where}a header value holds a line break or a NUL")


def parse_request_head(head: bytes, body_limit: int) -> tuple[Request, bool, int]:
    """A client's request head (its request line and header lines, each CRLF-ended; not the blank line): (the
    request, chunked, its Content-Length); BadRequest when it is malformed, could be read two ways, or announces a
    body over body_limit."""
    text = head.decode("latin-1")
    match = REQUEST_HEAD_RE.fullmatch(text)
    if match is None:
        raise _why_not(text, 400, "the request line is not `METHOD TARGET HTTP/1.x`")
    method, target, version, block = match.groups()
    request = Request(method, target, version, _fields(block))
    seen = _specials(request.headers)
    request.special = {name: values[0] for name, values in seen.items() if name not in FRAMING}
    named = _named(seen)
    request.block = block if named <= PLAIN_CONNECTION else None
    request.keep_alive = "close" not in named if version == "HTTP/1.1" else "keep-alive" in named
    # (chunked, Content-Length), or a 400/501 where they could be read two ways (RFC 9112 6.1, 6.3): both headers,
    # two Transfer-Encodings, or two different lengths. One reader taking the first and another the last is how a
    # request is smuggled past a proxy.
    encodings, lengths = seen.get("transfer-encoding", []), set(seen.get("content-length", ()))
    if encodings and lengths:
        raise BadRequest(400, "the request has both Transfer-Encoding and Content-Length")
    if len(encodings) > 1:
        raise BadRequest(400, "the request has more than one Transfer-Encoding header")
    if len(lengths) > 1:
        raise BadRequest(400, "the request has two different Content-Length values")
    if encodings:
        if encodings[0].lower() != "chunked":
            raise BadRequest(501, "only a chunked or a Content-Length request body is understood")
        return request, True, 0
    length = next(iter(lengths), "0")
    if not (length.isascii() and length.isdigit() and len(length) <= 18):  # not '²', not 5000 digits
        raise BadRequest(400, f"Content-Length {length[:20]!r} is not a number")
    return request, False, within(int(length), body_limit)


def within(length: int, body_limit: int) -> int:
    """A request body's announced length, or a 413 when it is over the gateway's cap."""
    if length > body_limit:
        raise BadRequest(413, f"the request body ({length} bytes) is over the gateway's cap of {body_limit} "
                              "bytes (`metralectl gateway --max-body`)")
    return length


def parse_response_head(head: bytes) -> Response:
    """An engine's answer head (its status line and header lines, each CRLF-ended; not the blank line);
    BadRequest(502) when it is not HTTP/1.x."""
    text = head.decode("latin-1")
    match = RESPONSE_HEAD_RE.fullmatch(text)  # its reason goes into the client's head: no CR, LF or NUL in it
    if match is None:
        raise _why_not(text, 502, "the engine's answer is not HTTP/1.x")
    minor, status, reason, block = match.groups()
    response = Response(int(status), reason or "", _fields(block))
    seen = _specials(response.headers)
    if any("chunked" in value.lower() for value in seen.get("transfer-encoding", ())):
        response.chunked = True
    for value in seen.get("content-length", ()):  # read one way only (RFC 9112 6.3): a second, different length
        if not (value.isascii() and value.isdigit() and len(value) <= 18) or response.length not in (None, int(value)):
            raise BadRequest(502, "the engine's answer has a Content-Length that is not one plain number")
        response.length = int(value)
    named = _named(seen)
    response.block = block if named <= PLAIN_CONNECTION else None
    if "close" in named or minor == "0":
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


_kept: dict[tuple[str, bool], str] = {}  # end_to_end() of header lines seen before (heads.py says why)


def end_to_end(block: str | None, headers: list[tuple[str, str]], drop_authorization: bool = False) -> str:
    """A head's header lines without the hop-by-hop ones (and Authorization, when asked): from its lines as read
    where it has them (one regex), else from its pairs."""
    if block is not None:
        kept = _kept.get((block, drop_authorization))
        if kept is None:
            if len(_kept) >= 256:
                _kept.clear()
            kept = _kept[block, drop_authorization] = (HOP_AUTH_LINE_RE if drop_authorization else
                                                       HOP_LINE_RE).sub("", block)
        return kept
    return "".join(f"{k}: {v}\r\n" for k, v in forwarded(headers)
                   if not (drop_authorization and k.lower() == "authorization"))


def answer_head(response: Response) -> bytes:
    """The client's head for an engine's answer: its status and end-to-end headers, and the framing the gateway
    sends it in (the engine's Content-Length, else chunked: an answer that runs until close is re-framed)."""
    if response.client_head is not None:
        return response.client_head
    if response.length is not None:
        framing = f"Content-Length: {response.length}\r\n"
    else:
        framing = "Transfer-Encoding: chunked\r\n" if response.status not in (204, 304) else ""
    status = f"HTTP/1.1 {response.status} {response.reason}".rstrip()
    response.client_head = f"{status}\r\n{end_to_end(response.block, response.headers)}{framing}\r\n".encode("latin-1")
    return response.client_head


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
        if not (self.left or self.partial or self.last):  # what a streaming engine sends most: one whole chunk
            size = CHUNK_LINE_RE.match(data)  # its size line (no LF in it, so it ends at the first LF, as below)
            if size is not None:
                end = size.end() + int(size[1], 16)
                if end > size.end() and len(data) == end + 2 and data.endswith(b"\r\n"):
                    return None
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


REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 408: "Request Timeout", 411: "Length Required", 413: "Content Too Large",
           431: "Request Header Fields Too Large", 501: "Not Implemented", 502: "Bad Gateway",
           503: "Service Unavailable", 504: "Gateway Timeout"}


def simple_response(status: int, body: bytes, content_type: str = "application/json", *, keep_alive: bool = True,
                    extra: list[tuple[str, str]] | None = None) -> bytes:
    headers = [("Content-Type", content_type), ("Content-Length", str(len(body))), *(extra or [])]
    if not keep_alive:
        headers.append(("Connection", "close"))
    return head_bytes(f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}", headers) + body


# A protocol class of the gateway's derives from asyncio.Protocol and asyncio.BufferedProtocol both: asyncio's loop
# takes any BufferedProtocol as one (get_buffer, buffer_updated), and uvloop takes a class with get_buffer as one only
# when it is not an asyncio.Protocol (uvloop/handles/stream.pyx, _set_protocol), so it calls data_received.


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


class NotSent(Exception):
    """Nothing of the request reached a live engine: safe to send again."""


class Answered(Exception):
    """A request the gateway answers itself (an error in OpenAI's shape)."""

    def __init__(self, status: int, message: str, kind: str, code: str, reason: str, *,
                 retry_after: int | None = None, **extra: object) -> None:
        super().__init__(message)
        self.status, self.reason, self.retry_after = status, reason, retry_after
        self.body = error_body(status, message, kind, code, **extra)
