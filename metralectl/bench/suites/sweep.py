"""The concurrency-sweep suite: concurrencies x input/output lengths (pure)."""

from __future__ import annotations

from typing import Any

from metralectl.bench.params import Param, parse_shard
from metralectl.bench.suites.base import Measured, Stage, Suite, base_load, flat


def _sweep_stages(p: dict[str, Any]) -> list[Stage]:
    i, n = parse_shard(p["shard"])
    rungs = [(c, isl, osl) for isl in p["isls"] for osl in p["osl"] for c in p["concurrencies"]]
    out = []
    for k, (c, isl, osl) in enumerate(rungs):
        if k % n != i:
            continue
        load = base_load(p, concurrency=c, warmup_s=p["warmup_s"], duration_s=p["duration_s"])
        out.append(Stage(f"c={c} isl={isl} osl={osl}", load, osl, isl=isl,
                         labels={"concurrency": c, "isl": isl, "osl": osl}))
    return out


def _rung_key(stage: Stage) -> str:
    lab = stage.labels
    return f"c{lab['concurrency']}_isl{lab['isl']}_osl{lab['osl']}"


def _sweep_summary(p: dict[str, Any], runs: Measured) -> dict[str, Any]:
    headline: dict[str, Any] = {}
    for stage, _, agg in runs:
        headline.update(flat(_rung_key(stage) + ".", agg))
    return {"headline": headline}


SUITE = Suite("concurrency-sweep", "throughput and latency per concurrency", "Concurrencies x input/output lengths; per "
      "rung aggregate output tok/s, per-stream tok/s, TTFT p50/p95/p99, TPOT and ITL p50/p95, E2E, errors.", (
          Param("concurrencies", "ints", [1, 2, 4, 8, 16], "parallel streams per rung", 1, 4096),
          Param("isls", "ints", [128], "prompt lengths (tokens)", 1),
          Param("osl", "ints", [128], "output lengths (tokens)", 1),
          Param("duration_s", "float", 20.0, "measured window per rung", 0.1),
          Param("warmup_s", "float", 3.0, "load before each window opens", 0),
          Param("temperature", "float", 0.0, "sampling temperature", 0, 2),
          Param("shard", "str", "0/1", "run rung k when k % n == i (i/n), to split a sweep over nodes")),
      _sweep_stages, _sweep_summary)
