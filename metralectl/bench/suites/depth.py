"""The depth suite: prompt processing (pp) and generation (tg) tok/s at context depths, defined as llama-benchy
defines them so the numbers compare with what the Spark community publishes (pure).

llama-benchy 0.4.0 (PyPI), read from its source (client.py, runner.py, results.py):
- a test `pp{P} tg{T} @ d{D}` sends one chat: the context (D tokens) as a system message, then P prompt tokens as
  the user turn; at depth 0 only the user turn. Its prompt adaptation makes the server's prompt_tokens P + D
  (chat template included): the same total is sized here with the engine's /tokenize.
- pp tok/s = prompt tokens (the server's usage) / (time to the first response chunk - network latency), where the
  latency is the mean of three `GET /v1/models` (its default --latency-mode api). Without the prefix cache the
  whole prompt counts, context included: at depth D this is the prefill speed over P + D tokens.
- tg tok/s = (output tokens - 1) / (last token's arrival - first token's arrival) per request.
- the number is the mean (and standard deviation) over the runs (default 3, after one warm-up run per test).
- the prefix-cache test (`--enable-prefix-caching`, depth > 0): first the context alone with "." as the user
  turn (ctx_pp, ctx_tg: every prompt token counts), then the same context with the prompt (pp, tg), whose pp
  counts only the P new tokens: the context is in the cache.
What differs is said in docs/bench.md ("depth").
"""

from __future__ import annotations

from statistics import mean, pstdev
from typing import Any

from metralectl.bench.params import Param
from metralectl.bench.results import RequestResult
from metralectl.bench.suites.base import Measured, Stage, Suite, base_load


def fits(p: dict[str, Any], depth: int) -> bool:
    """A depth whose prompt and output fit the served context (max_context 0: not known, all run)."""
    limit = p.get("max_context") or 0
    return not limit or depth + p["pp"] + p["tg"] <= limit


def _depth_stages(p: dict[str, Any]) -> list[Stage]:
    out = []
    cache = p["prefix_cache"]
    for d in p["depths"]:
        if not fits(p, d):
            continue
        pairs = cache and d > 0
        per = 2 if pairs else 1  # a context load and its prompt: one pair per run
        load = base_load(p, concurrency=1, warmup_requests=per * p["warmup"], requests=per * p["runs"])
        out.append(Stage(f"pp{p['pp']} tg{p['tg']} @ d{d}", load, p["tg"], isl=p["pp"],
                         prefix="ctxpairs" if pairs else ("depth" if d else "head"), depth=d,
                         labels={"depth": d, "pp": p["pp"], "tg": p["tg"], "prefix_cache": pairs}))
    return out


def _stats(values: list[float]) -> dict[str, Any]:
    return {"mean": round(mean(values), 3), "std": round(pstdev(values), 3), "n": len(values),
            "values": [round(v, 3) for v in values]} if values else {"mean": None, "std": None, "n": 0, "values": []}


def pp_speed(r: RequestResult, tokens: int | None, rtt_ms: float) -> float | None:
    """Prompt tokens per second of the prefill: tokens / (time to the first response - network latency)."""
    if tokens is None or r.ttft_ms is None:
        return None
    seconds = (r.ttft_ms - rtt_ms) / 1000
    return tokens / seconds if seconds > 0 else None


def _depth_summary(p: dict[str, Any], runs: Measured) -> dict[str, Any]:
    headline: dict[str, Any] = {}
    depths: list[dict[str, Any]] = []
    for stage, results, agg in runs:
        d = stage.labels["depth"]
        rtt = agg.get("api_rtt_ms") or 0.0
        ok = [r for r in results if r.phase == "measure" and r.ok]
        warm = [r for r in ok if r.tag != "ctx"]
        ctx = [r for r in ok if r.tag == "ctx"]
        # the prefix-cache prompt counts its new tokens only (llama-benchy: P); else the server's prompt_tokens
        counted = (lambda r: p["pp"]) if stage.labels["prefix_cache"] else (lambda r: r.prompt_tokens or r.expected_prompt_tokens)
        row: dict[str, Any] = {
            "depth": d, "test": stage.name,
            "pp_tok_s": _stats([x for x in (pp_speed(r, counted(r), rtt) for r in warm) if x is not None]),
            "tg_tok_s": _stats([r.decode_tok_s for r in warm if r.decode_tok_s is not None]),
            "ttfr_ms": _stats([r.ttft_ms for r in warm if r.ttft_ms is not None]),
            "prompt_tokens": sorted({r.prompt_tokens for r in warm if r.prompt_tokens is not None}),
            "api_rtt_ms": rtt, "errors": agg["errors"], "requests": agg["requests"]}
        if stage.labels["prefix_cache"]:
            row["ctx_pp_tok_s"] = _stats([x for x in (pp_speed(r, r.prompt_tokens, rtt) for r in ctx) if x is not None])
            row["ctx_tg_tok_s"] = _stats([r.decode_tok_s for r in ctx if r.decode_tok_s is not None])
            row["ctx_prompt_tokens"] = sorted({r.prompt_tokens for r in ctx if r.prompt_tokens is not None})
        depths.append(row)
        key = f"d{d}."
        headline[key + "pp_tok_s"] = row["pp_tok_s"]["mean"]
        headline[key + "pp_tok_s_std"] = row["pp_tok_s"]["std"]
        headline[key + "tg_tok_s"] = row["tg_tok_s"]["mean"]
        headline[key + "tg_tok_s_std"] = row["tg_tok_s"]["std"]
        if "ctx_pp_tok_s" in row:
            headline[key + "ctx_pp_tok_s"] = row["ctx_pp_tok_s"]["mean"]
            headline[key + "ctx_tg_tok_s"] = row["ctx_tg_tok_s"]["mean"]
        headline[key + "errors"] = agg["errors"]
    skipped = [d for d in p["depths"] if not fits(p, d)]
    return {"headline": headline, "depths": depths, "skipped_depths": skipped,
            "max_context": p.get("max_context") or None}


SUITE = Suite(
    "depth", "prompt processing and generation tok/s at context depths (llama-benchy's pp/tg)",
    "Prompt processing and generation tok/s at context depths (0, 4096, 16384, 32768 by default; depths whose "
    "prompt and output do not fit the served context are skipped and said), as llama-benchy defines them: the "
    "context as a system message, pp = prompt tokens / (time to first response - API latency), tg = (tokens - 1) "
    "/ decode time, mean and std over the runs. prefix_cache=true: the context is loaded first, then the prompt "
    "after it (llama-benchy --enable-prefix-caching).", (
        Param("depths", "ints", [0, 4096, 16384, 32768], "context depths (tokens before the prompt)", 0),
        Param("pp", "int", 2048, "prompt tokens after the context (llama-benchy --pp)", 1),
        Param("tg", "int", 32, "output tokens (llama-benchy --tg)", 1),
        Param("runs", "int", 3, "measured runs per depth (llama-benchy --runs)", 1),
        Param("warmup", "int", 1, "unmeasured runs per depth first (llama-benchy: one)", 0),
        Param("prefix_cache", "bool", False, "load the context first, then measure the prompt after it "
              "(llama-benchy --enable-prefix-caching)"),
        Param("latency_mode", "str", "api", "network latency taken off the time to first response: api (mean of "
              "three GET /v1/models, llama-benchy's default) or none", choices=("api", "none")),
        Param("max_context", "int", 0, "skip depths whose depth + pp + tg exceed this (0: the served context "
              "when the server says it, else none skipped)", 0),
        Param("temperature", "float", 0.0, "sampling temperature", 0, 2)),
    _depth_stages, _depth_summary)
