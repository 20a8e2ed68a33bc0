"""The gateway's engine connections (pool.py) and its own time per request (timing.py), with the real Gateway
relaying to a stub engine on loopback that streams chunked SSE as llama-server does: a streamed request finds
a connection opened ahead (no connect on its path), a spare the engine dropped is not used, and with
METRALECTL_GATEWAY_TIMING the gateway writes one line per relayed request as it stops (nothing without it)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import socket
import time
from pathlib import Path
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from metralectl.gateway import timing
from metralectl.gateway.pool import SPARES
from metralectl.gateway.routes import Route, Table
from metralectl.gateway.server import Gateway, Limits, serve

EVENTS = 5


class Engine:
    """Answers each POST with EVENTS SSE events, chunked, then ends the chunked body and closes (llama-server's
    way after a stream). Keeps when each connection was accepted and when its request arrived."""

    def __init__(self, drop_idle_after: float | None = None, first_after: float = 0.0, gap: float = 0.005) -> None:
        self.accepted: list[float] = []
        self.requested: list[tuple[int, float]] = []  # (connection index, when its request arrived)
        self.drop_idle_after = drop_idle_after
        self.first_after, self.gap = first_after, gap  # seconds before the answer's head, and between its events

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = len(self.accepted)
        self.accepted.append(time.monotonic())
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.drop_idle_after)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError):
            writer.close()  # an idle connection dropped (a keep-alive timeout)
            return
        self.requested.append((index, time.monotonic()))
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        await asyncio.sleep(self.first_after)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(EVENTS):
            data = b'data: {"choices":[{"delta":{"content":"w%d"}}]}\n\n' % i
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()
            await asyncio.sleep(self.gap)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()


class Fixed:
    def __init__(self, port: int) -> None:
        self.route = Route("stub", f"http://127.0.0.1:{port}", "127.0.0.1", port, ("stub",), ("stub",))

    def lifecycle(self) -> tuple[None, None]:
        return None, None

    def scan(self) -> Table:
        return Table((self.route,), by_name={"stub": self.route})

    def close(self) -> None:
        pass


async def chat(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"model": "stub", "stream": True, "messages": []}).encode()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(body), body))
    answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert answer.count(b"data: ") == EVENTS and answer.endswith(b"0\r\n\r\n"), answer
    return answer


@contextlib.asynccontextmanager
async def gateway_before(handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
                         limits: Limits = Limits()) -> AsyncIterator[tuple[Gateway, int]]:
    """A gateway serving on loopback in front of an engine that answers with `handle`: (it, its port)."""
    upstream = await asyncio.start_server(handle, "127.0.0.1", 0)
    gateway = Gateway(Fixed(upstream.sockets[0].getsockname()[1]), limits)  # type: ignore[arg-type]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    ready = asyncio.Event()
    server = asyncio.ensure_future(serve(gateway, sock, lambda _table: ready.set()))
    await ready.wait()
    try:
        yield gateway, sock.getsockname()[1]
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
        upstream.close()


async def session(engine: Engine, gaps: list[float], burst: int = 1) -> Gateway:
    """A gateway in front of `engine`; after each gap (s), `burst` streamed requests at once; returns the stopped
    gateway."""
    async with gateway_before(engine.handle) as (gateway, port):
        for gap in gaps:
            await asyncio.sleep(gap)
            await asyncio.gather(*(chat(port) for _ in range(burst)))
    return gateway


def test_a_streamed_request_finds_an_engine_connection_opened_before_it_arrived() -> None:
    engine = Engine()
    asyncio.run(session(engine, [0, 0.3, 0.3]))
    assert len(engine.requested) == 3
    for index, at in engine.requested[1:]:  # the later requests: on a connection made ahead, long before
        assert at - engine.accepted[index] > 0.2, (engine.accepted, engine.requested)


def test_a_burst_of_requests_finds_as_many_connections_opened_ahead_the_next_time() -> None:
    # An engine that batches ends its streams together, and their clients send again together: one spare left all
    # but one request of each burst to connect on its way (~1 ms at the median on the lent H200 at 16 streams).
    engine = Engine()
    gateway = asyncio.run(session(engine, [0, 0.3, 0.3, 0.3], burst=8))
    assert len(engine.requested) == 32
    late = [(index, at) for index, at in engine.requested[16:]]  # the third and fourth bursts
    inline = [index for index, at in late if at - engine.accepted[index] < 0.2]
    assert not inline, f"{len(inline)} of 16 requests connected on their way: {engine.accepted}, {engine.requested}"
    assert gateway.pool.opened <= 32 + 8 + 1  # no more connections than the requests and the spares kept


def test_a_spare_the_engine_dropped_is_not_used_and_the_request_is_answered() -> None:
    engine = Engine(drop_idle_after=0.1)
    gateway = asyncio.run(session(engine, [0, 0.5, 0.5]))
    assert len(engine.requested) == 3  # every request answered (chat() checks each stream), none on a dropped one
    assert gateway.pool.opened >= 4  # the dropped spares were replaced
    assert list(gateway.pool._wanted.values()) == [SPARES]  # found closed, each time: no burst, none more ahead


def test_the_gateway_keeps_its_own_time_per_request_only_when_asked(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "timing.jsonl"
    asyncio.run(session(Engine(), [0, 0.05]))
    assert not out.exists()
    monkeypatch.setenv("METRALECTL_GATEWAY_TIMING", str(out))
    before = time.monotonic_ns()
    asyncio.run(session(Engine(), [0, 0.05, 0.05]))
    every: list[dict[str, Any]] = [json.loads(line) for line in out.read_text().splitlines()]
    lines = [line for line in every if "up_ns" in line]  # the requests (a collection, a poll: lines of their own)
    assert len(lines) == 3, lines
    for line in lines:
        assert before < line["at_ns"] < time.monotonic_ns()
        assert 0 < line["up_ns"] < 1e9 and 0 < line["first_ns"] < 1e9
        assert 0 <= line["up_cpu_ns"] <= line["up_ns"] + 1_000_000 and line["tasked"] is False  # sent as read
        # the body's later pieces: EVENTS events 5 ms apart and the end, one read each unless a busy loop merged some
        assert 1 <= line["pieces"] <= EVENTS and line["pieces_max_ns"] * line["pieces"] >= line["pieces_sum_ns"] > 0
    windows = [line for line in every if "window" in line]  # the lifecycle poll's (every 50 ms) and the scans'
    assert {w["window"] for w in windows} >= {"lifecycle"}, windows
    assert all(before < w["at_ns"] < time.monotonic_ns() and 0 < w["ns"] < 60e9 for w in windows)



class Collecting(Engine):
    """An engine in the gateway's own process that makes a full garbage collection as each request arrives."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        gc.collect()
        await super().handle(reader, writer)


def test_with_its_time_kept_the_gateway_also_keeps_each_garbage_collections_pause(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "timing.jsonl"
    monkeypatch.setenv("METRALECTL_GATEWAY_TIMING", str(out))
    before = time.monotonic_ns()
    asyncio.run(session(Collecting(), [0, 0.05]))
    every = [json.loads(line) for line in out.read_text().splitlines()]
    assert len([line for line in every if "up_ns" in line]) == 2, every
    pauses = [line for line in every if "gc" in line]
    assert len([p for p in pauses if p["gc"] == 2]) >= 2, pauses  # the engine's two, at least
    for pause in pauses:
        assert set(pause) == {"gc", "at_ns", "pause_ns"}
        assert before < pause["at_ns"] < time.monotonic_ns() and 0 < pause["pause_ns"] < 60e9
    assert timing._on_collection not in gc.callbacks  # stopped with the gateway: none kept after


# Pool.now(): with no spare left, a connection to a loopback engine made and written to within the read callback

def _listener() -> socket.socket:
    """A plain listening socket on loopback (no event loop behind it): what reached the engine is read from it
    directly, so the test can ask before the gateway's loop has turned once."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    return server


def test_with_no_spare_left_a_request_reaches_a_loopback_engine_before_the_event_loop_turns() -> None:
    from metralectl.gateway.pool import Pool

    server = _listener()
    address = server.getsockname()
    request = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"

    async def go() -> bytes:
        pool = Pool(5.0)
        got = pool.now(address)
        assert got is not None and got[1] is False and pool.opened == 1  # made here, not taken from the pool
        conn = got[0]
        conn.send(request)
        engine, _ = server.accept()  # no await since now(): connected and written inside the call
        engine.setblocking(False)
        arrived = engine.recv(65536)
        engine.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        head = await asyncio.wait_for(conn.head(), 5)  # read once asyncio adopted the socket
        assert head.status == 200 and conn.transport is not None
        conn.close()
        engine.close()
        pool.close()
        return arrived

    try:
        assert asyncio.run(go()) == request
    finally:
        server.close()


def test_a_request_larger_than_the_socket_takes_at_once_goes_out_whole_once_adopted() -> None:
    from metralectl.gateway.pool import Pool

    server = _listener()
    body = bytes(range(256)) * (16 * 1024)  # 4 MiB: past what a new socket's buffer takes in one send
    request = b"POST /v1/embeddings HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body

    async def go() -> bytes:
        pool = Pool(5.0)
        got = pool.now(server.getsockname())
        assert got is not None
        got[0].send(request)
        engine, _ = server.accept()
        engine.setblocking(False)
        received = bytearray()
        while len(received) < len(request):  # the rest goes out through the transport, turns of the loop later
            try:
                received += engine.recv(1 << 20)
            except BlockingIOError:
                await asyncio.sleep(0.001)
        got[0].close()
        engine.close()
        pool.close()
        return bytes(received)

    try:
        assert asyncio.run(go()) == request
    finally:
        server.close()


def test_no_connection_is_made_in_the_callback_to_an_engine_refusing_or_off_loopback() -> None:
    from metralectl.gateway.pool import Pool, _loopback

    held = socket.socket()  # bound, never listening: a connect to it is refused (and no one else gets the port)
    held.bind(("127.0.0.1", 0))

    async def go() -> None:
        pool = Pool(5.0)
        assert pool.now(held.getsockname()) is None  # refused at once: the task connects (and reports it)
        assert pool.now(("192.0.2.1", 8000)) is None  # another host: never a connect that could wait, here
        assert pool.now(("localhost", 8000)) is None  # a name: never resolved in a callback
        assert pool.opened == 0
        pool.close()

    try:
        asyncio.run(go())
    finally:
        held.close()
    assert _loopback("127.0.0.1") == socket.AF_INET and _loopback("127.3.0.9") == socket.AF_INET
    assert _loopback("::1") == socket.AF_INET6
    for host in ("localhost", "10.0.0.1", "", "127.0.0.1\n", "0.0.0.0", "::", "127.0.0.1; rm -rf /"):
        assert _loopback(host) is None, host


def test_a_spare_found_closed_on_top_is_dropped_and_counted_before_a_connection_is_made() -> None:
    from metralectl.gateway.pool import Pool
    from metralectl.gateway.upstream import Upstream

    server = _listener()
    address = server.getsockname()

    async def go() -> None:
        pool = Pool(5.0, spares=1)
        pool._wanted[address] = 3  # grown by earlier bursts
        dead = Upstream()
        dead.closed = True  # the engine dropped it after its keep-alive timeout
        pool._idle[address] = [dead]
        got = pool.now(address)
        assert got is not None and got[1] is False
        assert pool._idle[address] == [] and pool._wanted[address] == 2  # one fewer wanted: the load went away
        got[0].close()
        pool.close()

    try:
        asyncio.run(go())
    finally:
        server.close()


def test_a_request_sent_again_after_its_kept_connection_was_found_closed_says_so_in_its_time(tmp_path: Path) -> None:
    out = tmp_path / "timing.jsonl"
    timing.keep(1_000, 3_000_000, [10, 20], resent=True)
    timing.keep(2_000, 50_000, [10])
    assert timing.dump(out) == 2
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["resent"] for line in lines] == [True, False]
    assert lines[0]["up_ns"] == 3_000_000 - 1_000
