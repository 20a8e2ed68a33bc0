"""The gateway's relay of an engine's answer (upstream.py), with the real Gateway in front of a scripted engine on
loopback that sends its answer in pieces cut anywhere: every framing reaches the client whole, a kept-alive
engine connection serves the next request, an engine that breaks off or answers garbage gets the client a 502 or
a cut connection (never a hang, never a dead connection task), and a client that does not read holds the engine
back instead of the gateway gathering the answer."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from metralectl.gateway import upstream
from metralectl.gateway.client import ClientConnection
from metralectl.gateway.server import Gateway, serve
from tests.unit.test_gateway_pool import gateway_before as pool_gateway_before

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class Engine:
    """Runs `answer` for each request it reads; keeps which connection each request came on."""

    def __init__(self, answer: Handler) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[int] = []  # the connection index of each request
        self.closed = asyncio.Event()  # a connection that had a request ended from the gateway's side

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index, self.connections = self.connections, self.connections + 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    if index in self.requests:
                        self.closed.set()
                    return
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                await reader.readexactly(length)
                self.requests.append(index)
                await self.answer(reader, writer, len(self.requests))
        except ConnectionError:
            self.closed.set()
        finally:
            writer.close()


def gateway_before(engine: Engine) -> Any:
    return pool_gateway_before(engine.handle)


def request(close: bool = False) -> bytes:
    body = json.dumps({"model": "stub", "messages": []}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s"
            % (b"Connection: close\r\n" if close else b"", len(body), body))


async def read_answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """(head, de-chunked or Content-Length body) of one answer on a kept-alive connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length")), None)
    if length is not None:
        return head, await reader.readexactly(length)
    assert b"transfer-encoding: chunked" in head.lower(), head
    body = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
        if size == 0:
            assert await reader.readuntil(b"\r\n") == b"\r\n"
            return head, bytes(body)
        body += await reader.readexactly(size)
        assert await reader.readexactly(2) == b"\r\n"


async def in_pieces(writer: asyncio.StreamWriter, data: bytes, cuts: list[int]) -> None:
    """data written in pieces cut at `cuts`, each drained and given a loop turn (so each is its own read)."""
    start = 0
    for cut in [*cuts, len(data)]:
        if cut > start:
            writer.write(data[start:cut])
            await writer.drain()
            await asyncio.sleep(0.002)
        start = cut


BODY = b'{"id":"x","choices":[{"message":{"content":"hello"}}]}'
SSE = b"".join(b'data: {"choices":[{"delta":{"content":"w%d"}}]}\n\n' % i for i in range(6))


def chunked(data: bytes, size: int) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(data[i:i + size]), data[i:i + size])
                    for i in range(0, len(data), size)) + b"0\r\n\r\n"


@pytest.mark.parametrize("framing", ["length", "chunked", "until-close"])
def test_each_framing_reaches_the_client_whole_however_the_engine_cuts_it(framing: str) -> None:
    heads = {"length": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY),
             "chunked": b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
             "until-close": b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"}
    payload = {"length": BODY, "chunked": chunked(SSE, 37), "until-close": SSE}[framing]
    wire = heads[framing] + payload
    cuts = [1, 9, len(heads[framing]) - 3, len(heads[framing]) + 1, len(wire) - 6, len(wire) - 2, len(wire) - 1]

    async def answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        await in_pieces(writer, wire, sorted(set(cuts)))
        if framing == "until-close":
            writer.close()

    async def go() -> tuple[list[bytes], list[int]]:
        engine = Engine(answer)
        async with gateway_before(engine) as (_gateway, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            bodies = []
            for _ in range(2):  # two on one client connection: the first answer's end was found exactly
                writer.write(request())
                head, body = await read_answer(reader)
                assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
                bodies.append(body)
            writer.close()
            return bodies, engine.requests

    bodies, on = asyncio.run(go())
    assert bodies == [BODY, BODY] if framing == "length" else bodies == [SSE, SSE]
    if framing == "length":
        assert on[0] == on[1]  # the kept-alive engine connection served the second request too
    else:
        assert on[0] != on[1]  # a streamed or until-close answer's connection is not used again


@pytest.mark.parametrize("wire, says", [
    (b"HTTP/1.1 200 OK\r\nContent-Len", "closed in the middle"),
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not HTTP/1.x"),
    (b"HTTP/1.1 200 OK\r\nX-Fill: " + b"a" * (70 * 1024) + b"\r\n\r\n", "over 64 KiB"),
    (b"HTTP/1.1 200 OK\nSet-Cookie: by-the-engine\r\nContent-Length: 0\r\n\r\n", "not HTTP/1.x"),  # a header in its reason
    (b"HTTP/1.1 \xb200 OK\r\nContent-Length: 0\r\n\r\n", "not HTTP/1.x"),  # '²': isdigit() but not int()
], ids=["cut", "not-http", "too-long", "reason-with-lf", "status-not-ascii"])
def test_an_engine_whose_head_breaks_off_or_is_not_http_gets_the_client_a_502_and_the_gateway_serves_on(
        wire: bytes, says: str) -> None:
    async def answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        if n == 1:
            await in_pieces(writer, wire, [5])
            writer.close()
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY))

    async def go() -> list[tuple[bytes, bytes]]:
        async with gateway_before(Engine(answer)) as (_gateway, port):
            answers = []
            for _ in range(2):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(request())
                answers.append(await asyncio.wait_for(read_answer(reader), 30))
                writer.close()
            return answers

    (first_head, first), (second_head, second) = asyncio.run(go())
    assert first_head.startswith(b"HTTP/1.1 502 ")
    error = json.loads(first)["error"]
    assert error["type"] == "server_error" and says in error["message"], error
    assert second_head.startswith(b"HTTP/1.1 200 ") and second == BODY


def test_an_engine_that_closes_in_the_middle_of_its_body_cuts_the_clients_answer_and_the_gateway_serves_on() -> None:
    async def answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        if n == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(SSE, 20)[:90])
            await writer.drain()
            writer.close()
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY))

    async def go() -> tuple[bytes, bytes, str]:
        async with gateway_before(Engine(answer)) as (gateway, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request())
            cut = await asyncio.wait_for(reader.read(), 30)  # the gateway closes the client's connection
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request())
            _head, body = await asyncio.wait_for(read_answer(reader), 30)
            writer.close()
            return cut, body, gateway.metrics.text()[0].decode()

    cut, body, metrics = asyncio.run(go())
    assert cut.startswith(b"HTTP/1.1 200 OK\r\n") and not cut.endswith(b"0\r\n\r\n")
    assert body == BODY
    assert 'metralectl_gateway_errors_total{model="stub",reason="upstream"} 1.0' in metrics


def test_a_client_that_does_not_read_holds_the_engine_back_and_then_gets_every_byte() -> None:
    total, piece = 96 * 1024 * 1024, 1024 * 1024
    sent = [0]

    async def answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        for i in range(total // piece):
            writer.write(bytes([i % 251]) * piece)
            await writer.drain()
            sent[0] += piece

    async def go() -> tuple[int, str, str]:
        async with gateway_before(Engine(answer)) as (_gateway, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
            writer.write(request())
            held, still = -1, 0
            while still < 20:  # until what the engine got out stops growing (it does, or the test times out)
                await asyncio.sleep(0.05)
                held, still = sent[0], still + 1 if sent[0] == held else 0
            digest = hashlib.sha256()
            _head = await reader.readuntil(b"\r\n\r\n")
            left = total
            while left:
                data = await reader.read(min(left, 1 << 20))
                assert data, "the answer was cut"
                digest.update(data)
                left -= len(data)
            writer.close()
            return held, digest.hexdigest(), hashlib.sha256(b"".join(
                bytes([i % 251]) * piece for i in range(total // piece))).hexdigest()

    held, got, expected = asyncio.run(asyncio.wait_for(go(), 120))
    # What socket buffers on loopback hold (the kernel's, sized by tcp_rmem/tcp_wmem) plus the gateway's own bound:
    # well under the answer, so the gateway paused its reads rather than gathering it.
    assert held < total // 2, held
    assert got == expected


def test_both_sides_read_into_one_buffer_of_the_threads_not_one_per_connection() -> None:
    """asyncio's default read makes a new 256 KiB bytes each time, an mmap and munmap in glibc (upstream.py); a
    buffer per connection was 64 KiB allocated and zeroed as each client connected, on its first token's path. One
    per thread (each read is copied out at once), another thread's its own."""
    import threading

    from metralectl.gateway import http1

    assert issubclass(upstream.Upstream, asyncio.BufferedProtocol)
    assert issubclass(ClientConnection, asyncio.BufferedProtocol)
    client = object.__new__(ClientConnection)  # get_buffer() reads nothing of it
    one, two = upstream.Upstream(), upstream.Upstream()
    assert client.get_buffer(-1) is one.get_buffer(-1) is two.get_buffer(-1)
    assert len(one.get_buffer(-1)) < 128 * 1024  # glibc's mmap threshold
    other: list[memoryview] = []
    thread = threading.Thread(target=lambda: other.append(upstream.Upstream().get_buffer(-1)))
    thread.start()
    thread.join()
    assert other[0] is not one.get_buffer(-1)


def test_a_piece_from_the_engine_is_written_to_the_client_in_the_callback_that_read_it() -> None:
    """No turn of the event loop between an engine's piece read and its write to the client: behind a batching
    engine, a turn waited behind every other stream's pieces (upstream.py)."""
    written: list[tuple[bytes, int]] = []
    turns = [0]

    class Client(_Client):
        def write(self, data: bytes) -> None:
            written.append((data, turns[0]))

    async def go() -> bool:
        loop = asyncio.get_running_loop()

        def tick() -> None:
            turns[0] += 1
            loop.call_soon(tick)

        loop.call_soon(tick)
        conn = upstream.Upstream()
        conn.connection_made(_NoTransport())  # type: ignore[arg-type]  # duck-typed, as uvloop's transports are
        conn.send(b"POST / HTTP/1.1\r\n\r\n")
        conn.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        response = await conn.head()
        relaying: Any = asyncio.ensure_future(conn.relay(response, upstream.Start(Client())))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        for i in range(3):
            at = turns[0]
            conn.data_received(b"5\r\nhell%d\r\n" % i)
            assert written[-1] == (b"5\r\nhell%d\r\n" % i, at)
        conn.data_received(b"0\r\n\r\n")
        return bool(await relaying)

    assert asyncio.run(go()) is False  # a chunked answer's connection is not reused


def test_an_answers_head_and_the_piece_read_with_it_go_to_the_client_in_one_write_in_the_callback_that_read_them(
) -> None:
    """The first token's path: before, the head waited a loop turn for the relay's task and went in a write of its
    own, the piece read with it in a second: two sends, and a client woken twice (upstream.py)."""
    written: list[bytes] = []

    class Client(_Client):
        def write(self, data: bytes) -> None:
            written.append(data)

    async def go() -> bool:
        conn = upstream.Upstream()
        conn.connection_made(_NoTransport())  # type: ignore[arg-type]
        start = upstream.Start(Client())  # type: ignore[arg-type]
        conn.send(b"POST / HTTP/1.1\r\n\r\n", start)
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                           b"7\r\ndata: 1\r\n")
        assert written == [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                           b"7\r\ndata: 1\r\n"]  # one write, before this coroutine gave the loop a turn
        conn.data_received(b"0\r\n\r\n")
        assert written[1:] == [b"0\r\n\r\n"]
        return await conn.relay(await conn.head(), start)  # the task only learns of the end

    assert asyncio.run(go()) is False
    written.clear()

    async def head_alone() -> None:  # a head with no piece behind it yet goes at once (a client waits on it)
        conn = upstream.Upstream()
        conn.connection_made(_NoTransport())  # type: ignore[arg-type]
        conn.send(b"POST / HTTP/1.1\r\n\r\n", upstream.Start(Client()))  # type: ignore[arg-type]
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
        assert written == [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"]
        conn.data_received(b"ok")
        assert written[1:] == [b"ok"]

    asyncio.run(head_alone())


def test_an_answer_running_until_close_that_an_error_cut_before_its_relay_started_is_not_ended_as_whole() -> None:
    """An answer framed by the engine's close ends with the close, but only a clean one: a reset cuts it. Before, a
    connection that had closed, with an error or not, before the relay started ended the client's answer cleanly."""
    written: list[bytes] = []

    class Client(_Client):
        def write(self, data: bytes) -> None:
            written.append(data)

    async def go() -> None:
        conn = upstream.Upstream()
        conn.connection_made(_NoTransport())  # type: ignore[arg-type]
        conn.send(b"POST / HTTP/1.1\r\n\r\n")  # no Start: the relay starts when the task asks for it
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\npart of it")
        conn.connection_lost(ConnectionResetError("reset by peer"))
        response = await conn.head()
        with pytest.raises(ConnectionResetError):
            await conn.relay(response, upstream.Start(Client()))  # type: ignore[arg-type]

    asyncio.run(go())
    sent = b"".join(written)
    assert sent.endswith(b"a\r\npart of it\r\n") and not sent.endswith(b"0\r\n\r\n"), sent  # cut, not ended


def test_an_answer_is_counted_when_its_last_byte_is_written_even_if_its_client_leaves_before_the_task_wakes() -> None:
    """A client that reads the answer and closes at once cancels the relay's task (ClientConnection.on_gone), on a busy
    gateway before the task woke from the answer's end: a CI run counted 4 requests of 5 that way."""
    counted: list[int] = []

    async def go() -> bool:
        conn = upstream.Upstream()
        conn.connection_made(_NoTransport())  # type: ignore[arg-type]
        conn.send(b"POST / HTTP/1.1\r\n\r\n")
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234")
        response = await conn.head()
        class Counted(upstream.Start):
            def answered(self, response: Any) -> None:
                counted.append(1)

        start = Counted(_Client(), [])  # type: ignore[arg-type]
        relaying: Any = asyncio.ensure_future(conn.relay(response, start))
        await asyncio.sleep(0)
        conn.data_received(b"56789")  # the answer's end, written to the client in this callback
        relaying.cancel()  # the client's EOF, seen before the relay's task woke
        try:
            await relaying
        except asyncio.CancelledError:
            return True
        return False

    assert asyncio.run(go()) is True
    assert counted == [1]


class _Client:
    """What the relay uses of a client's StreamWriter and its transport (here, one object)."""

    def __init__(self) -> None:
        self.transport = self

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0


class _NoTransport:
    """What the relay uses of a transport, and not an asyncio.Transport (uvloop's TCPTransport is not one either)."""

    def get_extra_info(self, name: str) -> None:
        return None

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def test_while_it_serves_the_gateway_takes_the_gil_back_from_its_scan_thread_within_half_a_millisecond() -> None:
    """A scan computing on its worker thread would otherwise hold every relay back for Python's default 5 ms."""
    import sys

    before = sys.getswitchinterval()

    async def go() -> float:
        async def answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

        async with gateway_before(Engine(answer)):
            return sys.getswitchinterval()

    assert asyncio.run(go()) <= 0.0005
    assert sys.getswitchinterval() == before  # given back as it stops
