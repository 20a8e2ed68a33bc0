"""The shared-prefix suite: a system prompt shared by N users, each request a suffix of its own (pure)."""

from __future__ import annotations

from typing import Any

from metralectl.bench.params import Param
from metralectl.bench.suites.base import Measured, Stage, Suite, base_load, flat


def _shared_stages(p: dict[str, Any]) -> list[Stage]:
    out = []
    for users in p["users"]:
        load = base_load(p, concurrency=users, warmup_s=p["warmup_s"], duration_s=p["duration_s"])
        out.append(Stage(f"users={users} prefix={p['prefix_tokens']} suffix={p['suffix_tokens']}", load, p["osl"],
                         isl=p["suffix_tokens"], depth=p["prefix_tokens"], prefix="shared",
                         labels={"users": users, "prefix_tokens": p["prefix_tokens"],
                                 "suffix_tokens": p["suffix_tokens"], "osl": p["osl"]}))
    return out


def _shared_summary(p: dict[str, Any], runs: Measured) -> dict[str, Any]:
    headline: dict[str, Any] = {}
    for stage, results, agg in runs:
        key = f"users{stage.labels['users']}."
        headline.update(flat(key, agg, ("p50", "p95")))
        prompts = sorted({r.prompt_tokens for r in results if r.phase == "measure" and r.prompt_tokens is not None})
        headline[key + "prompt_tokens"] = prompts[0] if len(prompts) == 1 else None
    return {"headline": headline}


SUITE = Suite(
    "shared-prefix", "a system prompt shared by N users", "Every request carries the same prefix_tokens-long system "
    "prompt and a suffix_tokens-long user turn of its own (prompt = prefix + suffix tokens, sized with /tokenize); "
    "closed loop with `users` streams per stage. With a prefix cache the shared part is computed once: TTFT shows it "
    "(compare prefix_tokens=0 or the ttft-prefix suite).", (
        Param("users", "ints", [1, 4, 16], "parallel users per stage", 1, 4096),
        Param("prefix_tokens", "int", 2048, "the shared system prompt's tokens", 1),
        Param("suffix_tokens", "int", 128, "each request's own user turn (tokens)", 16),
        Param("osl", "int", 128, "output tokens", 1),
        Param("duration_s", "float", 20.0, "measured window per stage", 0.1),
        Param("warmup_s", "float", 3.0, "load before each window opens", 0),
        Param("temperature", "float", 0.0, "sampling temperature", 0, 2)),
    _shared_stages, _shared_summary)
