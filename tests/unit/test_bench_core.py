"""Pure parts of the benchmark: statistics, SSE parsing and token accounting, parameters, gates, records."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from metralectl.bench import gates as G
from metralectl.bench import records
from metralectl.bench.params import parse_params
from metralectl.bench.results import aggregate, analyse
from metralectl.bench.sse import RawResponse, parse_stream, split_events
from metralectl.bench.stats import largest_remainder, percentile, summarize
from metralectl.bench.suites import SUITES, get_suite, repetition
from metralectl.errors import ExitCode, NotFound, UsageError


def test_percentile_matches_numpy_linear() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10], 99) == 10
    assert percentile([], 50) is None
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)
    s = summarize([3.0, 1.0, 2.0])
    assert s["n"] == 3 and s["p50"] == 2.0 and s["min"] == 1.0 and s["max"] == 3.0
    assert summarize([])["p50"] is None


def test_largest_remainder_sums_exactly() -> None:
    assert sum(largest_remainder(10, [1, 1, 1])) == 10
    assert largest_remainder(5, [0, 0]) in ([3, 2], [2, 3])
    assert largest_remainder(7, [5, 1, 1]) == [5, 1, 1]


def ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chunk(delta: dict, usage: dict | None = None, finish: str | None = None) -> dict:
    out: dict = {"id": "r1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        out["usage"] = usage
    return out


def test_events_split_across_reads_get_the_completing_reads_time() -> None:
    first, second = ev(chunk({"content": "a"})), ev(chunk({"content": "b"}))
    body = first + second
    cut = len(first) + 5  # the first event ends inside the second read, the second inside the third
    pieces = [(100, body[:10]), (200, body[10:cut]), (300, body[cut:])]
    assert [t for t, _ in split_events(pieces)] == [200, 300]
    crlf = [(5, body.replace(b"\n", b"\r\n"))]
    assert len(split_events(crlf)) == 2


def test_chat_and_the_benchmark_split_a_stream_alike_at_every_cut() -> None:
    """`chat` reads the stream live through the benchmark's splitter: one set of SSE rules for both, whatever
    the reads (CRLF split between reads, comments, multi-line data, a last event without its blank line)."""
    from metralectl.app.chat import _events

    body = (b": keep-alive\r\n\r\n" + ev(chunk({"content": "a"})).replace(b"\n", b"\r\n")
            + b"event: x\ndata: {\"id\":\ndata: \"r2\"}\n\n" + b"id: 7\n\n" + b"data: [DONE]")
    whole = [payload for _, payload in split_events([(1, body)])]
    assert whole == [json.dumps(chunk({"content": "a"})).encode(), b'{"id":\n"r2"}', b"[DONE]"]
    for cut in range(1, len(body)):
        pieces = [(1, body[:cut]), (2, body[cut:])]
        assert [p for _, p in split_events(pieces)] == whole, cut
        assert list(_events(iter([body[:cut], body[cut:]]))) == whole, cut
    assert parse_stream([(1, body)]).at_boundary is False
    assert parse_stream([(1, body + b"\n\n")]).at_boundary is True


def test_reasoning_tool_and_usage_only_chunks() -> None:
    body = (ev(chunk({"role": "assistant", "reasoning_content": "hm"})) + ev(chunk({"content": "Paris"}))
            + ev(chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{}"}}]}))
            + ev(chunk({}, finish="stop")) + ev({"id": "r1", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}})
            + b"data: [DONE]\n\n")
    parsed = parse_stream([(1, body)])
    assert [e.kind for e in parsed.events] == ["r", "c", "t"] and parsed.done and parsed.finish_reason == "stop"
    assert parsed.tool_calls == [{"id": "c1", "name": "f", "arguments": "{}"}]
    assert parsed.usage == {"prompt_tokens": 7, "completion_tokens": 3}


def _stream(times_tokens: list[tuple[int, str, int]], final: int, continuous: bool, tail_t: int) -> RawResponse:
    raw = RawResponse(t_send=0, status=200)
    cum = 0
    for t, text, n in times_tokens:
        cum += n
        raw.pieces.append((t, ev(chunk({"content": text}, {"completion_tokens": cum} if continuous else None))))
    raw.pieces.append((tail_t, ev(chunk({}, finish="length"))))
    raw.pieces.append((tail_t + 10, ev({"id": "r1", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": final}})))
    raw.pieces.append((tail_t + 20, b"data: [DONE]\n\n"))
    return raw


def test_multi_token_chunks_spread_and_e2e_ends_at_last_token() -> None:
    ms = 1_000_000
    raw = _stream([(20 * ms, "a", 1), (26 * ms, "bcd", 3), (29 * ms, "e", 1)], 5, True, 100 * ms)
    r = analyse(raw, index=0, worker=0, phase="measure")
    assert r.ok and r.output_tokens == 5 and r.count_method == "continuous-usage"
    assert r.token_ns == [20 * ms, 22 * ms, 24 * ms, 26 * ms, 29 * ms]
    assert r.ttft_ms == 20.0 and r.e2e_ms == 29.0  # not 100+: the finish and usage chunks are no tokens
    assert r.tpot_ms == pytest.approx(9 / 4) and r.itl_ms == [2.0, 2.0, 2.0, 3.0]


def test_count_methods() -> None:
    ms = 1_000_000
    exact = analyse(_stream([(1 * ms, "a", 1), (2 * ms, "b", 1)], 2, False, 5 * ms), index=0, worker=0, phase="measure")
    assert exact.count_method == "usage" and exact.output_tokens == 2
    spread = analyse(_stream([(1 * ms, "a", 1), (2 * ms, "bbbbbb", 1)], 8, False, 5 * ms), index=0, worker=0, phase="measure")
    assert spread.count_method == "usage-spread" and spread.output_tokens == 8


def test_http_error_is_a_failure_of_kind_http_status() -> None:
    raw = RawResponse(t_send=0, status=503, pieces=[(1, b'{"error": {"message": "model_not_loaded"}}')], end="complete")
    r = analyse(raw, index=0, worker=0, phase="measure")
    assert not r.ok and r.error == "HTTP 503: model_not_loaded" and r.error_kind == "http-503"
    agg = aggregate([r], None)
    assert agg["errors"] == 1 and agg["ttft_ms"]["p50"] is None and agg["error_kinds"] == {"http-503": 1}


def test_unknown_param_lists_the_valid_ones() -> None:
    suite = get_suite("concurrency-sweep")
    with pytest.raises(UsageError) as info:
        parse_params(suite.id, suite.schema, ["concurency=4"])
    msg = str(info.value)
    assert "unknown parameter 'concurency'" in msg and "concurrencies" in msg and "isls" in msg and "shard" in msg
    assert info.value.exit_code == ExitCode.USAGE


def test_params_are_typed_ranged_and_complete() -> None:
    suite = get_suite("decode")
    values = parse_params(suite.id, suite.schema, ["repeats=3", "ignore_eos=false"])
    assert values["repeats"] == 3 and values["ignore_eos"] is False and values["max_tokens"] == 128
    assert set(values) == {p.name for p in suite.schema}  # every parameter, not only overrides
    for bad in ("max_tokens=129", "temperature=0.5", "repeats=x", "transport=curl", "novalue"):
        with pytest.raises(UsageError):
            parse_params(suite.id, suite.schema, [bad])
    sweep = get_suite("concurrency-sweep")
    assert parse_params(sweep.id, sweep.schema, ["concurrencies=1,2,4"])["concurrencies"] == [1, 2, 4]
    with pytest.raises(NotFound):
        get_suite("decod")


def test_every_suite_plans_stages_from_its_defaults() -> None:
    for suite in SUITES.values():
        params = parse_params(suite.id, suite.schema, [])
        assert suite.stages(params), suite.id
    sweep = get_suite("concurrency-sweep")
    half = sweep.stages(parse_params(sweep.id, sweep.schema, ["concurrencies=1,2,4,8", "shard=1/2"]))
    assert [s.labels["concurrency"] for s in half] == [2, 8]


def test_gates_and_exit_codes() -> None:
    gate = G.parse_gate("decode_tok_s_p50>=120")
    assert G.evaluate([gate], {"decode_tok_s_p50": 131.0})[0].passed is True
    failed = G.evaluate([gate], {"decode_tok_s_p50": 100.0})
    assert G.overall(failed) == "fail"
    assert G.exit_code("completed", "fail") == 2 == ExitCode.GATE
    assert G.exit_code("completed", "fail", fail_on_verdict=False) == 0
    assert G.exit_code("completed", "pass") == 0 and G.exit_code("completed", "none") == 0
    assert G.exit_code("client-bound", "none") == 1 and G.exit_code("errors", "pass") == 1 and \
        G.exit_code("invalid", "none") == 1
    assert G.exit_code("interrupted", "pass") == 130 == ExitCode.INTERRUPTED  # Ctrl-C/SIGTERM has its own code
    assert G.evaluate([gate], {})[0].passed is None
    with pytest.raises(UsageError):
        G.parse_gate("tok_s ~ 3")
    g, why = G.recipe_gate(131.0, "gb10", "gb10", 0.1, "qwen")
    assert g is not None and g.threshold == pytest.approx(117.9)
    g, why = G.recipe_gate(131.0, "gb10", "hopper", 0.1, "qwen")
    assert g is None and "differs" in why


def test_client_bound_reasons() -> None:
    # with kernel stamps, the stamps' estimated error decides; the loop's delay does not
    quiet_stamps = {"p99": 0.0, "ttft_p99": 0.0, "late": 0, "n": 500}
    assert G.client_bound_reasons({"loop_lag_ms": {"p99": 3.0}}, quiet_stamps, 2.0, 2.0) == []
    late = G.client_bound_reasons({"loop_lag_ms": {"p99": 0.1}}, {"p99": 9.0, "ttft_p99": 0.0, "late": 40, "n": 500},
                                  2.0, 2.0)
    assert len(late) == 1 and "estimated error p99 9.00 ms" in late[0]
    # without kernel stamps (other transports) every stamp is the loop's: its delay is the error
    assert len(G.client_bound_reasons({"loop_lag_ms": {"p99": 3.0}}, None, 2.0, 2.0)) == 1
    assert G.client_bound_reasons({"loop_lag_ms": {"p99": 0.1}}, None, 2.0, 2.0) == []
    assert len(G.client_bound_reasons({"dispatch_slip_ms": {"p95": 9.0}}, None, 2.0, 2.0)) == 1


def test_repetition() -> None:
    assert repetition("a b c d e f g h") == 0.0
    assert repetition("x y " * 50) > 0.9


def test_record_of_a_dead_process_reads_as_interrupted() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    directory = records.start("decode", "20260101-000000-abcdef", {"started_at": "2026-01-01T00:00:00+00:00"})
    on_disk = json.loads((directory / "run.json").read_text())
    on_disk["pid"] = child.pid
    (directory / "run.json").write_text(json.dumps(on_disk))
    record = records.repair(directory)
    assert record is not None and record["status"] == "interrupted"
    assert json.loads((directory / "run.json").read_text())["status"] == "interrupted"
    assert records.find("abcdef") == directory
    mine = records.start("decode", "20260101-000001-aaaaaa", {"started_at": "x"})
    assert records.load(mine)["status"] == "running" and os.getpid() == records.load(mine)["pid"]


def test_all_empty_deltas_with_the_servers_count_are_no_text_not_no_tokens() -> None:
    """vLLM with a tokenizer whose tokens decode to nothing streams `"content": ""` deltas and reports the
    tokens it generated in `usage`: the record counts the server's tokens and says the finding, "no text"."""
    ms = 1_000_000
    r = analyse(_stream([(1 * ms, "", 1), (2 * ms, "", 1), (3 * ms, "", 1)], 7, False, 5 * ms),
                index=0, worker=0, phase="measure")
    assert not r.ok and r.error_kind == "no-text" and r.output_tokens == 7, (r.error_kind, r.output_tokens)
    assert r.error is not None and r.error.startswith("no text: the server reports 7 completion tokens")
    agg = aggregate([r], None)
    assert agg["errors"] == 1 and agg["error_kinds"] == {"no-text": 1}
    nothing = analyse(_stream([(1 * ms, "", 1)], 0, False, 5 * ms), index=0, worker=0, phase="measure")
    assert not nothing.ok and nothing.error_kind == "empty" and nothing.output_tokens == 0  # really nothing
