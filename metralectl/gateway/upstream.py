"""One connection from the gateway to an engine, as an asyncio Protocol: the engine's answer is passed to the
client's socket from inside data_received, in the callback that read it.

Why not a StreamReader: each piece read through one wakes the relay's task, which runs a loop turn later, behind
every other ready callback. Behind an engine that batches, pieces of 16-64 streams arrive together, and a new
request's first token waited behind all their task steps (on the lent H200, +0.36 ms of client TTFT at the
median at 16 and 64 streams, with the gateway's own time at 0.1 ms). Here a piece costs a write and a framing
check, and the relay's task only wakes for the answer's head, for back-pressure and for the answer's end.

Both protocol kinds at once, so each event loop takes its cheaper read (http1.py, above its read buffer, says how).
On asyncio's own loop, reads go into a buffer of the thread's (a BufferedProtocol, http1.read_buffer(): one for every
connection, as each read is copied out at once): its plain Protocol reads each time into a new 256 KiB bytes, and an
allocation that size is an mmap and munmap in glibc: ~25 us per read on the 2-core box, half the gateway's CPU per
relayed event. uvloop reads into a buffer of its own and calls data_received with the bytes: one Python call per
read, where its buffered path makes two (get_buffer, buffer_updated) and a memoryview.

Per request, what runs before the request is written to the engine and between a piece's read and its write to the
client is kept to few Python calls (no future made for the answer's head unless the task waits for it, a request
that is its own Start): at one stream each runs on a core that the time between requests left cold, where a call
costs several microseconds (heads.py says why).

The head is gathered here (at most HEAD_LIMIT) and parsed by http1; the body's framing (Content-Length, chunked
or until close) only decides where the answer ends and whether the connection may serve another request.
With a `Start` given to send(), the answer starts to the client in the callback that read its head: the client's
head and the first piece that came with it leave in one write, with no loop turn before it (the relay's task wakes
later, to wait for the end). Before, the head waited a turn for that task and went in a write of its own, the first
piece in a second one: two sends, and a client woken twice, on the path of every first token.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any, Protocol, cast

from metralectl.gateway import busy, heads, http1

CLIENT_BUFFER_HIGH = 256 * 1024  # unsent bytes to a client past which the engine's side is paused until it drains
# A written piece that ends with this ended an SSE stream (`data: [DONE]`, its blank line, the chunk's CRLF): the
# client has its answer. Many stop reading there and close (benchmarks/gateway_paired.py), before the last chunk,
# which llama-server writes apart.
SSE_END = b"[DONE]\n\n\r\n"
SSE_ENDS = (SSE_END, SSE_END + b"0\r\n", SSE_END + b"0\r\n\r")  # and the last chunk begun in the same read (seen:
# llama-server's `0\r\n` read with [DONE], its closing CRLF a read later)


class Client(Protocol):
    """What the relay uses of a client's connection (client.ClientConnection)."""

    transport: asyncio.Transport
    gone: bool  # it went away (EOF or an error): not the gateway stopping

    async def drain(self) -> None: ...


class Start:
    """Where an answer goes: it starts there in the callback that read its head (given to send()). marks: each
    piece's time from its read to its write to the client, in ns. A subclass counts the answer in answered(), or
    one that stopped short in cut() (dispatch.Flight: the request is its own Start, so sending one makes no second
    object)."""

    __slots__ = ("client", "marks")

    def __init__(self, client: Client, marks: list[int] | None = None) -> None:
        self.client, self.marks = client, marks

    def answered(self, response: http1.Response) -> None:
        """Its answer's last byte was handed to the client (in the callback that wrote it), or, for an SSE stream,
        its `data: [DONE]` before the relay was stopped. Called once at most, never with cut()."""

    def cut(self) -> None:
        """Its answer stopped before its end (or before it began), its task cancelled: the client went away, or the
        gateway stops. Called once at most, never with answered()."""


class Upstream(asyncio.Protocol, asyncio.BufferedProtocol):
    """An engine connection: idle in the pool, then one request's head awaited, then its body relayed."""

    def __init__(self, sock: socket.socket | None = None) -> None:
        """sock: connected in the fast path's callback (Pool.now), not yet under a transport: a request is written
        on it directly, and what the kernel did not take then goes out through the transport once it is made."""
        self.transport: asyncio.Transport | None = None
        self._sock, self._unsent = sock, b""
        self.closed = False  # EOF, an error, or closed by us: never taken again
        self._lost: Exception | None = None  # the error it closed with, if any (an until-close answer is cut by one)
        self._buffer = bytearray()  # the head so far, and what came after it until the relay starts
        self._asked = False  # a request was sent and its answer is not over: bytes are expected
        self._head: http1.Response | BaseException | None = None  # its answer's head, or why there is none, once known
        self._waiter: asyncio.Future[None] | None = None  # head()'s, made only when it waits (none on the send's path)
        self._relay: _Relay | None = None
        self._destination: Start | None = None
        self._started: bool | None = None  # the answer went to its client from the head's callback (keep-alive, done)

    # asyncio's side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not an isinstance check: another event loop's transports (uvloop's) do all a Transport does without being one
        self.transport = cast(asyncio.Transport, transport)  # TCP_NODELAY: both loops set it (loops.py)
        self._sock = None
        if self.closed:  # closed before asyncio adopted it (Pool.now)
            self.transport.close()
        elif self._unsent:
            unsent, self._unsent = self._unsent, b""
            self.transport.write(unsent)

    def get_buffer(self, sizehint: int) -> memoryview:
        return http1.read_buffer()  # shared by every connection of this thread: copied out at once, below

    def buffer_updated(self, nbytes: int) -> None:
        # Copied out at once: the buffer is read into again, and a client's transport may keep what it is given.
        self.data_received(bytes(http1.read_buffer()[:nbytes]))

    def data_received(self, data: bytes) -> None:
        if busy.ACTIVE[0] is not None:  # --busy-poll: awake for the next piece too (busy.py)
            busy.ACTIVE[0].poke()
        if self._relay is not None:
            self._relay.feed(data)
            return
        self._buffer += data
        if not self._asked:  # bytes on an idle connection: nothing asked for them, so it serves nobody
            self.close()
        elif self._head is None:
            self._parse_head()

    def eof_received(self) -> bool:
        self._ended(None)
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended(exc)

    # the gateway's side
    def send(self, data: bytes, start: Start | None = None) -> None:
        """A request's head and body (the answer's head is awaited with head()). start: where the answer goes; it
        starts there in the callback that parsed its head, else when relay() is called."""
        self._buffer.clear()
        self._asked, self._head = True, None
        self._destination, self._started = start, None
        if self.transport is not None:
            self.transport.write(data)
            return
        assert self._sock is not None  # made by Pool.now: its transport comes in a later turn of the loop
        try:
            sent = self._sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as e:  # refused or reset between the connect and now: head() raises, as for a lost one
            self._ended(e)
            return
        self._unsent = data[sent:]

    async def head(self) -> http1.Response:
        """The answer's head: http1.Closed when the engine closed before a byte of it (a kept-alive connection it
        had dropped), ConnectionResetError when it closed in the middle, http1.BadRequest(502) for a head that
        is not HTTP/1.x."""
        assert self._asked
        if self._head is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        head = self._head
        if isinstance(head, BaseException):
            raise head
        assert head is not None
        return head

    async def relay(self, response: http1.Response, start: Start) -> bool:
        """The body to the client as it arrives (re-framed as chunks when the engine's runs until it closes), its
        head first, unless it started as its head was read. Returns whether this connection may serve another request.
        ConnectionResetError when the engine closed before its answer's end. A client that reads the answer and
        closes at once cancels this task before it wakes: what counts the answer goes in start.answered, called too
        for a stream whose client closed after its `data: [DONE]` (_Relay.stop); one cut short goes in start.cut."""
        if self._started is None:
            self._start(response, start)
        relay = self._relay
        try:
            if relay is None:  # an answer with no body, written whole as it started
                return bool(self._started)
            while True:
                await asyncio.wait((relay.ended, relay.full), return_when=asyncio.FIRST_COMPLETED)
                if relay.ended.done():
                    return relay.ended.result()
                await start.client.drain()  # the client is slow: the engine's side waits (the kernel's buffers fill)
                relay.resume()
        finally:
            self._relay, self._head, self._destination = None, None, None
            self._asked = False  # idle again: any byte now closes it
            if relay is not None:
                relay.stop()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()  # (one not adopted yet is closed as it is: connection_made)

    def abandon(self) -> None:
        """Closed with its request given up before relay() took the answer (the task cancelled): the answer ends as
        relay()'s would, whether it had started from the head's callback (_Relay.stop) or not begun (Start.cut)."""
        if self._relay is not None:
            self._relay.stop()
        elif self._destination is not None and self._started is None:
            self._destination.cut()
        self._destination = None  # a head read after this starts nothing
        self.close()

    # inside
    def _parse_head(self) -> None:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > http1.HEAD_LIMIT:
                self._known(http1.BadRequest(502, f"the engine's answer head is over {http1.HEAD_LIMIT // 1024} KiB"))
                self.close()
            return
        head = bytes(self._buffer[:end + 2])
        del self._buffer[:end + 4]
        try:
            response = heads.response_head(head)
        except http1.BadRequest as bad:
            self._known(bad)
            self.close()
            return
        if self._destination is not None:  # first: the task's wake-up, below, is not on the way to the client
            self._start(response, self._destination)
        self._known(response)

    def _start(self, response: http1.Response, start: Start) -> None:
        """The answer to its client: its head, with what came after it, in one write."""
        if response.status in (204, 304) or response.length == 0:
            start.client.transport.write(http1.answer_head(response))
            self._started = response.keep_alive and not self._buffer and not self.closed
            start.answered(response)
            return
        self._started = False
        relay = _Relay(self, response, start)
        self._relay = relay
        if self._buffer:
            early, self._buffer = bytes(self._buffer), bytearray()
            relay.feed(early)
        relay.flush()  # the head alone, when no piece came with it
        if self.closed and not relay.ended.done():  # it closed before the relay started: cleanly, or with an error
            relay.source_ended(self._lost)

    def _ended(self, exc: Exception | None) -> None:
        self.closed = True
        self._lost = self._lost or exc
        if self._relay is not None:
            self._relay.source_ended(exc)
        elif self._asked and self._head is None:
            self._known(ConnectionResetError("the engine closed in the middle of its answer's head")
                        if self._buffer.strip() else http1.Closed())

    def _known(self, head: http1.Response | BaseException) -> None:
        """The answer's head, or why there is none: head() returns or raises it (it wakes if it waits)."""
        self._head = head
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class _Relay:
    """One answer's body, from the engine's data_received to the client's transport."""

    def __init__(self, upstream: Upstream, response: http1.Response, start: Start) -> None:
        loop = asyncio.get_running_loop()
        self.upstream, self.response, self.start, self.marks = upstream, response, start, start.marks
        self.client: asyncio.WriteTransport = start.client.transport  # type: ignore[assignment]
        self.prefix = http1.answer_head(response)  # the client's head, written with the first piece
        self.ended: asyncio.Future[bool] = loop.create_future()  # True: the connection may serve again
        self.full: asyncio.Future[None] = loop.create_future()  # the client's buffer passed CLIENT_BUFFER_HIGH
        self.left = response.length  # Content-Length: bytes still to come
        self.chunks = http1.ChunkEnd() if response.chunked else None
        self.paused = False
        self.whole = False  # an SSE stream's end was written (SSE_ENDS): the client has what it needs
        self.read_at = 0  # when the piece being fed was read (ns), while timing is kept

    def feed(self, piece: bytes) -> None:
        if self.ended.done():
            self.upstream.close()  # past the answer's end: nothing may follow on this connection
            return
        self.read_at = time.perf_counter_ns() if self.marks is not None else 0
        if self.left is not None:
            if len(piece) >= self.left:
                self._write(piece[:self.left])
                extra, self.left = len(piece) > self.left, 0
                self._finish(self.response.keep_alive and not extra)
            else:
                self.left -= len(piece)
                self._write(piece)
        elif self.chunks is not None:
            try:
                stop = self.chunks.feed(piece)
            except ConnectionResetError as torn:
                self._fail(torn)
                return
            self._write(piece if stop is None else piece[:stop])
            if stop is not None:
                # Not reused: llama-server often closes a connection after a streamed answer, some time after its
                # last chunk (seen directly too: a second request on it answered hundreds of ms late, or not at all),
                # and a request sent on it meanwhile is only sent again once that close arrives. A new loopback
                # connection costs less (measured: the same TTFT either way on a quiet connection).
                self._finish(False)
        else:  # until the engine closes: re-framed as chunks
            self._write(b"%x\r\n%s\r\n" % (len(piece), piece))
        self._mark()

    def _mark(self) -> None:
        """The piece being fed: its time from read to written, once."""
        if self.marks is not None and self.read_at:
            self.marks.append(time.perf_counter_ns() - self.read_at)
            self.read_at = 0

    def source_ended(self, exc: Exception | None) -> None:
        if self.ended.done():
            return
        if self.left is None and self.chunks is None and exc is None:
            self._write(b"0\r\n\r\n")
            self._finish(False)
        else:
            self._fail(ConnectionResetError("the engine closed before the end of its answer"))

    def resume(self) -> None:
        self.full = asyncio.get_running_loop().create_future()
        if self.paused and not self.upstream.closed and self.upstream.transport is not None:
            self.upstream.transport.resume_reading()
        self.paused = False

    def stop(self) -> None:
        """The relay is over (its end, an error, or the task cancelled: the client gone, or the gateway stopping).
        Cancelled after an SSE stream's `data: [DONE]` was written, it was answered; before, it was cut."""
        if not self.ended.done():
            self.ended.cancel()
            if self.whole:
                self.start.answered(self.response)
            else:
                self.start.cut()

    def flush(self) -> None:
        """The client's head, if no piece has taken it along yet."""
        if self.prefix:
            self._write(b"")

    def _write(self, data: bytes) -> None:
        if self.prefix:
            data, self.prefix = self.prefix + data, b""
        if not data or self.client.is_closing():
            return  # a client gone: its task is being cancelled (ClientConnection.on_gone), which closes this connection
        self.client.write(data)
        if not self.whole:  # once [DONE] is written, nothing after it matters to the client
            self.whole = data.endswith(SSE_ENDS)
        if not self.paused and self.client.get_write_buffer_size() > CLIENT_BUFFER_HIGH:
            self.paused = True
            if self.upstream.transport is not None:
                self.upstream.transport.pause_reading()
            if not self.full.done():
                self.full.set_result(None)

    def _finish(self, reusable: bool) -> None:
        if not self.ended.done():
            self._mark()
            self.start.answered(self.response)
            self.ended.set_result(reusable)

    def _fail(self, exc: Exception) -> None:
        self.upstream.close()
        if not self.ended.done():
            _fail_seen(self.ended, exc)


def _fail_seen(future: asyncio.Future[Any], exc: BaseException) -> None:
    """Sets exc on future, marked as seen: the task that awaits it raises it, and one cancelled meanwhile (its
    client went away) leaves no "exception was never retrieved" in the log."""
    future.set_exception(exc)
    future.exception()
