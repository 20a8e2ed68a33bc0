"""The decode suite: one stream, a short prompt, N repeats -> p50 decode tok/s (pure)."""

from __future__ import annotations

from typing import Any

from metralectl.bench.params import Param
from metralectl.bench.stats import percentile
from metralectl.bench.suites.base import Measured, Stage, Suite, base_load

FRANCE = "What is the capital of France?"


def _decode_stages(p: dict[str, Any]) -> list[Stage]:
    load = base_load(p, concurrency=1, warmup_requests=p["warmup"], requests=p["repeats"])
    return [Stage("decode", load, p["max_tokens"], prompt=p["prompt"], prefix="none",
                  labels={"concurrency": 1, "osl": p["max_tokens"]})]


def _decode_summary(p: dict[str, Any], runs: Measured) -> dict[str, Any]:
    _, results, agg = runs[0]
    headline = {"decode_tok_s_p50": (agg["stream_tok_s"] or {}).get("p50"), "ttft_ms_p50": agg["ttft_ms"]["p50"],
                "tpot_ms_p50": agg["tpot_ms"]["p50"], "output_tokens_p50": percentile(
                    [r.output_tokens for r in results if r.phase == "measure" and r.ok], 50),
                "errors": agg["errors"]}
    return {"headline": headline}


SUITE = Suite("decode", "single-request decode tok/s", f"One stream, short prompt ({FRANCE!r}), N repeats -> p50 "
      "decode tok/s: the recipes' headline number. Gated against the recipe's validated value.", (
          Param("prompt", "str", FRANCE, "the prompt, sent as is"),
          Param("max_tokens", "int", 128, "output tokens per request", 1, 128),
          Param("temperature", "float", 0.0, "sampling temperature", 0, 0.1),
          Param("repeats", "int", 10, "measured requests", 1),
          Param("warmup", "int", 2, "unmeasured requests first", 0),
          Param("tolerance", "float", 0.10, "recipe gate: p50 may be this fraction below the validated tok/s", 0, 1),
          Param("min_tok_s", "float", 0.0, "gate: p50 decode tok/s at least this (0: recipe gate only)", 0)),
      _decode_stages, _decode_summary)
