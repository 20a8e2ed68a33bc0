"""The load generator's seam: stream one request, return what arrived and when. Nothing is parsed here.

`raw` (default): HTTP/1.1 keep-alive connections over non-blocking sockets. On Linux (plain HTTP) each
read is a recvmsg with SO_TIMESTAMPNS: the kernel's arrival time, which a busy event loop or a vCPU
waking from idle cannot shift (_KConn). Elsewhere, and for https or `raw-nostamp`, an asyncio Protocol
stamps perf_counter_ns in data_received (_Conn). Either way the bytes are de-chunked and kept with
their stamp (framing.py); no StreamReader, no per-read future, no line splitting. An idle connection is
checked before reuse, and a request that a reused connection answered with nothing is sent once more on
a fresh one (RawTransport.stream; docs/bench.md, "Kept-alive connections the server closes").
Measured (benchmarks/bench_client.py, docs/bench.md): within 0.5/2 ms (p50/p99) up to ~37k events/s
in one process at 18.5 µs of CPU per event; raw-nostamp is 0.26 ms late at p50 even at one stream;
httpx stops keeping up near 6k events/s, aiohttp keeps up but is milliseconds late (transport_alt).
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import struct
import sys
import time
from collections.abc import Mapping
from typing import Protocol
from urllib.parse import urlsplit

from metralectl.bench.framing import Framer as _Framer
from metralectl.bench.sse import END_CANCELLED, END_CLOSED, END_CONNECT, END_LOST, END_TIMEOUT, RawResponse
from metralectl.errors import UsageError

TRANSPORTS = ("raw", "raw-nostamp", "httpx", "aiohttp")
perf_ns = time.perf_counter_ns
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("qq")
LATE_READ_NS = 250_000  # a read this long after its newest bytes arrived came late ...
BEHIND_WINDOW_NS = 100_000_000  # ... and for this long after one, reads peek first (_KConn._readable)
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # a header name (RFC 9110 §5.1)
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e]*")  # a header value we send: visible ASCII, space and tab only


def header_problem(name: str, value: str) -> str | None:
    """Why NAME: VALUE cannot be sent as one request header (None: it can). A CR or LF would end the header
    and start another (or the body) on the raw transport; httpx refuses them, and anything not ASCII."""
    if not _TOKEN.fullmatch(name):
        return f"the header name {name!r} is not a token (letters, digits and !#$%&'*+.^_`|~-)"
    if not _FIELD_VALUE.fullmatch(value):
        return f"the value of {name} holds a line break, a control or a non-ASCII character"
    return None


class Transport(Protocol):
    async def open(self, prewarm: int) -> None: ...

    async def stream(self, body: bytes, timeout_s: float, raw: RawResponse | None = None) -> RawResponse:
        """Send one request and fill `raw` (made here when None) with what arrives; never raises for a
        failed request (the failure lands in raw.error / raw.end), only CancelledError passes through."""
        ...

    async def close(self) -> None: ...


def make_transport(name: str, url: str, path: str, pool: int, headers: Mapping[str, str] | None = None) -> Transport:
    if name == "raw":
        return RawTransport(url, path, pool, headers)
    if name == "raw-nostamp":  # the same without kernel stamps (for comparison)
        return RawTransport(url, path, pool, headers, kernel_stamps=False)
    if name in ("httpx", "aiohttp"):
        from metralectl.bench.transport_alt import AiohttpTransport, HttpxTransport

        return (HttpxTransport if name == "httpx" else AiohttpTransport)(url, path, pool, headers)
    raise UsageError(f"unknown transport {name!r}", f"one of: {', '.join(TRANSPORTS)}")


class _Conn(_Framer, asyncio.Protocol):
    """Portable connection: the stamp is taken when asyncio hands us the bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    async def send(self, raw: RawResponse, data: bytes, waiter: asyncio.Future[None]) -> None:
        self.begin(raw, waiter)
        assert self.transport is not None
        raw.t_send = perf_ns()
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.feed(perf_ns(), data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost(exc)

    def close_transport(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def fileno(self) -> int:
        if self.transport is None or self.transport.is_closing():
            return -1
        sock = self.transport.get_extra_info("socket")
        return -1 if sock is None else int(sock.fileno())


class _Clock:
    """CLOCK_REALTIME (kernel stamps) -> perf_counter_ns, recalibrated often so NTP slewing cannot build up."""

    def __init__(self) -> None:
        self.offset = 0
        self.at = 0
        self.behind_until = 0  # the client read late recently: its connections peek before reading
        self.calibrate()

    def calibrate(self) -> None:
        best = None
        for _ in range(5):  # the pair read closest together bounds the offset's error
            a = perf_ns()
            w = time.time_ns()
            b = perf_ns()
            if best is None or b - a < best[0]:
                best = (b - a, w - (a + b) // 2)
        assert best is not None
        self.offset, self.at = best[1], perf_ns()

    def to_perf(self, realtime_ns: int) -> int:
        if perf_ns() - self.at > 500_000_000:
            self.calibrate()
        return realtime_ns - self.offset


class _KConn(_Framer):
    """Linux: reads with recvmsg and SO_TIMESTAMPNS, so each read carries the time the kernel queued its
    last bytes. On loopback that is stamped on the sender's CPU as it sends: a receiver that was asleep
    (an idle vCPU takes ~1 ms to wake) or busy with other streams does not shift the stamp. The stamp
    used is min(kernel time, time of the read), never before the previous one on this connection."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop, clock: _Clock) -> None:
        super().__init__()
        self.sock, self.loop, self.clock = sock, loop, clock
        self.last = 0
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        loop.add_reader(sock.fileno(), self._readable)

    async def send(self, raw: RawResponse, data: bytes, waiter: asyncio.Future[None]) -> None:
        self.begin(raw, waiter)
        raw.t_send = perf_ns()
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self.lost(exc)
            return
        if sent < len(data):
            try:
                await self.loop.sock_sendall(self.sock, data[sent:])
            except OSError as exc:
                self.lost(exc)

    def _readable(self) -> None:
        while True:
            # While the client is behind (a read came late lately), a one-byte peek first: it is stamped with
            # the oldest queued segment, the read with the newest, so a read holding several events tells
            # whether they arrived apart (late_stamp_errors). A client that keeps up pays nothing for it.
            peek = perf_ns() < self.clock.behind_until
            try:
                first_anc = self.sock.recvmsg(1, 64, socket.MSG_PEEK)[1] if peek else None
                data, anc, _, _ = self.sock.recvmsg(262144, 64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.close_transport()
                self.lost(exc)
                return
            t_read = perf_ns()
            if not data:
                self.close_transport()
                self.lost(None)
                return
            t = min(t_read, self._stamp(anc, t_read))
            if t_read - t > LATE_READ_NS:
                self.clock.behind_until = t_read + BEHIND_WINDOW_NS
            raw = self.raw
            if raw is not None:
                t = max(t, self.last, raw.t_send)
                first = -1 if first_anc is None else min(max(self._stamp(first_anc, t), raw.t_send), t)
                raw.reads.append((t, first, t_read - t))
            self.last = t
            self.feed(t, data)

    def _stamp(self, ancillary: list[tuple[int, int, bytes]], default: int) -> int:
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= 16:
                sec, nsec = _TIMESPEC.unpack_from(payload)
                return self.clock.to_perf(sec * 1_000_000_000 + nsec)
        return default

    def close_transport(self) -> None:
        if self.sock.fileno() >= 0:
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()

    def fileno(self) -> int:
        return self.sock.fileno()


class RawTransport:
    def __init__(self, url: str, path: str, pool: int, headers: Mapping[str, str] | None = None,
                 kernel_stamps: bool = True) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if parts.scheme == "https" else None
        base = (parts.path or "").rstrip("/")
        host_header = parts.netloc.rsplit("@", 1)[-1]
        for name, value in (headers or {}).items():  # never a header that ends the head early
            why = header_problem(name, value)
            if why is not None:
                raise UsageError(f"cannot send the header: {why}")
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head = (f"POST {base}{path} HTTP/1.1\r\nHost: {host_header}\r\nContent-Type: application/json\r\n"
                      f"Accept: text/event-stream\r\n{extra}Content-Length: ").encode()
        self.pool = pool
        self._idle: list[_Framer] = []
        self._open = 0
        self.opened = 0  # connections opened in all (a health figure: the pool a load really needed)
        self.idle_closed = 0  # idle connections found closed (or unfit) when a request wanted one
        self._slots = asyncio.Semaphore(pool)
        self.kernel_stamps = kernel_stamps and self.ssl is None and sys.platform == "linux"
        self._clock = _Clock() if self.kernel_stamps else None

    async def _connect(self) -> _Framer:
        loop = asyncio.get_running_loop()
        self._open += 1
        self.opened += 1
        if self._clock is not None:
            infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            family, kind, proto, _, addr = infos[0]
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, addr)
            except BaseException:  # refused, or the run stopped (cancelled) while it connected: nothing kept open
                sock.close()
                self._open -= 1
                raise
            return _KConn(sock, loop, self._clock)
        try:
            _, conn = await loop.create_connection(_Conn, self.host, self.port, ssl=self.ssl)
        except BaseException:
            self._open -= 1
            raise
        return conn

    async def open(self, prewarm: int) -> None:
        """Connect `prewarm` connections now, so no request of the measured window pays for a handshake. A
        server that refuses them (down, restarting) is not an error here: each request then says so."""
        conns = await asyncio.gather(*(self._connect() for _ in range(min(prewarm, self.pool))),
                                     return_exceptions=True)
        self._idle.extend(c for c in conns if isinstance(c, _Framer))

    async def stream(self, body: bytes, timeout_s: float, raw: RawResponse | None = None) -> RawResponse:
        """One request. Sent on an idle kept-alive connection (when one is fit: `_take_idle`) and answered by
        nothing at all, it is sent once more on a fresh connection: the server closed the connection before
        taking the request (llama-server closes some right after a streamed response), so it was never
        processed (RFC 9112 §9.3.1; Go's net/http retries it for replayable requests, and a benchmark's
        request changes nothing beyond the work it asks for). A request that got any byte back, that timed
        out, or that failed on a fresh connection is never sent again."""
        raw = raw if raw is not None else RawResponse(perf_ns())
        data = self._head + str(len(body)).encode() + b"\r\n\r\n" + body
        async with self._slots:
            conn = self._take_idle()
            reused = conn is not None
            while True:
                try:
                    if conn is None:
                        conn = await self._connect()
                except OSError as exc:
                    raw.error, raw.end = f"connect failed: {exc}", END_CONNECT
                    raw.t_done = perf_ns()
                    return raw
                await self._exchange(conn, raw, data, timeout_s)
                unanswered = not conn.answered and raw.end in (END_CLOSED, END_LOST)
                if conn.alive:
                    self._idle.append(conn)
                else:
                    self._retire(conn)
                if not (reused and unanswered):
                    return raw
                raw.restart(raw.error or "the server closed the kept-alive connection before answering")
                conn, reused = None, False

    async def _exchange(self, conn: _Framer, raw: RawResponse, data: bytes, timeout_s: float) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        try:
            await conn.send(raw, data, waiter)
            await asyncio.wait_for(waiter, timeout_s)
        except asyncio.TimeoutError:
            conn._finish(f"timed out after {timeout_s:g} s", fatal=True, end=END_TIMEOUT)
        except asyncio.CancelledError:
            conn._finish("cancelled", fatal=True, end=END_CANCELLED)
            raise

    def _take_idle(self) -> _Framer | None:
        """The most recently used idle connection that is still open and has nothing to read."""
        while self._idle:
            conn = self._idle.pop()
            if conn.alive and not conn.dropped():
                return conn
            self.idle_closed += 1
            self._retire(conn)
        return None

    def _retire(self, conn: _Framer) -> None:
        conn.alive = False
        conn.close_transport()
        self._open -= 1

    async def close(self) -> None:
        for conn in self._idle:
            conn.close_transport()
        self._idle.clear()
