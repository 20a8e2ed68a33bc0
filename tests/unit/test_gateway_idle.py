"""Client connections that hold the gateway without using it are closed past the client timeout (idle.py): one that
never sends, one kept alive after its answer, a body that stops coming, a head sent a byte at a time (408). One the
gateway is serving is never closed, however long its answer takes. A real gateway on loopback, a 0.3 s timeout."""

from __future__ import annotations

import asyncio
import json

from metralectl.gateway.server import Limits
from tests.unit.test_gateway_pool import EVENTS, Engine, chat, gateway_before

LIMITS = Limits(client_timeout_s=0.3)
ENOUGH_S = 10.0  # a bound on waiting, never a measured window: the sweep closes within a few of its 75 ms intervals


def _timeouts(gateway: object, kind: str) -> float:
    return gateway.metrics.client_timeouts.labels(kind)._value.get()  # type: ignore[attr-defined]


def _body() -> bytes:
    return json.dumps({"model": "stub", "stream": True, "messages": []}).encode()


def test_a_connection_that_never_sends_is_closed_and_counted() -> None:
    async def go() -> None:
        async with gateway_before(Engine().handle, LIMITS) as (gateway, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert await asyncio.wait_for(reader.read(), ENOUGH_S) == b""  # closed, nothing said
            writer.close()
            assert _timeouts(gateway, "idle") == 1 and _timeouts(gateway, "head") == 0
            await chat(port)  # the gateway serves on

    asyncio.run(go())


def test_a_kept_alive_connection_is_closed_once_idle_after_its_answer() -> None:
    async def go() -> None:
        async with gateway_before(Engine().handle, LIMITS) as (gateway, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            body = _body()
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
            answer = await asyncio.wait_for(reader.read(), ENOUGH_S)  # the answer, then the close
            assert answer.startswith(b"HTTP/1.1 200") and answer.count(b"data: ") == EVENTS
            assert answer.endswith(b"0\r\n\r\n")  # whole: closed only after it
            writer.close()
            assert _timeouts(gateway, "idle") == 1

    asyncio.run(go())


def test_a_body_that_stops_coming_is_closed() -> None:
    async def go() -> None:
        async with gateway_before(Engine().handle, LIMITS) as (gateway, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\"")
            assert await asyncio.wait_for(reader.read(), ENOUGH_S) == b""
            writer.close()
            assert _timeouts(gateway, "idle") == 1

    asyncio.run(go())


def test_a_head_sent_a_byte_at_a_time_gets_408_however_often_a_byte_comes() -> None:
    async def go() -> None:
        async with gateway_before(Engine().handle, LIMITS) as (gateway, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            answer = asyncio.ensure_future(reader.read())
            head = b"POST /v1/chat/completions HTTP/1.1\r\n" + b"X-Slow: " + b"a" * 2_000
            for byte in head:  # a byte every 20 ms: the connection is never idle for long, its head never whole
                if answer.done():
                    break
                writer.write(bytes([byte]))
                await asyncio.sleep(0.02)
            got = await asyncio.wait_for(answer, ENOUGH_S)
            assert got.startswith(b"HTTP/1.1 408 Request Timeout\r\n") and b"Connection: close" in got
            assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
            writer.close()
            assert _timeouts(gateway, "head") == 1

    asyncio.run(go())


def test_an_answer_slower_than_the_timeout_is_never_cut() -> None:
    slow = Engine(first_after=0.8, gap=0.2)  # a first token after more than twice the client timeout, then slow

    async def go() -> None:
        async with gateway_before(slow.handle, LIMITS) as (gateway, port):
            await chat(port)  # whole (chat() checks every event and the end)
            assert _timeouts(gateway, "idle") == 0 and _timeouts(gateway, "head") == 0

    asyncio.run(go())
