"""Kept-alive connections a server closes: the benchmark's transports notice a closed idle connection before
reusing it, and send once more, on a fresh connection, a request that a reused connection answered with
nothing at all (llama.cpp's llama-server closes some connections right after a streamed response). Nothing
else is ever sent twice: a response cut after its first byte, a request that failed on a fresh connection,
or a second attempt that fails too stay failures. Against tests/bench_truth/quirky_server.py, a real HTTP
server on loopback."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from metralectl.bench.results import analyse
from metralectl.bench.sse import END_COMPLETE, RawResponse
from metralectl.bench.transport import make_transport
from tests.bench_truth.quirky_server import quirky_server
from tests.unit.test_bench_honesty import bench, lines_of

TRANSPORTS = ["raw", "raw-nostamp", "httpx"]
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                   "stream": True, "stream_options": {"include_usage": True}}).encode()


def _send(url: str, transport: str, plan: list[float], prewarm: int = 1, skipped: list[int] | None = None
          ) -> list[RawResponse]:
    """One request after another on one transport of pool 1; before each, block the event loop for the
    given seconds (time.sleep: the loop cannot see a close that arrives meanwhile). `skipped` gets the raw
    transports' count of closed idle connections they did not reuse."""

    async def main() -> list[RawResponse]:
        tr = make_transport(transport, url, "/v1/chat/completions", 1)
        await tr.open(prewarm)
        out = []
        try:
            for pause in plan:
                time.sleep(pause)
                out.append(await tr.stream(BODY, 30.0))
        finally:
            await tr.close()
        if skipped is not None:
            skipped.append(getattr(tr, "idle_closed", -1))
        return out

    return asyncio.run(main())


def _judged(raws: list[RawResponse]) -> list[Any]:
    return [analyse(raw, index=i, worker=0, phase="measure") for i, raw in enumerate(raws)]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_request_the_server_closed_its_connection_on_is_sent_again_on_a_fresh_one(transport: str) -> None:
    # the server closes each connection 0.2 s after its response ends, without reading: the next request,
    # sent at once on that connection, is never taken and gets nothing back
    with quirky_server(close_after_stream=0.2) as (url, seen):
        results = _judged(_send(url, transport, [0, 0, 0]))
    assert [r.ok for r in results] == [True] * 3, [r.error for r in results]
    # raw keeps the connection of the second send for the next request (closed in turn: sent again too);
    # httpx's second sends use a client that keeps nothing, so its third request connects anew
    expected = [False, True, False] if transport == "httpx" else [False, True, True]
    assert [r.retried for r in results] == expected
    assert all(r.retry_reason and r.retry_ms is not None and r.retry_ms >= 0 for r in results if r.retried)
    # each request was taken by the server once, the second attempts on connections of their own
    assert seen.completions == 3 and seen.connections == 3
    # timed from the second send: its first token came after it
    assert all(r.ttft_ms is not None and 0 < r.ttft_ms for r in results)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_idle_connection_closed_while_the_loop_was_busy_is_not_reused(transport: str) -> None:
    # the close arrives while the client's event loop is blocked: only a check of the socket before reuse
    # can see it; the request then goes out on a fresh connection, never on the dead one
    skipped: list[int] = []
    with quirky_server(close_after_stream=0.05) as (url, seen):
        results = _judged(_send(url, transport, [0, 0.5], skipped=skipped))
    assert [r.ok for r in results] == [True, True], [r.error for r in results]
    assert [r.retried for r in results] == [False, False]
    assert skipped == ([-1] if transport == "httpx" else [1])  # httpcore makes this check itself, uncounted
    assert seen.completions == 2 and seen.connections == 2


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_reset_after_the_first_response_byte_stays_a_failure(transport: str) -> None:
    with quirky_server(reset_request=2) as (url, seen):
        raws = _send(url, transport, [0, 0])
    first, second = _judged(raws)
    assert first.ok and not first.retried
    assert not second.ok and not second.retried and second.error_kind == "truncated", second
    assert raws[1].status == 200 and raws[1].pieces  # it had its head and two token events
    assert seen.completions == 2  # never sent again


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_nothing_back_on_a_fresh_connection_is_a_failure_not_a_retry(transport: str) -> None:
    with quirky_server(drop=(1,)) as (url, seen):
        [only] = _judged(_send(url, transport, [0], prewarm=0))
    assert not only.ok and not only.retried and only.error_kind == "truncated", only
    assert seen.completions == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_second_attempt_that_gets_nothing_either_is_a_failure(transport: str) -> None:
    with quirky_server(drop=(2, 3)) as (url, seen):
        raws = _send(url, transport, [0, 0])
    first, second = _judged(raws)
    assert first.ok
    assert not second.ok and second.retried and second.error_kind == "truncated", second
    assert raws[1].end != END_COMPLETE or raws[1].status is None
    assert seen.completions == 3  # the request twice, never a third time


def test_bench_decode_completes_every_request_and_counts_the_second_sends() -> None:
    with quirky_server(close_after_stream=0.2) as (url, seen):
        record, _ = bench("decode", url, "repeats=4", "warmup=1", "max_tokens=8", "dialect=full")
    assert record["status"] == "completed" and record["exit_code"] == 0, record.get("error")
    summary = record["stages"][0]["summary"]
    lines = lines_of(record)
    assert summary["ok"] == 4 and summary["errors"] == 0
    measured = [line for line in lines if line["phase"] == "measure"]
    # every measured request went out right after the previous response, on the connection being closed
    assert summary["retried"] == 4 == sum(1 for line in measured if line["retried"])
    assert all(line["retry_ms"] is not None and line["retry_reason"] for line in measured)
    assert seen.completions == len(lines)  # each request taken once
    from metralectl.present.bench_view import render_run

    assert "4 sent again on a fresh connection" in render_run(record)
