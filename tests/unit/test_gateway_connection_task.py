"""A client connection's task starts with its first request, not as the connection is made (client.py's _start):
the request goes to the engine first, and connections that end without a request, or are open as the gateway stops,
leave nothing behind."""

from __future__ import annotations

import asyncio
from typing import Any

from metralectl.gateway.dispatch import Flight
from metralectl.gateway.http1 import Request
from tests.unit.test_gateway_pool import Engine, chat, gateway_before


def _unasked(gateway: Any) -> list[Any]:
    return [conn for conn in gateway.connections if conn.task is None]


async def _until(test: Any, what: str) -> None:
    for _ in range(200):
        if test():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


def test_a_request_reaches_its_engine_before_its_connections_task_first_runs() -> None:
    """A client sends its request as soon as it has connected; a task started as the connection was made ran its
    first turn between the accept and the request's read, in the client's time to a first token."""
    engine = Engine()
    order: list[str] = []

    async def go() -> None:
        async with gateway_before(engine.handle) as (gateway, port):
            await chat(port)  # the first request connects to the engine; the spare opened after it is for the next
            await _until(lambda: gateway.pool._idle.get(("127.0.0.1", gateway.table.routes[0].port)), "a spare")
            handle, arrived = gateway.handle, gateway.arrived

            async def watched_handle(client: Any) -> None:
                order.append("task")
                await handle(client)

            def watched_arrived(request: Request, client: Any) -> object:
                got = arrived(request, client)
                order.append("sent" if isinstance(got, Flight) else type(got).__name__)
                return got

            gateway.handle, gateway.arrived = watched_handle, watched_arrived  # type: ignore[method-assign]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            await _until(lambda: _unasked(gateway), "the connection made")
            assert order == [] and not gateway._clients  # connected, nothing sent: no task yet
            writer.close()
            await _until(lambda: order == ["task"], "the task of the connection that went without a word")
            await chat(port)

    asyncio.run(go())
    assert order == ["task", "sent", "task"]  # the first: the connection that sent nothing, its task run as it went


def test_connections_that_end_without_a_request_leave_no_task_and_a_cut_head_is_answered_400() -> None:
    async def go() -> None:
        async with gateway_before(Engine().handle) as (gateway, port):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            await _until(lambda: _unasked(gateway), "the connection made")
            writer.close()  # gone without a word
            await _until(lambda: not gateway.connections and not gateway._clients, "its end")

            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\n")
            writer.write_eof()  # a head cut short
            answer = await asyncio.wait_for(reader.read(), 10)
            assert answer.startswith(b"HTTP/1.1 400 ") and b"in the middle of a request head" in answer
            writer.close()
            await _until(lambda: not gateway.connections and not gateway._clients, "its end")

    asyncio.run(go())


def test_a_connection_that_sent_nothing_is_closed_as_the_gateway_stops() -> None:
    async def go() -> None:
        async with gateway_before(Engine().handle) as (gateway, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            await _until(lambda: _unasked(gateway), "the connection made")
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the gateway's stop
        assert not gateway.connections and not gateway._clients
        writer.close()

    asyncio.run(go())
