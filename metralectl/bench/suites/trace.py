"""The trace suite: replay a request trace (arrival times, input and output lengths, sessions) open-loop (pure but for
reading the trace file, bounded and validated in bench/trace.py)."""

from __future__ import annotations

from typing import Any

from metralectl.bench import trace as T
from metralectl.bench.params import Param
from metralectl.bench.suites.base import Measured, Stage, Suite, base_load, flat
from metralectl.bench.suites.rate import goodput


def _trace_stages(p: dict[str, Any]) -> list[Stage]:
    requests, name = T.load(p["trace"])
    if p["max_requests"]:
        requests = requests[:p["max_requests"]]
    start = requests[0].timestamp_s
    schedule = tuple(round((r.timestamp_s - start) / p["speed"], 6) for r in requests)
    load = base_load(p, mode="trace", schedule=schedule, concurrency=p["max_inflight"], requests=len(requests))
    return [Stage(f"trace {len(requests)} requests over {schedule[-1]:g} s", load,
                  max(r.output_tokens for r in requests), isl=None,
                  trace=tuple((r.input_tokens, r.output_tokens, r.session) for r in requests),
                  labels={"trace": name, "requests": len(requests), "speed": p["speed"],
                          "sessions": len({r.session for r in requests if r.session is not None})})]


def _trace_summary(p: dict[str, Any], runs: Measured) -> dict[str, Any]:
    stage, results, agg = runs[0]
    g = goodput(results, p["slo_ttft_ms"], p["slo_tpot_ms"], agg.get("window_s") or 0.0, p["slo_itl_ms"])
    agg.update(g)
    measured = [r for r in results if r.phase == "measure"]
    lateness = [(r.t_send - r.t_sched) / 1e6 for r in measured if r.t_sched is not None]
    headline = {**flat("", agg), **g, "prompt_tokens_mismatch": agg.get("prompt_tokens_mismatch"),
                "dispatch_late_ms_max": round(max(lateness), 3) if lateness else None}
    return {"headline": headline, "trace": stage.labels}


SUITE = Suite(
    "trace", "replay a request trace", "Requests sent when a trace says (timestamp_s), each with its input and output "
    "length (input_tokens sized with /tokenize, output forced), sessions sharing their prompt's start; TTFT, TPOT, "
    "ITL, goodput under the SLOs. The trace: CSV or JSONL (docs/bench.md); default the shipped sample (40 requests, "
    "20 s, 3 sessions).", (
        Param("trace", "str", "sample", "the trace file (CSV or JSONL), or sample: the one shipped"),
        Param("speed", "float", 1.0, "replay this many times faster (2: half the gaps)", 0.001),
        Param("max_requests", "int", 0, "replay the first N requests (0: all)", 0),
        Param("max_inflight", "int", 256, "connection pool / most requests in flight", 1),
        Param("slo_ttft_ms", "float", 1000.0, "TTFT SLO", 0),
        Param("slo_tpot_ms", "float", 100.0, "TPOT SLO", 0),
        Param("slo_itl_ms", "float", 0.0, "ITL SLO: every gap between a request's tokens at most this (0: none)", 0),
        Param("temperature", "float", 0.0, "sampling temperature", 0, 2)),
    _trace_stages, _trace_summary)
