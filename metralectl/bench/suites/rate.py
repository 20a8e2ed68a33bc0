"""The rate suite: open-loop arrivals per rate, goodput under SLOs (pure)."""

from __future__ import annotations

from typing import Any

from metralectl.bench.params import Param
from metralectl.bench.results import RequestResult
from metralectl.bench.suites.base import Measured, Stage, Suite, base_load, flat


def _rate_stages(p: dict[str, Any]) -> list[Stage]:
    out = []
    for r in p["rates"]:
        load = base_load(p, mode=p["arrival"], rate=r, concurrency=p["max_inflight"], warmup_s=p["warmup_s"],
                     duration_s=p["duration_s"])
        out.append(Stage(f"rate={r:g}/s", load, p["osl"], isl=p["isl"],
                         labels={"rate": r, "isl": p["isl"], "osl": p["osl"], "arrival": p["arrival"]}))
    return out


def goodput(results: list[RequestResult], slo_ttft_ms: float, slo_tpot_ms: float, seconds: float) -> dict[str, Any]:
    measured = [r for r in results if r.phase == "measure"]
    good = [r for r in measured if r.ok and r.ttft_ms is not None and r.ttft_ms <= slo_ttft_ms
            and (r.tpot_ms is None or r.tpot_ms <= slo_tpot_ms)]
    return {"goodput_rps": len(good) / seconds if seconds > 0 else None,
            "slo_attainment": len(good) / len(measured) if measured else None,
            "offered_rps": len(measured) / seconds if seconds > 0 else None}


def _rate_summary(p: dict[str, Any], runs: Measured) -> dict[str, Any]:
    headline: dict[str, Any] = {}
    for stage, results, agg in runs:
        key = f"rate{stage.labels['rate']:g}."
        g = goodput(results, p["slo_ttft_ms"], p["slo_tpot_ms"], agg.get("window_s") or 0.0)
        agg.update(g)
        headline.update({key + k: v for k, v in g.items()})
        headline.update(flat(key, agg, ("p50", "p95")))
    return {"headline": headline}


SUITE = Suite("rate", "goodput under open-loop arrivals", "Open-loop arrivals (Poisson or constant) per rate; goodput = "
      "requests/s meeting both the TTFT and the TPOT SLO.", (
          Param("rates", "floats", [1.0, 2.0, 4.0], "arrival rates (requests/s)", 0.001),
          Param("arrival", "str", "poisson", "arrival process", choices=("poisson", "constant")),
          Param("isl", "int", 128, "prompt length (tokens)", 1),
          Param("osl", "int", 128, "output tokens", 1),
          Param("duration_s", "float", 30.0, "measured window per rate", 0.1),
          Param("warmup_s", "float", 3.0, "arrivals before each window opens", 0),
          Param("max_inflight", "int", 256, "connection pool / most requests in flight", 1),
          Param("slo_ttft_ms", "float", 1000.0, "TTFT SLO", 0),
          Param("slo_tpot_ms", "float", 100.0, "TPOT SLO", 0),
          Param("temperature", "float", 0.0, "sampling temperature", 0, 2),
          Param("min_slo_attainment", "float", 0.0, "gate: every rate meets both SLOs this often (0: none)", 0, 1)),
      _rate_stages, _rate_summary)
