"""The tool-call suite: tool calls come back well-formed (pure)."""

from __future__ import annotations

import json
from typing import Any

from metralectl.bench.params import Param
from metralectl.bench.results import RequestResult
from metralectl.bench.suites.base import Measured, Stage, Suite, base_load

WEATHER_TOOL: list[dict[str, Any]] = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def _tool_stages(p: dict[str, Any]) -> list[Stage]:
    load = base_load(p, concurrency=p["concurrency"], warmup_requests=0, requests=p["repeats"])
    return [Stage("tool-call", load, p["max_tokens"], prompt=p["prompt"], prefix="none", tools=True,
                  tool_choice=json.dumps(p["tool_choice"]), labels={"concurrency": p["concurrency"]})]


def tool_call_problems(r: RequestResult, names: set[str]) -> list[str]:
    """Why a response's tool calls are not well-formed (empty list: they are)."""
    if not r.tool_calls:
        return ["no tool_calls in the response"]
    problems = []
    for i, call in enumerate(r.tool_calls):
        if not call.get("id"):
            problems.append(f"call {i}: no id")
        if call.get("name") not in names:
            problems.append(f"call {i}: unknown function {call.get('name')!r}")
        try:
            if not isinstance(json.loads(call.get("arguments") or ""), dict):
                problems.append(f"call {i}: arguments are not a JSON object")
        except (ValueError, RecursionError):  # the engine's text: nested past Python's stack is not valid either
            problems.append(f"call {i}: arguments are not valid JSON: {str(call.get('arguments'))[:60]!r}")
    if r.finish_reason != "tool_calls":
        problems.append(f"finish_reason {r.finish_reason!r}, expected 'tool_calls'")
    return problems


def _tool_summary(p: dict[str, Any], runs: Measured) -> dict[str, Any]:
    _, results, agg = runs[0]
    measured = [r for r in results if r.phase == "measure"]
    names = {t["function"]["name"] for t in WEATHER_TOOL}
    bad = {r.index: tool_call_problems(r, names) for r in measured if r.ok}
    bad = {k: v for k, v in bad.items() if v}
    good = sum(1 for r in measured if r.ok) - len(bad)
    return {"headline": {"well_formed_frac": good / len(measured) if measured else None, "well_formed": good,
                         "requests": len(measured), "ttft_ms_p50": agg["ttft_ms"]["p50"], "errors": agg["errors"]},
            "malformed": {str(k): v for k, v in list(bad.items())[:20]}}


SUITE = Suite("tool-call", "tool calls come back well-formed", "Requests with a get_weather tool; every response must "
      "carry tool_calls with an id, a known name and JSON-object arguments, and finish with 'tool_calls'.", (
          Param("prompt", "str", "What is the weather in Paris? Use get_weather.", "the prompt"),
          Param("tool_choice", "str", "required", "tool_choice to send", choices=("required", "auto")),
          Param("max_tokens", "int", 256, "output token cap", 1),
          Param("repeats", "int", 10, "measured requests", 1),
          Param("concurrency", "int", 1, "parallel streams", 1),
          Param("temperature", "float", 0.0, "sampling temperature", 0, 2),
          Param("min_well_formed", "float", 1.0, "gate: fraction of well-formed responses", 0, 1)),
      _tool_stages, _tool_summary)
