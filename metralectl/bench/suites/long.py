"""The long-decode suite: sustained long decodes, halves, stalls, repetition (pure)."""

from __future__ import annotations

from typing import Any

from metralectl.bench.params import Param
from metralectl.bench.stats import percentile
from metralectl.bench.suites.base import Measured, Stage, Suite, base_load


def _long_stages(p: dict[str, Any]) -> list[Stage]:
    load = base_load(p, concurrency=p["concurrency"], warmup_requests=0, requests=p["repeats"])
    return [Stage(f"long osl={p['osl']}", load, p["osl"], isl=p["isl"], keep_content=True,
                  labels={"concurrency": p["concurrency"], "isl": p["isl"], "osl": p["osl"]})]


def repetition(text: str, n: int = 4) -> float | None:
    """1 - distinct word n-grams / all n-grams: 0 for varied text, near 1 for a loop."""
    words = text.split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else None


def _long_summary(p: dict[str, Any], runs: Measured) -> dict[str, Any]:
    _, results, agg = runs[0]
    ok = [r for r in results if r.phase == "measure" and r.ok]
    halves: list[tuple[float, float]] = []
    for r in ok:
        t = r.token_ns
        mid = len(t) // 2
        if mid >= 2 and t[mid] > t[0] and t[-1] > t[mid]:
            halves.append(((mid - 1) / ((t[mid - 1] - t[0]) / 1e9 or 1e-9), (len(t) - mid) / ((t[-1] - t[mid - 1]) / 1e9)))
    first = percentile([h[0] for h in halves], 50)
    second = percentile([h[1] for h in halves], 50)
    reps = [x for x in (repetition(r.content or "") for r in ok) if x is not None]
    return {"headline": {"decode_tok_s_p50": (agg["stream_tok_s"] or {}).get("p50"),
                         "tpot_ms_p95": agg["tpot_ms"]["p95"], "itl_ms_p99": agg["itl_ms"]["p99"],
                         "itl_ms_max": agg["itl_ms"]["max"], "tok_s_first_half_p50": first,
                         "tok_s_second_half_p50": second,
                         "second_half_ratio": (second / first) if first and second else None,
                         "repetition_max": max(reps) if reps else None,
                         "short_outputs": sum(1 for r in ok if r.output_tokens < p["osl"]), "errors": agg["errors"]}}


SUITE = Suite("long-decode", "sustained long decodes", "600-token decodes: tok/s over the first and second half, TPOT, "
      "worst ITL (stalls), repetition of the text (coherence smoke test).", (
          Param("osl", "int", 600, "output tokens", 2),
          Param("isl", "int", 128, "prompt length (tokens)", 1),
          Param("repeats", "int", 3, "measured requests", 1),
          Param("concurrency", "int", 1, "parallel streams", 1),
          Param("temperature", "float", 0.0, "sampling temperature", 0, 2),
          Param("max_repetition", "float", 0.0, "gate: repetition of any output at most this (0: none)", 0, 1)),
      _long_stages, _long_summary)
