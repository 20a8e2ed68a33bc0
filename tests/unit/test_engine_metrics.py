"""Engine /metrics text → snapshot → rates."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metralectl.errors import MetralError
from metralectl.telemetry.engine_metrics import (
    engine_rates,
    histogram_quantile,
    parse_metrics,
)

METRICS = """\
# HELP metrale_requests_total Completed inference requests.
# TYPE metrale_requests_total counter
metrale_requests_total{model="Sehyo/Qwen3.5-35B-A3B-NVFP4",status="200"} 96
metrale_requests_total{model="Sehyo/Qwen3.5-35B-A3B-NVFP4",status="499"} 4
# HELP metrale_requests_active Inference requests in flight.
# TYPE metrale_requests_active gauge
metrale_requests_active 3
# HELP metrale_time_to_first_token_seconds Time to first token.
# TYPE metrale_time_to_first_token_seconds histogram
metrale_time_to_first_token_seconds_bucket{model="Sehyo/Qwen3.5-35B-A3B-NVFP4",le="0.025"} 10
metrale_time_to_first_token_seconds_bucket{model="Sehyo/Qwen3.5-35B-A3B-NVFP4",le="0.05"} 40
metrale_time_to_first_token_seconds_bucket{model="Sehyo/Qwen3.5-35B-A3B-NVFP4",le="0.1"} 90
metrale_time_to_first_token_seconds_bucket{model="Sehyo/Qwen3.5-35B-A3B-NVFP4",le="0.25"} 98
metrale_time_to_first_token_seconds_bucket{model="Sehyo/Qwen3.5-35B-A3B-NVFP4",le="0.5"} 100
metrale_time_to_first_token_seconds_bucket{model="Sehyo/Qwen3.5-35B-A3B-NVFP4",le="+Inf"} 100
metrale_time_to_first_token_seconds_sum{model="Sehyo/Qwen3.5-35B-A3B-NVFP4"} 6.4
metrale_time_to_first_token_seconds_count{model="Sehyo/Qwen3.5-35B-A3B-NVFP4"} 100
# HELP metrale_prompt_tokens_total Prompt tokens processed.
# TYPE metrale_prompt_tokens_total counter
metrale_prompt_tokens_total 51200
# TYPE metrale_generation_tokens_total counter
metrale_generation_tokens_total 12800
# TYPE metrale_decoded_tokens_total counter
metrale_decoded_tokens_total 14650
# HELP metrale_spec_decode_verify_total Speculative draft verifications by depth k and outcome.
# TYPE metrale_spec_decode_verify_total counter
metrale_spec_decode_verify_total{k="1",outcome="accepted"} 850
metrale_spec_decode_verify_total{k="1",outcome="rejected"} 150
metrale_spec_decode_verify_total{k="2",outcome="accepted"} 600
metrale_spec_decode_verify_total{k="2",outcome="rejected"} 250
# TYPE metrale_tool_calls_total counter
metrale_tool_calls_total 17
# TYPE metrale_prefix_cache_hits_total counter
metrale_prefix_cache_hits_total 75
# TYPE metrale_prefix_cache_misses_total counter
metrale_prefix_cache_misses_total 25
# TYPE metrale_prefix_cache_hit_rate gauge
metrale_prefix_cache_hit_rate 0.750000
"""


def later(text: str, **changes: float) -> str:
    lines = []
    for line in text.splitlines():
        for name, value in changes.items():
            if line.startswith(name + " "):
                line = f"{name} {value}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_snapshot_values() -> None:
    s = parse_metrics(METRICS, t=100.0)
    assert s.requests_active == 3 and s.requests_total == 100
    assert (s.prompt_tokens_total, s.generation_tokens_total, s.decoded_tokens_total) == (51200, 12800, 14650)
    assert s.tool_calls_total == 17
    assert s.ttft is not None and s.ttft.count == 100 and s.ttft.mean == pytest.approx(0.064)
    assert s.ttft_p50_s == pytest.approx(0.06)  # rank 50 in (0.05, 0.1]: 0.05 + 0.05·10/50
    assert s.ttft_p95_s == pytest.approx(0.19375)  # rank 95 in (0.1, 0.25]: 0.1 + 0.15·5/8
    assert s.prefix_cache_hit_rate == pytest.approx(0.75)
    assert s.spec_acceptance == pytest.approx(1450 / 1850)
    assert s.spec_acceptance_by_k() == pytest.approx({"1": 0.85, "2": 600 / 850})
    assert s.to_json()["ttft_p50_s"] == pytest.approx(0.06)


def test_without_type_lines_parses_the_same() -> None:
    bare = "\n".join(line for line in METRICS.splitlines() if not line.startswith("#")) + "\n"
    a, b = parse_metrics(METRICS), parse_metrics(bare)
    assert a.to_json() == b.to_json()


def test_missing_series_are_unknown() -> None:
    s = parse_metrics("metrale_requests_active 0\n")
    assert s.requests_active == 0
    assert s.requests_total is None and s.ttft is None and s.ttft_p50_s is None
    assert s.prefix_cache_hit_rate is None and s.spec_acceptance is None


def test_hit_rate_gauge_used_when_counters_absent() -> None:
    assert parse_metrics("metrale_prefix_cache_hit_rate 0.4\n").prefix_cache_hit_rate == pytest.approx(0.4)


def test_rates_between_snapshots() -> None:
    text2 = later(METRICS, metrale_generation_tokens_total=12800 + 1310, metrale_prompt_tokens_total=51200 + 5120,
                  metrale_prefix_cache_hits_total=75 + 9, metrale_prefix_cache_misses_total=25 + 1)
    text2 = text2.replace('le="0.05"} 40', 'le="0.05"} 50').replace('le="0.1"} 90', 'le="0.1"} 100')
    text2 = text2.replace('le="0.25"} 98', 'le="0.25"} 108').replace('le="0.5"} 100', 'le="0.5"} 110')
    text2 = text2.replace('le="+Inf"} 100', 'le="+Inf"} 110').replace("_count{model=\"Sehyo/Qwen3.5-35B-A3B-NVFP4\"} 100",
                                                                     "_count{model=\"Sehyo/Qwen3.5-35B-A3B-NVFP4\"} 110")
    r = engine_rates(parse_metrics(METRICS, t=100.0), parse_metrics(text2, t=110.0))
    assert r.dt_s == 10.0 and not r.reset
    assert r.generation_tokens_per_s == pytest.approx(131.0)
    assert r.prompt_tokens_per_s == pytest.approx(512.0)
    assert r.prefix_cache_hit_rate == pytest.approx(0.9)
    # the 10 new TTFT observations all fell in (0.025, 0.05]: p50 of the interval is inside it
    assert 0.025 < r.ttft_p50_s <= 0.05  # type: ignore[operator]
    assert r.requests_per_s == 0.0


def test_counter_reset_gives_unknown_rate_not_negative() -> None:
    text2 = later(METRICS, metrale_generation_tokens_total=10)
    r = engine_rates(parse_metrics(METRICS, t=0.0), parse_metrics(text2, t=5.0))
    assert r.generation_tokens_per_s is None and r.reset


def test_rates_need_time() -> None:
    with pytest.raises(MetralError):
        engine_rates(parse_metrics(METRICS), parse_metrics(METRICS))
    assert engine_rates(parse_metrics(METRICS), parse_metrics(METRICS), dt_s=1.0).generation_tokens_per_s == 0.0


def test_garbage_is_a_metral_error() -> None:
    with pytest.raises(MetralError, match="not Prometheus text"):
        parse_metrics("<html><body>502 Bad Gateway</body></html>\n")


def test_quantile_edges() -> None:
    inf = math.inf
    assert histogram_quantile(0.5, []) is None
    assert histogram_quantile(0.5, [(0.1, 0), (inf, 0)]) is None  # no observations
    assert histogram_quantile(0.99, [(0.1, 1), (inf, 10)]) == 0.1  # rank in +Inf → highest finite bound
    assert histogram_quantile(0.5, [(0.1, 10), (inf, 10)]) == pytest.approx(0.05)  # first bucket from 0
    assert histogram_quantile(0.5, [(0.1, 10)]) is None  # no +Inf bucket: not a valid histogram


@given(st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=8),
       st.floats(min_value=0.01, max_value=0.99), st.floats(min_value=0.01, max_value=0.99))
def test_quantile_is_monotone_and_bounded(counts: list[int], q1: float, q2: float) -> None:
    bounds = [0.01 * 2**i for i in range(len(counts))]
    cumulative, acc = [], 0
    for c in counts:
        acc += c
        cumulative.append(acc)
    buckets = list(zip(bounds, cumulative)) + [(math.inf, acc + 1)]
    lo, hi = sorted((q1, q2))
    a, b = histogram_quantile(lo, buckets), histogram_quantile(hi, buckets)
    assert a is not None and b is not None
    assert 0 <= a <= b <= bounds[-1]


def test_parses_the_engine_double_metrics_text() -> None:
    """Real text from the engine test double's own renderer (tests/engine_double/metrale_double.py)."""
    path = Path(__file__).resolve().parents[1] / "engine_double" / "metrale_double.py"
    spec = importlib.util.spec_from_file_location("metrale_double_for_metrics", path)
    assert spec and spec.loader
    double = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(double)
    m = double.Metrics()
    for seconds in (0.004, 0.03, 0.04, 0.2):
        m.observe_ttft("test-model", seconds)
    m.spec_verify = {("2", "accepted"): 9, ("2", "rejected"): 3}
    m.prefix_hits, m.prefix_misses, m.generation_tokens = 3, 1, 640
    s = parse_metrics(m.render("test-model"))
    assert s.ttft is not None and s.ttft.count == 4
    assert 0.025 < s.ttft_p50_s <= 0.05  # type: ignore[operator]
    assert s.spec_acceptance == pytest.approx(0.75)
    assert s.prefix_cache_hit_rate == pytest.approx(0.75)
    assert s.generation_tokens_total == 640 and s.requests_total == 0
