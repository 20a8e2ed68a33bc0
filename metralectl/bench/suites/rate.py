"""The rate suite: open-loop arrivals per rate, goodput under SLOs, and a sweep to saturation (pure).

`rates=auto` sweeps: rate_start, then times rate_factor each stage, until the throughput stops growing (less
than knee_growth over the best rate before) or the SLO attainment collapses (below knee_attainment), or
max_rates stages ran. The knee is the highest rate that still grew the throughput with the SLOs held.
"""

from __future__ import annotations

from typing import Any

from metralectl.bench.params import Param
from metralectl.bench.results import RequestResult
from metralectl.bench.suites.base import Measured, Stage, Suite, base_load, flat


def _stage(p: dict[str, Any], r: float) -> Stage:
    load = base_load(p, mode=p["arrival"], rate=r, concurrency=p["max_inflight"], warmup_s=p["warmup_s"],
                     duration_s=p["duration_s"])
    return Stage(f"rate={r:g}/s", load, p["osl"], isl=p["isl"],
                 labels={"rate": r, "isl": p["isl"], "osl": p["osl"], "arrival": p["arrival"]})


def _rate_stages(p: dict[str, Any]) -> list[Stage]:
    if p["rates"] == "auto":
        return [_stage(p, p["rate_start"])]
    return [_stage(p, r) for r in p["rates"]]


def meets_slo(r: RequestResult, slo_ttft_ms: float, slo_tpot_ms: float, slo_itl_ms: float = 0.0) -> bool:
    """A request that counts toward goodput: complete, TTFT and TPOT (mean gap) within their SLOs, and, with an
    ITL SLO, every gap between its tokens within it (one stall fails it)."""
    if not r.ok or r.ttft_ms is None or r.ttft_ms > slo_ttft_ms:
        return False
    if r.tpot_ms is not None and r.tpot_ms > slo_tpot_ms:
        return False
    return not slo_itl_ms or max(r.itl_ms, default=0.0) <= slo_itl_ms


def goodput(results: list[RequestResult], slo_ttft_ms: float, slo_tpot_ms: float, seconds: float,
            slo_itl_ms: float = 0.0) -> dict[str, Any]:
    measured = [r for r in results if r.phase == "measure"]
    good = [r for r in measured if meets_slo(r, slo_ttft_ms, slo_tpot_ms, slo_itl_ms)]
    return {"goodput_rps": len(good) / seconds if seconds > 0 else None,
            "slo_attainment": len(good) / len(measured) if measured else None,
            "offered_rps": len(measured) / seconds if seconds > 0 else None}


def _measure(p: dict[str, Any], results: list[RequestResult], agg: dict[str, Any]) -> dict[str, Any]:
    return goodput(results, p["slo_ttft_ms"], p["slo_tpot_ms"], agg.get("window_s") or 0.0, p["slo_itl_ms"])


def knee(p: dict[str, Any], runs: Measured) -> dict[str, Any]:
    """Where a sweep saturates: per rate its throughput and attainment, the knee, and why the sweep stopped
    (None while it should go on)."""
    best: dict[str, Any] | None = None
    why: str | None = None
    for stage, results, agg in runs:
        rate, tput = stage.labels["rate"], agg.get("output_tok_s") or 0.0
        att = _measure(p, results, agg)["slo_attainment"] or 0.0
        if att < p["knee_attainment"]:
            why = (f"SLO attainment collapsed at {rate:g}/s: {att:.0%} of requests met the SLOs "
                   f"(knee_attainment {p['knee_attainment']:g})")
            break
        if best is not None and tput < best["output_tok_s"] * (1 + p["knee_growth"]):
            why = (f"throughput stopped growing at {rate:g}/s: {tput:.1f} output tok/s against {best['output_tok_s']:.1f} "
                   f"at {best['rate']:g}/s (knee_growth {p['knee_growth']:.0%})")
            break
        best = {"rate": rate, "output_tok_s": tput, "slo_attainment": att,
                "goodput_rps": _measure(p, results, agg)["goodput_rps"]}
    if why is None and len(runs) >= p["max_rates"]:
        why = f"max_rates ({p['max_rates']}) reached before saturation"
    return {"knee": best, "stopped": why}


def _more(p: dict[str, Any], runs: Measured) -> list[Stage]:
    if p["rates"] != "auto" or not runs or knee(p, runs)["stopped"] is not None:
        return []
    stage, _, agg = runs[-1]
    if not agg.get("ok"):
        return []
    return [_stage(p, round(stage.labels["rate"] * p["rate_factor"], 6))]


def _rate_summary(p: dict[str, Any], runs: Measured) -> dict[str, Any]:
    headline: dict[str, Any] = {}
    for stage, results, agg in runs:
        key = f"rate{stage.labels['rate']:g}."
        g = _measure(p, results, agg)
        agg.update(g)
        headline.update({key + k: v for k, v in g.items()})
        headline.update(flat(key, agg, ("p50", "p95")))
    out: dict[str, Any] = {"headline": headline}
    if p["rates"] == "auto":
        sat = knee(p, runs)
        out["saturation"] = sat
        k = sat["knee"] or {}
        headline.update({"knee.rate": k.get("rate"), "knee.output_tok_s": k.get("output_tok_s"),
                         "knee.goodput_rps": k.get("goodput_rps"), "knee.slo_attainment": k.get("slo_attainment")})
    return out


SUITE = Suite(
    "rate", "goodput under open-loop arrivals", "Open-loop arrivals (Poisson or constant) per rate; goodput = "
    "requests/s meeting the TTFT, TPOT (and, when given, ITL) SLOs, next to throughput. rates=auto sweeps up to "
    "saturation and reports the knee.", (
        Param("rates", "floats", [1.0, 2.0, 4.0], "arrival rates (requests/s), or auto: sweep to saturation",
              0.001, choices=("auto",)),
        Param("arrival", "str", "poisson", "arrival process", choices=("poisson", "constant")),
        Param("isl", "int", 128, "prompt length (tokens)", 1),
        Param("osl", "int", 128, "output tokens", 1),
        Param("duration_s", "float", 30.0, "measured window per rate", 0.1),
        Param("warmup_s", "float", 3.0, "arrivals before each window opens", 0),
        Param("max_inflight", "int", 256, "connection pool / most requests in flight", 1),
        Param("slo_ttft_ms", "float", 1000.0, "TTFT SLO", 0),
        Param("slo_tpot_ms", "float", 100.0, "TPOT SLO (a request's mean gap between tokens)", 0),
        Param("slo_itl_ms", "float", 0.0, "ITL SLO: every gap between a request's tokens at most this (0: none)", 0),
        Param("rate_start", "float", 1.0, "rates=auto: the first rate (requests/s)", 0.001),
        Param("rate_factor", "float", 2.0, "rates=auto: each rate is the last times this", 1.05),
        Param("max_rates", "int", 8, "rates=auto: most rates to try", 1),
        Param("knee_growth", "float", 0.05, "rates=auto: saturated when output tok/s grows less than this fraction",
              0, 10),
        Param("knee_attainment", "float", 0.5, "rates=auto: saturated when fewer requests than this meet the SLOs",
              0, 1),
        Param("temperature", "float", 0.0, "sampling temperature", 0, 2),
        Param("min_slo_attainment", "float", 0.0, "gate: every rate (with rates=auto: the knee) meets the SLOs this "
              "often (0: none)", 0, 1)),
    _rate_stages, _rate_summary, more=_more)
