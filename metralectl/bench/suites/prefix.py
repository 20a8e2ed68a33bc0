"""The ttft-prefix suite: the same long prompt twice, cold then warm (pure)."""

from __future__ import annotations

from typing import Any

from metralectl.bench.params import Param
from metralectl.bench.stats import percentile, summarize
from metralectl.bench.suites.base import Measured, Stage, Suite, base_load


def _prefix_stages(p: dict[str, Any]) -> list[Stage]:
    load = base_load(p, concurrency=1, requests=2 * p["repeats"])
    return [Stage("cold/warm", load, p["osl"], isl=p["isl"], prefix="pairs", labels={"isl": p["isl"]})]


def _prefix_summary(p: dict[str, Any], runs: Measured) -> dict[str, Any]:
    _, results, agg = runs[0]
    ok = [r for r in results if r.phase == "measure" and r.ok and r.ttft_ms is not None]
    cold = [r.ttft_ms for r in ok if r.tag == "cold" and r.ttft_ms is not None]
    warm = [r.ttft_ms for r in ok if r.tag == "warm" and r.ttft_ms is not None]
    c50, w50 = percentile(cold, 50), percentile(warm, 50)
    return {"headline": {"ttft_cold_ms_p50": c50, "ttft_warm_ms_p50": w50,
                         "prefix_speedup": (c50 / w50) if c50 and w50 else None, "errors": agg["errors"]},
            "cold_ms": summarize(cold), "warm_ms": summarize(warm)}


SUITE = Suite("ttft-prefix", "prefix-cache TTFT, cold vs warm", "The same long prompt twice: cold, then warm (needs "
      "--enable-prefix-caching on the engine). Reports TTFT of each and the speed-up.", (
          Param("isl", "int", 2048, "prompt length (tokens)", 16),
          Param("osl", "int", 16, "output tokens", 1),
          Param("repeats", "int", 5, "cold/warm pairs", 1),
          Param("temperature", "float", 0.0, "sampling temperature", 0, 2),
          Param("min_speedup", "float", 0.0, "gate: cold/warm TTFT ratio at least this (0: none)", 0)),
      _prefix_stages, _prefix_summary)
