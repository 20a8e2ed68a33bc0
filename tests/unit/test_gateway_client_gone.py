"""A client that leaves while its answer is relayed (upstream.py, dispatch.Flight): one that closes as soon as it
reads `data: [DONE]`, before the engine's last chunk (llama-server writes it apart; many clients stop reading at
[DONE]), was answered, counted once in `requests` and kept in the timing records; one that leaves mid-answer is
counted as `client-gone` and not as answered. The real Gateway on loopback, in front of an engine that holds its
last chunk until the gateway has closed its connection, so the client's close is always seen first."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from metralectl.gateway import timing, upstream
from tests.unit.test_gateway_relay import SSE, Engine, _Client, _NoTransport, gateway_before, request

STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
DONE = b"data: [DONE]\n\n"
ANSWERED = ("metralectl_gateway_requests_total", {"model": "stub", "path": "/v1/chat/completions", "status": "200"})
GONE = ("metralectl_gateway_errors_total", {"model": "stub", "reason": "client-gone"})


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def streams_then_holds(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
    """The events, then `data: [DONE]` in a chunk of its own; the last chunk only once the gateway has closed this
    connection (as llama-server's comes a write later, after a client that stopped at [DONE] may have closed)."""
    writer.write(STREAM_HEAD + chunk(SSE))
    await writer.drain()
    writer.write(chunk(DONE))
    await writer.drain()
    await reader.read()  # until the gateway closes its side
    writer.write(b"0\r\n\r\n")


async def streams_then_holds_the_last_crlf(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
    """As llama-server was seen to: [DONE] and the last chunk's `0\r\n` in one write, its closing CRLF apart."""
    writer.write(STREAM_HEAD + chunk(SSE))
    await writer.drain()
    writer.write(chunk(DONE) + b"0\r\n")
    await writer.drain()
    await reader.read()
    writer.write(b"\r\n")


async def one_token_then_holds(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
    writer.write(STREAM_HEAD + chunk(SSE[:SSE.index(b"\n\n") + 2]))
    await writer.drain()
    await reader.read()


async def client_leaving_at(port: int, mark: bytes) -> bytes:
    """A streamed request whose client reads until `mark` and closes (benchmarks/gateway_paired.py's way at [DONE])."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request())
    got = await asyncio.wait_for(reader.readuntil(mark), 30)
    writer.close()
    await writer.wait_closed()
    return got


def leaving(answer: Any, mark: bytes) -> tuple[bytes, float | None, float | None]:
    """(what the client read, requests counted 200, client-gone counted) once the gateway closed the engine's side."""
    async def go() -> tuple[bytes, float | None, float | None]:
        engine = Engine(answer)
        async with gateway_before(engine) as (gateway, port):
            got = await client_leaving_at(port, mark)
            await asyncio.wait_for(engine.closed.wait(), 30)  # the relay is over: the engine's connection closed
            registry = gateway.metrics.registry
            return got, registry.get_sample_value(*ANSWERED), registry.get_sample_value(*GONE)

    return asyncio.run(go())


def test_a_client_that_closes_at_done_before_the_engines_last_chunk_is_counted_as_answered_once() -> None:
    got, answered, gone = leaving(streams_then_holds, b"[DONE]")
    assert got.startswith(b"HTTP/1.1 200 OK\r\n") and got.endswith(DONE[:-2])
    assert answered == 1
    assert gone is None


def test_a_client_that_closes_at_done_read_with_the_last_chunks_start_is_counted_as_answered_once() -> None:
    got, answered, gone = leaving(streams_then_holds_the_last_crlf, b"[DONE]")
    assert got.endswith(DONE[:-2]) and answered == 1 and gone is None


def test_a_client_that_leaves_in_the_middle_of_an_answer_is_client_gone_and_not_answered() -> None:
    got, answered, gone = leaving(one_token_then_holds, b'"w0"')
    assert got.startswith(b"HTTP/1.1 200 OK\r\n")
    assert answered is None
    assert gone == 1


@pytest.mark.parametrize("answer, mark, records", [(streams_then_holds, b"[DONE]", 1),
                                                   (one_token_then_holds, b'"w0"', 0)], ids=["at-done", "mid-answer"])
def test_with_its_time_kept_a_client_that_closes_at_done_leaves_its_record(
        answer: Any, mark: bytes, records: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "timing.jsonl"
    monkeypatch.setenv(timing.ENV, str(out))
    leaving(answer, mark)  # the gateway writes its records as it stops
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    kept = [line for line in lines if "up_ns" in line]
    assert len(kept) == records, kept
    assert all(line["first_ns"] > 0 for line in kept)


# The relay alone: which of answered() and cut() a stop calls, and never both nor twice.

class Counted(upstream.Start):
    def __init__(self) -> None:
        super().__init__(_Client(), [])  # type: ignore[arg-type]
        self.calls: list[str] = []

    def answered(self, response: Any) -> None:
        self.calls.append("answered")

    def cut(self) -> None:
        self.calls.append("cut")


def relayed(pieces: list[bytes], late: bytes = b"") -> list[str]:
    """A chunked stream's pieces relayed, the relay's task cancelled (its client gone), then `late` from the engine."""
    start = Counted()

    async def go() -> None:
        conn = upstream.Upstream()
        conn.connection_made(_NoTransport())  # type: ignore[arg-type]
        conn.send(b"POST / HTTP/1.1\r\n\r\n", start)
        conn.data_received(STREAM_HEAD)
        relaying: Any = asyncio.ensure_future(conn.relay(await conn.head(), start))
        await asyncio.sleep(0)
        for piece in pieces:
            conn.data_received(piece)
        relaying.cancel()
        with pytest.raises(asyncio.CancelledError):
            await relaying
        if late:
            conn.data_received(late)

    asyncio.run(go())
    return start.calls


def test_a_relay_stopped_after_its_done_chunk_is_answered_once_even_when_the_last_chunk_follows() -> None:
    assert relayed([chunk(SSE), chunk(DONE)], late=b"0\r\n\r\n") == ["answered"]


def test_a_relay_stopped_before_its_done_chunk_is_cut_and_not_answered() -> None:
    assert relayed([chunk(SSE)], late=chunk(DONE) + b"0\r\n\r\n") == ["cut"]
    assert relayed([chunk(SSE + DONE[:-2])]) == ["cut"]  # `data: [DONE]` without its blank line: not the end yet


def test_a_relay_that_ended_is_answered_once_and_a_stop_after_it_adds_nothing() -> None:
    assert relayed([chunk(SSE), chunk(DONE) + b"0\r\n\r\n"]) == ["answered"]


def test_a_request_given_up_before_its_answer_began_is_cut_and_one_whose_stream_reached_done_is_answered() -> None:
    async def go(pieces: list[bytes], late: bytes = b"0\r\n\r\n") -> list[str]:
        start = Counted()
        conn = upstream.Upstream()
        conn.connection_made(_NoTransport())  # type: ignore[arg-type]
        conn.send(b"POST / HTTP/1.1\r\n\r\n", start)
        for piece in pieces:  # from the head's callback: the relay's task never took it
            conn.data_received(piece)
        conn.abandon()
        conn.data_received(late)
        return start.calls

    assert asyncio.run(go([], late=STREAM_HEAD + chunk(DONE) + b"0\r\n\r\n")) == ["cut"]  # a late answer starts nothing
    assert asyncio.run(go([STREAM_HEAD + chunk(SSE)])) == ["cut"]
    assert asyncio.run(go([STREAM_HEAD + chunk(SSE), chunk(DONE)])) == ["answered"]
