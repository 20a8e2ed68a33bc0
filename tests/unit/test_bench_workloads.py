"""The workloads people compare (issue 34): the depth suite (llama-benchy's pp/tg at context depths, its
prefix-cache test), the rate suite's sweep to saturation with its knee, and the ITL SLO in goodput."""

from __future__ import annotations

import json
from typing import Any

import pytest

from metralectl.bench import gates as G
from metralectl.bench.params import parse_params
from metralectl.bench.prompts import CONTEXT_LOAD, RequestFactory, prefix_for, shape_prompt, unique_head
from metralectl.bench.results import RequestResult
from metralectl.bench.target import api_rtt_ms, served_context
from metralectl.bench.suites import get_suite
from metralectl.bench.suites.depth import pp_speed
from metralectl.bench.suites.rate import knee, meets_slo
from metralectl.campaign.plan import estimate_s
from metralectl.errors import UsageError


def params(suite: str, *pairs: str) -> dict[str, Any]:
    return parse_params(suite, get_suite(suite).schema, pairs)


def result(i: int, *, tag: str | None = None, ttft: float = 10.0, tokens: list[int] | None = None,
           prompt: int | None = 100, ok: bool = True) -> RequestResult:
    r = RequestResult(i, 0, "measure", None, 0, ok, 200, None if ok else "x", tag=tag, prompt_tokens=prompt)
    r.ttft_ms = ttft
    r.token_ns = tokens or [int(ttft * 1e6) + k * 10_000_000 for k in range(5)]  # 10 ms apart
    r.first_n = 1
    r.output_tokens = len(r.token_ns)
    r.tpot_ms = (r.token_ns[-1] - r.token_ns[0]) / (len(r.token_ns) - 1) / 1e6
    r.decode_tok_s = 1000.0 / r.tpot_ms
    return r


# --- depth -----------------------------------------------------------------------------------------------
def test_depth_plans_one_stage_per_depth_that_fits_the_context() -> None:
    p = params("depth", "depths=0,1024,4096", "pp=512", "tg=32", "max_context=4096")
    stages = get_suite("depth").stages(p)
    assert [s.name for s in stages] == ["pp512 tg32 @ d0", "pp512 tg32 @ d1024"]  # 4096+512+32 > 4096: skipped
    assert [(s.prefix, s.depth, s.isl, s.osl) for s in stages] == [("head", 0, 512, 32), ("depth", 1024, 512, 32)]
    assert stages[0].load.requests == 3 and stages[0].load.warmup_requests == 1  # llama-benchy: 3 runs, 1 warm-up
    cached = get_suite("depth").stages(params("depth", "depths=0,1024", "prefix_cache=true", "runs=2"))
    assert [(s.prefix, s.load.requests, s.load.warmup_requests) for s in cached] == [("head", 2, 1),
                                                                                      ("ctxpairs", 4, 2)]
    assert len(get_suite("depth").stages(params("depth", "depths=0,32768"))) == 2  # max_context 0: all run


def test_depth_request_holds_the_context_as_a_system_message_ahead_of_the_prompt() -> None:
    f = RequestFactory(model="m", max_tokens=8, text="the prompt", context="the context", prefix="depth", nonce=7,
                       expected_prompt_tokens=1100)
    body = json.loads(f(3).body)
    assert body["messages"] == [{"role": "system", "content": unique_head(7, 3) + "the context"},
                                {"role": "user", "content": "the prompt"}]
    assert f(3).expected_prompt_tokens == 1100 and json.loads(f(4).body)["messages"][0] != body["messages"][0]


def test_the_depth_head_changes_first_so_no_prompt_reuses_the_last_ones_cache() -> None:
    a, b = unique_head(7, 3), unique_head(7, 4)
    assert len(a.split()) == len(prefix_for(7, 3).split()) and sorted(a) == sorted(prefix_for(7, 3))
    assert a.split()[1] != b.split()[1]  # the first digit after "Request" already differs
    f = RequestFactory(model="m", max_tokens=8, text="the prompt", prefix="head", nonce=7)
    assert json.loads(f(3).body)["messages"] == [{"role": "user", "content": a + "the prompt"}]  # depth 0


def test_prefix_cache_pairs_load_the_context_then_ask_after_it() -> None:
    f = RequestFactory(model="m", max_tokens=8, text="the prompt", context="ctx", prefix="ctxpairs", nonce=1,
                       expected_prompt_tokens=600)
    load, ask, nxt = (f(i) for i in (4, 5, 6))
    m_load, m_ask = json.loads(load.body)["messages"], json.loads(ask.body)["messages"]
    assert m_load[0] == m_ask[0] and m_load[1]["content"] == CONTEXT_LOAD and m_ask[1]["content"] == "the prompt"
    assert (load.tag, ask.tag) == ("ctx", "warm")
    assert load.expected_prompt_tokens is None and ask.expected_prompt_tokens == 600  # a load is shorter by design
    assert json.loads(nxt.body)["messages"][0] != m_load[0]  # the next pair: a context never seen


def test_shape_prompt_sizes_a_whole_chat_given_a_wrap() -> None:
    def count(msgs: list[dict[str, str]]) -> int:  # a word a token, 5 tokens of template per message
        return sum(len(m["content"].split()) + 5 for m in msgs)

    fixed_user = "one two three"
    shaped = shape_prompt(300, count, seed=1, wrap=lambda s: [{"role": "system", "content": s},
                                                              {"role": "user", "content": fixed_user}])
    assert shaped.tokens == 300
    head = prefix_for(0, 0)
    assert count([{"role": "system", "content": head + shaped.text}, {"role": "user", "content": fixed_user}]) == 300


def test_pp_is_prompt_tokens_over_the_time_to_first_response_less_the_latency() -> None:
    r = result(0, ttft=101.0, prompt=1000)
    assert pp_speed(r, 1000, 1.0) == pytest.approx(10_000.0)  # 1000 tokens in 100 ms
    assert pp_speed(r, 1000, 0.0) == pytest.approx(1000 / 0.101)
    assert pp_speed(r, None, 1.0) is None and pp_speed(result(0, ttft=1.0), 10, 1.0) is None


def test_depth_summary_llama_benchy_numbers_and_the_prefix_cache_counts_new_tokens_only() -> None:
    p = params("depth", "depths=0,1024", "pp=100", "prefix_cache=true", "runs=2")
    d0, d1 = get_suite("depth").stages(p)
    plain = [result(0, ttft=11.0, prompt=100), result(1, ttft=21.0, prompt=100)]
    pairs = [result(0, tag="ctx", ttft=51.0, prompt=1030), result(1, tag="warm", ttft=6.0, prompt=1124),
             result(2, tag="ctx", ttft=51.0, prompt=1030), result(3, tag="warm", ttft=6.0, prompt=1124)]
    agg = {"errors": 0, "requests": 2, "api_rtt_ms": 1.0}
    out = get_suite("depth").summarize(p, [(d0, plain, agg), (d1, pairs, {**agg, "requests": 4})])
    h = out["headline"]
    assert h["d0.pp_tok_s"] == pytest.approx((100 / 0.010 + 100 / 0.020) / 2)  # the mean over runs
    assert h["d0.pp_tok_s_std"] == pytest.approx(2500.0)
    assert h["d0.tg_tok_s"] == pytest.approx(100.0)  # 4 tokens after the first, 10 ms apart
    assert h["d1024.pp_tok_s"] == pytest.approx(100 / 0.005)  # P new tokens, not the 1124 the server counted
    assert h["d1024.ctx_pp_tok_s"] == pytest.approx(1030 / 0.050)  # the load: every prompt token
    assert out["depths"][1]["ctx_prompt_tokens"] == [1030] and out["depths"][1]["prompt_tokens"] == [1124]


def test_the_campaign_planner_estimates_the_new_workloads() -> None:
    assert estimate_s("depth", params("depth")) > estimate_s("depth", params("depth", "depths=0"))
    assert estimate_s("rate", params("rate", "rates=auto", "max_rates=4")) == estimate_s("rate", params(
        "rate", "rates=1,2,3,4"))


class FakeControl:
    def __init__(self, answers: dict[str, object]) -> None:
        self.answers, self.calls = answers, []

    def get_json(self, path: str) -> object:
        self.calls.append(path)
        return self.answers.get(path)


def test_served_context_from_vllm_models_or_llama_cpp_props() -> None:
    vllm = FakeControl({"/v1/models": {"data": [{"id": "m", "max_model_len": 32768}]}})
    assert served_context(vllm)[0] == 32768  # type: ignore[arg-type]
    llama = FakeControl({"/v1/models": {"data": [{"id": "m"}]},
                         "/props": {"default_generation_settings": {"n_ctx": 4096}}})
    limit, said = served_context(llama)  # type: ignore[arg-type]
    assert limit == 4096 and "/props" in (said or "")
    assert served_context(FakeControl({})) == (None, None)  # type: ignore[arg-type]


def test_api_latency_opens_the_connection_first_then_takes_three() -> None:
    c = FakeControl({"/v1/models": {"data": []}})
    assert isinstance(api_rtt_ms(c), float) and c.calls == ["/v1/models"] * 4  # type: ignore[arg-type]
    assert api_rtt_ms(FakeControl({})) is None  # type: ignore[arg-type]


# --- rate: ITL SLO, sweep to saturation ------------------------------------------------------------------
def test_itl_slo_fails_a_request_with_one_stall_that_tpot_forgives() -> None:
    base = 10_000_000
    stalled = result(0, ttft=10.0, tokens=[base + k * 5_000_000 for k in range(20)] + [base + 95_000_000 + 300_000_000])
    assert stalled.tpot_ms is not None and stalled.tpot_ms < 100  # the mean gap is fine
    assert meets_slo(stalled, 1000, 100) and not meets_slo(stalled, 1000, 100, slo_itl_ms=200)
    assert meets_slo(result(1), 1000, 100, slo_itl_ms=200) and not meets_slo(result(2, ok=False), 1000, 100)


def test_rates_auto_parses_and_plans_the_first_rate() -> None:
    p = params("rate", "rates=auto", "rate_start=0.5")
    assert p["rates"] == "auto" and [s.labels["rate"] for s in get_suite("rate").stages(p)] == [0.5]
    with pytest.raises(UsageError):
        params("rate", "rates=fast")
    assert [g.metric for g in G.param_gates("rate", {**p, "min_slo_attainment": 0.9})] == ["knee.slo_attainment"]


def _sweep(p: dict[str, Any], tputs: list[float], attain: list[float]) -> list[tuple[Any, list[RequestResult], dict[str, Any]]]:
    from metralectl.bench.suites.rate import _stage

    runs = []
    rate = p["rate_start"]
    for tput, att in zip(tputs, attain):
        good = round(att * 10)
        results = [result(i, ttft=10.0 if i < good else 5000.0) for i in range(10)]
        runs.append((_stage(p, rate), results, {"output_tok_s": tput, "window_s": 10.0, "ok": 10}))
        rate *= p["rate_factor"]
    return runs


def test_sweep_goes_on_while_throughput_grows_and_stops_at_the_knee() -> None:
    suite = get_suite("rate")
    assert suite.more is not None
    p = params("rate", "rates=auto", "rate_start=1")
    growing = _sweep(p, [100, 190], [1.0, 1.0])
    assert [s.labels["rate"] for s in suite.more(p, growing)] == [4.0]
    flat = _sweep(p, [100, 190, 195], [1.0, 1.0, 1.0])
    assert suite.more(p, flat) == []
    out = suite.summarize(p, flat)
    assert out["saturation"]["knee"]["rate"] == 2.0 and "stopped growing at 4/s" in out["saturation"]["stopped"]
    assert out["headline"]["knee.rate"] == 2.0 and out["headline"]["rate4.goodput_rps"] == pytest.approx(1.0)
    collapsed = _sweep(p, [100, 190, 300], [1.0, 0.9, 0.3])
    sat = knee(p, collapsed)
    assert sat["knee"]["rate"] == 2.0 and "collapsed at 4/s" in sat["stopped"]
    capped = _sweep(params("rate", "rates=auto", "max_rates=2"), [100, 190], [1.0, 1.0])
    assert "max_rates" in knee(params("rate", "rates=auto", "max_rates=2"), capped)["stopped"]
    assert suite.more(params("rate"), growing) == []  # a list of rates: the plan is the list


# --- shared prefix, trace replay ---------------------------------------------------------------------------
def test_shared_prefix_one_system_prompt_for_every_user_a_turn_of_each_own() -> None:
    p = params("shared-prefix", "users=2,8", "prefix_tokens=1000", "suffix_tokens=100")
    stages = get_suite("shared-prefix").stages(p)
    assert [(s.load.concurrency, s.isl, s.depth, s.prefix) for s in stages] == [(2, 100, 1000, "shared"),
                                                                                (8, 100, 1000, "shared")]
    f = RequestFactory(model="m", max_tokens=8, text="suffix", context="shared system", prefix="shared", nonce=3)
    a, b = (json.loads(f(i).body)["messages"] for i in (0, 1))
    assert a[0] == b[0] == {"role": "system", "content": "shared system"}
    assert a[1]["content"] == prefix_for(3, 0) + "suffix" and b[1]["content"] == prefix_for(3, 1) + "suffix"


SAMPLE_OK = ('{"timestamp_s": 0, "input_tokens": 10, "output_tokens": 4, "session": "a"}\n'
             '\n# a comment\n{"timestamp_s": 0.5, "input_tokens": 20, "output_tokens": 8}\n')


def test_trace_reads_jsonl_and_csv_alike() -> None:
    from metralectl.bench.trace import TraceRequest, parse

    want = [TraceRequest(0.0, 10, 4, "a"), TraceRequest(0.5, 20, 8, None)]
    assert parse(SAMPLE_OK, "t.jsonl") == want
    assert parse("timestamp_s,input_tokens,output_tokens,session\n0,10,4,a\n0.5,20,8,\n", "t.csv") == want


@pytest.mark.parametrize(("text", "said"), [
    ('{"timestamp_s": 0, "input_tokens": 10}\n', "line 1 field output_tokens: missing"),
    ('{"timestamp_s": 1, "input_tokens": 10, "output_tokens": 1}\n{"timestamp_s": 0.5, "input_tokens": 1, '
     '"output_tokens": 1}\n', "line 2 field timestamp_s: 0.5 is before the line above (1)"),
    ('{"timestamp_s": 0, "input_tokens": 2.5, "output_tokens": 1}\n', "field input_tokens: '2.5' is not a whole number"),
    ('{"timestamp_s": 0, "input_tokens": 0, "output_tokens": 1}\n', "field input_tokens: 0 is outside 1..1e+06"),
    ('{"timestamp_s": "soon", "input_tokens": 1, "output_tokens": 1}\n', "field timestamp_s: 'soon' is not a number"),
    ('{"timestamp_s": 0, "input_tokens": 1, "output_tokens": 1, "user": "x"}\n', "field user: not a trace field"),
    ('{"timestamp_s": 0, "input_tokens": 1, "output_tokens": 1}\n{oops\n', "line 2: not JSON"),
    ("time,in,out\n0,1,1\n", "line 1: the CSV header is 'time,in,out'"),
    ("timestamp_s,input_tokens,output_tokens\n0,1,true\n", "line 2 field output_tokens: 'true' is not a whole number"),
    ("", "no requests in it"),
])
def test_a_bad_trace_names_file_line_field_and_the_fix_exit_65(text: str, said: str) -> None:
    from metralectl.bench.trace import TraceInvalid, parse
    from metralectl.errors import ExitCode

    with pytest.raises(TraceInvalid) as caught:
        parse(text, "my.trace")
    assert caught.value.message.startswith("trace my.trace") and said in caught.value.message, caught.value.message
    assert caught.value.hint and caught.value.exit_code == ExitCode.DATA == 65


def test_trace_file_read_capped_and_the_shipped_sample_plans_its_schedule(tmp_path: Any) -> None:
    from metralectl.bench import trace as T

    big = tmp_path / "big.jsonl"
    big.write_bytes(b" " * (T.MAX_BYTES + 1))
    with pytest.raises(Exception) as caught:
        T.load(str(big))
    assert getattr(caught.value, "exit_code", None) == 65
    with pytest.raises(T.TraceInvalid, match="no such file"):
        T.load(str(tmp_path / "nope.csv"))
    requests, name = T.load("sample")
    assert name == "sample" and len(requests) == 40 and len({r.session for r in requests}) == 3
    p = params("trace", "speed=2", "max_requests=5")
    (stage,) = get_suite("trace").stages(p)
    assert stage.load.mode == "trace" and stage.load.requests == 5 and len(stage.trace) == 5
    assert stage.load.schedule[0] == 0 and stage.load.schedule[-1] == pytest.approx(
        (requests[4].timestamp_s - requests[0].timestamp_s) / 2, abs=1e-6)
    assert stage.trace[0] == (requests[0].input_tokens, requests[0].output_tokens, requests[0].session)


def test_a_replayed_request_has_its_own_length_and_a_session_shares_its_head() -> None:
    f = RequestFactory(model="m", max_tokens=99, text="", nonce=2,
                       per_request=(("aa", 10, 4, 500000), ("bb", 20, 8, 1), ("aa bb", 30, 16, 500000)))
    bodies = [json.loads(f(i).body) for i in range(3)]
    assert [b["max_tokens"] for b in bodies] == [4, 8, 16] and [f(i).expected_prompt_tokens for i in range(3)] == [10, 20, 30]
    assert bodies[0]["min_tokens"] == 4
    assert bodies[2]["messages"][0]["content"].startswith(bodies[0]["messages"][0]["content"])  # one session


def test_size_trace_shares_a_filler_within_a_session() -> None:
    from metralectl.bench.sizing import SESSION_KEY, size_trace
    from metralectl.bench.suites.base import Stage
    from metralectl.bench.loadgen import LoadSpec

    def count(msgs: list[dict[str, str]]) -> int:
        return len(msgs[0]["content"].split())

    stage = Stage("t", LoadSpec(), 8, trace=((30, 4, "a"), (50, 8, "a"), (30, 4, None)))
    sizing: dict[str, Any] = {}
    out = size_trace(stage, 0, count, sizing, lambda s: None)
    assert [o[1] for o in out] == [30, 50, 30] and [o[3] for o in out] == [SESSION_KEY, SESSION_KEY, 2]
    assert out[1][0].startswith(out[0][0]) and out[2][0] != out[0][0]
    assert sizing["trace"]["sessions"] == 1


def test_multi_turn_plans_the_next_turn_from_the_answers_the_engine_gave() -> None:
    suite = get_suite("multi-turn")
    p = params("multi-turn", "users=2", "turns=2", "turn_words=5")
    (first,) = suite.stages(p)
    assert first.keep_content and [json.loads(h) for h, _ in first.turns] == [[], []]
    results = [result(0), result(1)]
    results[0].content, results[1].content = "answer zero", "answer one"
    assert suite.more is not None
    (second,) = suite.more(p, [(first, results, {"errors": 0})])
    said = json.loads(second.turns[1][0])
    assert said == [{"role": "user", "content": first.turns[1][1]}, {"role": "assistant", "content": "answer one"}]
    assert second.labels["turn"] == 2 and suite.more(p, [(second, results, {})]) == []  # turns=2: done
    results[1].ok = False
    assert suite.more(p, [(first, results, {})]) == []  # a lost answer: no next turn
    f = RequestFactory(model="m", max_tokens=4, text="", prefix="none", turns=second.turns)
    assert json.loads(f(1).body)["messages"] == said + [{"role": "user", "content": second.turns[1][1]}]
