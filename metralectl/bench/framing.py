"""HTTP/1.1 response framing for the raw transport (bench/transport.py): only where a response ends, and
whether a kept-alive connection is still fit to carry the next request. Nothing of the body is parsed.
"""

from __future__ import annotations

import asyncio
import select
import time

from metralectl.bench.sse import END_CLOSED, END_COMPLETE, END_LOST, END_OVERSIZE, RawResponse

perf_ns = time.perf_counter_ns
HEAD_LIMIT = 64 << 10  # a response head (status line and headers) longer than this is refused


class Framer:
    """HTTP/1.1 response framing, incrementally, only to know where a response ends (no parsing of the body)."""

    def __init__(self) -> None:
        self.raw: RawResponse | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.alive = True
        self._head = b""
        self._mode = ""  # "" headers pending | "chunked" | "length" | "eof"
        self._left = 0  # length mode: body bytes still due; chunked: bytes of the current chunk still due
        self._buf = b""  # chunked: unconsumed framing bytes
        self._keep = True
        self.answered = False  # some byte of the current request's response arrived

    def begin(self, raw: RawResponse, waiter: asyncio.Future[None]) -> None:
        self.raw, self.waiter = raw, waiter
        self._head, self._mode, self._left, self._buf, self._keep = b"", "", 0, b"", True
        self.answered = False

    def close_transport(self) -> None:
        raise NotImplementedError

    def fileno(self) -> int:
        raise NotImplementedError

    def dropped(self) -> bool:
        """Checked before an idle connection is reused: anything to read on it (EOF, a reset, stray bytes)
        means it cannot carry another request. The event loop would notice an EOF too, but only once it
        runs; a server that closes right after a response (llama-server) races the next send. This is
        the check urllib3 makes before reusing a pooled connection (a zero-timeout poll)."""
        fd = self.fileno()
        if fd < 0:
            return True
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(fd, select.POLLIN | select.POLLPRI)
            return bool(poller.poll(0))
        return bool(select.select([fd], [], [], 0)[0])

    async def send(self, raw: RawResponse, data: bytes, waiter: asyncio.Future[None]) -> None:
        raise NotImplementedError

    def feed(self, t: int, data: bytes) -> None:
        raw = self.raw
        if raw is None:
            return
        if data:
            self.answered = True
        if not self._mode:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head) > HEAD_LIMIT:
                    self._finish(f"the response head went past {HEAD_LIMIT >> 10} KiB without its end", fatal=True,
                                 end=END_LOST)
                return
            data = self._head[end + 4:]
            self._headers(self._head[:end], raw, t)
            if self.raw is None:  # a bad head ended this response
                return
        if self._mode == "chunked":
            self._chunked(t, data, raw)
        elif self._mode == "length":
            if data:
                if not self._keep_piece(t, data[: self._left], raw):
                    return
                self._left -= len(data)
            if self._left <= 0:
                self._finish(None)
        elif data:
            self._keep_piece(t, data, raw)

    def _keep_piece(self, t: int, data: bytes, raw: RawResponse) -> bool:
        """Keep body bytes; past an event's or the body's limit (sse.RawResponse.keep) the response ends there
        as failed and the connection is closed (False)."""
        cut = raw.keep(t, data)
        if cut is not None:
            self._finish(cut, fatal=True, end=END_OVERSIZE)
            return False
        return True

    def _headers(self, head: bytes, raw: RawResponse, t: int) -> None:
        raw.t_headers = t
        lines = head.split(b"\r\n")
        try:
            raw.status = int(lines[0].split(b" ", 2)[1])
        except (IndexError, ValueError):
            self._finish(f"bad HTTP status line: {lines[0][:80]!r}", fatal=True, end=END_LOST)
            return
        fields = {}
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            fields[k.strip().lower()] = v.strip().lower()
        self._keep = fields.get(b"connection") != b"close"
        if b"chunked" in fields.get(b"transfer-encoding", b""):
            self._mode = "chunked"
        elif b"content-length" in fields:
            try:
                self._mode, self._left = "length", int(fields[b"content-length"])
            except ValueError:
                self._finish(f"bad Content-Length: {fields[b'content-length'][:40]!r}", fatal=True, end=END_LOST)
                return
            if self._left == 0:
                self._finish(None)
        else:
            self._mode, self._keep = "eof", False

    def _chunked(self, t: int, data: bytes, raw: RawResponse) -> None:
        buf = self._buf + data if self._buf else data
        pos = 0
        n = len(buf)
        while pos < n:
            if self._left > 0:
                take = min(self._left, n - pos)
                if not self._keep_piece(t, buf[pos:pos + take], raw):
                    return
                pos += take
                self._left -= take
                if self._left == 0:
                    self._left = -2  # the CRLF after the chunk's data
                continue
            if self._left < 0:
                skip = min(-self._left, n - pos)
                pos += skip
                self._left += skip
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if n - pos > HEAD_LIMIT:  # a chunk-size line (or the trailers) that never ends
                    self._finish("a chunk-size line went past 64 KiB without its end", fatal=True, end=END_LOST)
                    return
                break
            try:
                size = int(buf[pos:eol].split(b";", 1)[0], 16)
            except ValueError:
                self._finish(f"bad chunk size line: {buf[pos:eol][:40]!r}", fatal=True, end=END_LOST)
                return
            if size == 0:
                rest = buf[eol + 2:]
                if rest.startswith(b"\r\n") or b"\r\n\r\n" in rest:  # end (trailers, if any, are ignored)
                    self._buf = b""
                    self._finish(None)
                    return
                if len(rest) > HEAD_LIMIT:
                    self._finish("the trailers went past 64 KiB without their end", fatal=True, end=END_LOST)
                    return
                break
            pos, self._left = eol + 2, size
        self._buf = buf[pos:]

    def _finish(self, error: str | None, *, fatal: bool = False, end: str = END_COMPLETE) -> None:
        raw, waiter = self.raw, self.waiter
        self.raw = self.waiter = None
        if raw is not None:
            raw.t_done = perf_ns()
            raw.error = raw.error or error
            raw.end = raw.end or end
        if fatal or not self._keep:
            self.alive = False
            self.close_transport()
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def lost(self, exc: BaseException | None) -> None:
        self.alive = False
        if self.raw is not None:
            if self._mode == "eof" and exc is None:
                self._finish(None)  # EOF is this response's framing
            elif exc is None:
                self._finish(None, end=END_CLOSED)  # complete or truncated: its events decide
            else:
                self._finish(f"connection lost: {exc}", end=END_LOST)
