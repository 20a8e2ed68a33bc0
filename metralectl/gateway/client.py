"""A client's connection to the gateway: its requests read, under caps, in the callback that read their bytes, and
handed to the connection's task (server.Gateway.handle), or first to the gateway's fast path (server.Gateway.arrived),
which forwards a request for a served model to its engine from that same callback.

Why not asyncio's StreamReader: a request read through one waited a turn of the event loop for the connection's
task, then its coroutines (readuntil, readexactly) ran, before a byte of it went to the engine. At one stream that
turn and the reader were ~25 us of the gateway's ~190 us on the 2-core box (and several times their warm cost on a
lent H200 between requests, where every cache is cold). Here the request is parsed where its last byte is read, and
the task wakes later, once the engine already has it: the engine's time to a first token covers the task's turn.

The parse is the same strict subset as before (http1.parse_request_head): a head of at most HEAD_LIMIT, a body by
Content-Length or chunked, under the gateway's body cap, read as it comes (a chunked body is decoded as it arrives,
its raw chunks not kept beside it). While a request is being served, what the client sends next (pipelined) waits in
the buffer, and past PAUSE_AT bytes its reading is paused until the task asks for the next request. Reads come as
upstream.py's do (http1.py, above its read buffer): data_received on uvloop, buffer_updated on asyncio's own loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, cast

from metralectl.gateway import busy, heads, http1, timing
from metralectl.gateway.http1 import HEAD_LIMIT, BadRequest, Closed, Request

PAUSE_AT = 2 * HEAD_LIMIT  # buffered bytes of a next request, while one is served, past which reading pauses


class ChunkedBody:
    """A chunked request body decoded from a buffer as it fills: read() consumes what it can and returns the body
    once its last chunk and trailers are in, else None."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.body = bytearray()
        self.left = -1  # the current chunk's data still to come (then its CRLF); -1: a size line is next
        self.trailers: int | None = None  # bytes of trailers read, once the last (0-size) chunk was

    def read(self, buffer: bytearray) -> bytes | None:
        while True:
            if self.trailers is not None or self.left < 0:
                end = buffer.find(b"\r\n")
                if end < 0:
                    if (self.trailers or 0) + len(buffer) > HEAD_LIMIT:
                        raise BadRequest(400, "a chunk size line is too long" if self.trailers is None else
                                         "the chunked body's trailers are too long")
                    return None
                line = bytes(buffer[:end])
                del buffer[:end + 2]
                if self.trailers is not None:
                    if not line:
                        return bytes(self.body)
                    self.trailers += end + 2
                    if self.trailers > HEAD_LIMIT:
                        raise BadRequest(400, "the chunked body's trailers are too long")
                    continue
                digits = line.split(b";", 1)[0].strip()
                if not http1.CHUNK_SIZE_RE.fullmatch(digits):  # int(x, 16) would take '-5', '0x10', '1_0'
                    raise BadRequest(400, "a chunk size is not hexadecimal")
                size = int(digits, 16)
                if size == 0:
                    self.trailers = 0
                    continue
                if len(self.body) + size > self.limit:
                    raise BadRequest(413, f"the request body is over the gateway's cap of {self.limit} bytes "
                                          "(`metralectl gateway --max-body`)")
                self.left = size
            if len(buffer) < self.left + 2:  # the rest of this chunk's data is still to come: take what is here
                take = min(len(buffer), self.left)
                self.body += buffer[:take]
                del buffer[:take]
                self.left -= take
                return None
            self.body += buffer[:self.left]
            if buffer[self.left:self.left + 2] != b"\r\n":
                raise BadRequest(400, "a chunk of the body does not end with CRLF")
            del buffer[:self.left + 2]
            self.left = -1


class RequestParser:
    """A client's requests from its bytes, as they come (feed the buffer, then ask next())."""

    def __init__(self, body_limit: int) -> None:
        self.body_limit = body_limit
        self.buffer = bytearray()
        self._request: Request | None = None  # its head read, its body still coming
        self._length = 0  # that body's Content-Length
        self._chunks: ChunkedBody | None = None

    def next(self) -> Request | None:
        """The next whole request, else None (more bytes needed); BadRequest when it cannot be read."""
        request = self._request
        if request is None:  # its head first, at most HEAD_LIMIT
            end = self.buffer.find(b"\r\n\r\n")
            if end > HEAD_LIMIT or (end < 0 and len(self.buffer) > HEAD_LIMIT):
                raise BadRequest(431, f"the request head is over {HEAD_LIMIT // 1024} KiB")
            if end < 0:
                return None
            head = bytes(self.buffer[:end + 2])
            del self.buffer[:end + 4]
            request, chunked, self._length = heads.request_head(head, self.body_limit)
            self._request, self._chunks = request, ChunkedBody(self.body_limit) if chunked else None
        if self._chunks is not None:
            body = self._chunks.read(self.buffer)
            if body is None:
                return None
        elif len(self.buffer) >= self._length:
            body = bytes(self.buffer[:self._length])
            del self.buffer[:self._length]
        else:
            return None
        request.body, self._request, self._chunks = body, None, None
        return request

    def take(self, data: bytes) -> Request | None:
        """next(), after `data` is added to the buffer. A request that comes whole in one read, with nothing before
        it (what a client sends most), is cut from `data` as it is: not copied into the buffer and out again."""
        if self.buffer or self._request is not None:
            self.buffer += data
            return self.next()
        end = data.find(b"\r\n\r\n", 0, HEAD_LIMIT + 4)
        if end < 0:  # its head is still coming (or too long: next() says 431)
            self.buffer += data
            return self.next()
        request, chunked, length = heads.request_head(data[:end + 2], self.body_limit)
        start = end + 4
        if chunked or len(data) - start < length:  # its body comes as it comes: next() reads it from the buffer
            self._request, self._length = request, length
            self._chunks = ChunkedBody(self.body_limit) if chunked else None
            self.buffer += memoryview(data)[start:]
            return self.next()
        request.body = data[start:start + length]
        if len(data) > start + length:  # the next request (pipelined) has begun: it waits in the buffer
            self.buffer += memoryview(data)[start + length:]
        return request

    def head_pending(self) -> bool:
        """Part of a request head is in, not all of it (idle.py times it)."""
        return self._request is None and bool(self.buffer.strip())

    def abandon(self) -> None:
        """What was read of a request, dropped (its client timed out): ended() says Closed."""
        self.buffer.clear()
        self._request = self._chunks = None

    def ended(self) -> Exception:
        """What the client's end of sending means here: Closed when no request had begun (an idle keep-alive
        ending) or its body was cut (nobody to answer); a 400 for a head cut short."""
        if self._request is None and self.buffer.strip():
            return BadRequest(400, "the connection closed in the middle of a request head")
        return Closed()


class ClientConnection(asyncio.Protocol, asyncio.BufferedProtocol):
    """One client's connection: requests parsed as they arrive and handed to `serve` (the connection's task, which
    asks for each with next()), each first through `arrived` (what it returns is what next() returns); the writer
    side (write, drain, close) for the task and the relay; `gone` and `on_gone` when the client goes away."""

    swept: tuple[int, float] | None = None  # idle.py's: the read_at a sweep saw, and when it first saw it
    head_since: float | None = None  # idle.py's: when a sweep first saw a request head in part

    def __init__(self, serve: Callable[[ClientConnection], Coroutine[Any, Any, None]],
                 arrived: Callable[[Request, ClientConnection], object], body_limit: int,
                 connections: set[ClientConnection] | None = None) -> None:
        self._serve, self._arrived = serve, arrived
        self._connections = set() if connections is None else connections  # the gateway's: each one open
        self.parser = RequestParser(body_limit)
        self.transport: asyncio.Transport = cast(asyncio.Transport, None)
        self.task: asyncio.Task[None] | None = None
        self.gone = False  # EOF or an error from the client: it sends nothing more (and may read nothing more)
        self.on_gone: Callable[[], object] | None = None  # the relay's cancel while one runs
        self._busy = False  # a request was handed over and its answer is not done
        self._ready: object | None = None  # handed over before the task asked for it
        self._waiter: asyncio.Future[object] | None = None  # the task, asking
        self._reading_paused = False
        self._writing_paused = False
        self._lost = False
        self._drains: list[asyncio.Future[None]] = []
        self.read_at = 0  # when its last read was (the one that completed the request being handed over)
        self.read_cpu = 0  # the thread's CPU time then, while the gateway keeps its time

    # asyncio's side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # TCP_NODELAY: both loops set it (loops.py)
        self._connections.add(self)  # no task yet: it starts with the first request (_start says why)

    def get_buffer(self, sizehint: int) -> memoryview:
        return http1.read_buffer()  # shared by every connection of this thread: copied out at once, below

    def buffer_updated(self, nbytes: int) -> None:  # asyncio's own loop (uvloop calls data_received: class docstring)
        self.data_received(bytes(http1.read_buffer()[:nbytes]))

    def data_received(self, data: bytes) -> None:
        self.read_at = time.perf_counter_ns()  # timing.now(): a request's `received` when the gateway keeps its time
        if timing.ON[0]:
            self.read_cpu = time.thread_time_ns()  # timing.cpu(): what the thread ran from here to the send
        if busy.ACTIVE[0] is not None:  # --busy-poll: the loop stays awake a while after each read (busy.py)
            busy.ACTIVE[0].poke()
        if not self._busy:
            self._advance(data)
            return
        self.parser.buffer += data
        if len(self.parser.buffer) > PAUSE_AT and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        self._went()
        return True  # open to write: the task closes it

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._connections.discard(self)
        self._went()
        for waiter in self._drains:
            if not waiter.done():
                waiter.set_exception(ConnectionResetError("Connection lost"))
                waiter.exception()  # seen: a drain cancelled meanwhile leaves nothing in the log
        self._drains.clear()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        for waiter in self._drains:
            if not waiter.done():
                waiter.set_result(None)
        self._drains.clear()

    # the task's side
    async def next(self) -> object:
        """The next request, or what `arrived` made of it: Closed when the client ends, BadRequest for a request
        that cannot be read (answered, then the connection closes)."""
        got, self._ready = self._ready, None  # handed before the task asked: still busy with it
        if got is None:
            self._busy = False  # the last request is done
            self._advance()  # the next may wait in the buffer already (sent before the last answer ended)
            got, self._ready = self._ready, None
        if self._reading_paused and (got is None or len(self.parser.buffer) <= PAUSE_AT):
            self._reading_paused = False  # drained below the bound, or what is buffered waits for more
            self.transport.resume_reading()
        if got is None:
            if self.gone:
                raise self.parser.ended()
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                got = await self._waiter
            finally:
                self._waiter = None
        if isinstance(got, BaseException):
            raise got
        return got

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    async def drain(self) -> None:
        """Until the client's side has taken what was written (asyncio's StreamWriter.drain, over this protocol)."""
        if self.transport.is_closing():
            await asyncio.sleep(0)  # connection_lost runs (a closing transport's last turn)
        if self._lost:
            raise ConnectionResetError("Connection lost")
        if self._writing_paused:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._drains.append(waiter)
            await waiter

    def close(self) -> None:
        self.transport.close()

    @property
    def busy(self) -> bool:
        """A request was handed over and its answer is not done."""
        return self._busy

    def drop(self) -> None:
        """Close a connection no request has come on (the gateway stops): it has no task, and none starts."""
        self.gone = True
        self._connections.discard(self)
        self.transport.close()

    def time_out(self, answer: bytes | None) -> None:
        """Past the client timeout (idle.py): `answer` written if given, and closed. What was read of a request is
        dropped, so its task (if one asks) sees the client gone, not a request cut short."""
        self.parser.abandon()
        if answer is not None:
            self.transport.write(answer)
        self.transport.close()

    # inside
    def _advance(self, data: bytes = b"") -> None:
        """A whole request (in the buffer, with `data` just read) to the task (through `arrived`), one at a time."""
        got: object
        try:
            request = self.parser.take(data) if data else self.parser.next()
            if request is None:
                return
            self._busy = True
            got = self._arrived(request, self)
        except Exception as failed:  # BadRequest, or a fault of the fast path's: the task raises it
            self._busy, got = True, failed
        waiter = self._waiter
        if waiter is None or waiter.done():
            self._ready = got
            if self.task is None:
                self._start()
        elif isinstance(got, BaseException):
            waiter.set_exception(got)
        else:
            waiter.set_result(got)

    def _start(self) -> None:
        """The connection's task, started once its first request is whole (or the client went before one was): a
        client sends its request as soon as it has connected, and a task started as the connection was made ran its
        first turn between the accept and the request's read, ~50 us on a cold core, all of it in the client's time
        to a first token. Started here, it runs while the engine works."""
        self.task = asyncio.get_running_loop().create_task(self._serve(self))

    def _went(self) -> None:
        if self.gone:
            return
        self.gone = True
        if self.task is None:
            self._start()  # the task says what went (nothing, or a request head cut short: a 400) and closes it
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(self.parser.ended())
        if self.on_gone is not None:
            self.on_gone()
