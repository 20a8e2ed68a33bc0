"""The suites: parameter schemas, the stages each one runs, and how its results are summarised (pure)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from metralectl.bench.loadgen import LoadSpec
from metralectl.bench.params import Param, parse_shard
from metralectl.bench.results import RequestResult
from metralectl.bench.stats import percentile, summarize
from metralectl.bench.transport import TRANSPORTS
from metralectl.errors import NotFound
from metralectl.core.schema import did_you_mean

FRANCE = "What is the capital of France?"
WEATHER_TOOL: list[dict[str, Any]] = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

COMMON = (
    Param("model", "str", "", "model name to send (default: what /v1/models serves)"),
    Param("seed", "int", 0, "sampling seed and arrival-schedule seed", 0),
    Param("ignore_eos", "bool", True, "send ignore_eos/min_tokens so outputs are as long as asked"),
    Param("continuous_usage", "bool", True, "ask for usage on every chunk (exact tokens per chunk)"),
    Param("timeout_s", "float", 300.0, "per-request timeout", 1),
    Param("workers", "str", "auto", "load-generator processes: a number, or auto"),
    Param("transport", "str", "raw", "HTTP stack of the load generator", choices=TRANSPORTS),
    Param("max_stamp_error_ms", "float", 2.0, "client budget: p99 estimated error of token stamps (kernel stamps)", 0),
    Param("max_loop_lag_ms", "float", 2.0, "client budget without kernel stamps: p99 event-loop ready delay", 0),
    Param("client_bound", "str", "fail", "over the client budget: fail the run, or warn", choices=("fail", "warn")),
    Param("max_error_frac", "float", 0.0, "failed measured requests allowed, as a fraction (0: none)", 0, 1),
    Param("drain_timeout_s", "float", 120.0, "after the window, wait this long for measured requests still running", 1),
    Param("dialect", "str", "auto", "request extensions: auto (the engine's data when metralectl serves it, else a "
          "one-request probe), probe, full (send all), plain (standard OpenAI fields only)",
          choices=("auto", "probe", "full", "plain")),
    Param("tokenizer", "str", "", "tokenizer.json (or a dir with one) to count output tokens when the server "
          "reports no usage"),
)


@dataclass(frozen=True)
class Stage:
    """One load shape: a decode repeat series, a sweep rung, an arrival rate."""

    name: str
    load: LoadSpec
    osl: int
    isl: int | None = None  # sized with /tokenize; None: `prompt` as given
    prompt: str | None = None
    prefix: str = "unique"  # "unique" | "none" | "pairs"
    tools: bool = False
    tool_choice: str | None = None
    keep_content: bool = False
    labels: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Suite:
    id: str
    title: str
    description: str
    params: tuple[Param, ...]
    stages: Callable[[dict[str, Any]], list[Stage]]
    summarize: Callable[[dict[str, Any], list[tuple[Stage, list[RequestResult], dict[str, Any]]]], dict[str, Any]]

    @property
    def schema(self) -> tuple[Param, ...]:
        return self.params + COMMON


def _base(p: dict[str, Any], **kw: Any) -> LoadSpec:
    return LoadSpec(timeout_s=p["timeout_s"], seed=p["seed"], transport=p["transport"],
                    drain_timeout_s=p["drain_timeout_s"], tokenizer=p["tokenizer"], **kw)


def _flat(prefix: str, agg: dict[str, Any], keys: tuple[str, ...] = ("p50", "p95", "p99")) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric in ("ttft_ms", "ttft_content_ms", "tpot_ms", "itl_ms", "e2e_ms", "stream_tok_s"):
        for k in keys:
            out[f"{prefix}{metric}_{k}"] = (agg.get(metric) or {}).get(k)
    for metric in ("output_tok_s", "requests_per_s", "errors", "requests"):
        out[f"{prefix}{metric}"] = agg.get(metric)
    return out


# --- decode -------------------------------------------------------------------------------------
def _decode_stages(p: dict[str, Any]) -> list[Stage]:
    load = _base(p, concurrency=1, warmup_requests=p["warmup"], requests=p["repeats"])
    return [Stage("decode", load, p["max_tokens"], prompt=p["prompt"], prefix="none",
                  labels={"concurrency": 1, "osl": p["max_tokens"]})]


def _decode_summary(p: dict[str, Any], runs: list[tuple[Stage, list[RequestResult], dict[str, Any]]]) -> dict[str, Any]:
    _, results, agg = runs[0]
    headline = {"decode_tok_s_p50": (agg["stream_tok_s"] or {}).get("p50"), "ttft_ms_p50": agg["ttft_ms"]["p50"],
                "tpot_ms_p50": agg["tpot_ms"]["p50"], "output_tokens_p50": percentile(
                    [r.output_tokens for r in results if r.phase == "measure" and r.ok], 50),
                "errors": agg["errors"]}
    return {"headline": headline}


# --- concurrency sweep --------------------------------------------------------------------------
def _sweep_stages(p: dict[str, Any]) -> list[Stage]:
    i, n = parse_shard(p["shard"])
    rungs = [(c, isl, osl) for isl in p["isls"] for osl in p["osl"] for c in p["concurrencies"]]
    out = []
    for k, (c, isl, osl) in enumerate(rungs):
        if k % n != i:
            continue
        load = _base(p, concurrency=c, warmup_s=p["warmup_s"], duration_s=p["duration_s"])
        out.append(Stage(f"c={c} isl={isl} osl={osl}", load, osl, isl=isl,
                         labels={"concurrency": c, "isl": isl, "osl": osl}))
    return out


def _rung_key(stage: Stage) -> str:
    lab = stage.labels
    return f"c{lab['concurrency']}_isl{lab['isl']}_osl{lab['osl']}"


def _sweep_summary(p: dict[str, Any], runs: list[tuple[Stage, list[RequestResult], dict[str, Any]]]) -> dict[str, Any]:
    headline: dict[str, Any] = {}
    for stage, _, agg in runs:
        headline.update(_flat(_rung_key(stage) + ".", agg))
    return {"headline": headline}


# --- ttft-prefix --------------------------------------------------------------------------------
def _prefix_stages(p: dict[str, Any]) -> list[Stage]:
    load = _base(p, concurrency=1, requests=2 * p["repeats"])
    return [Stage("cold/warm", load, p["osl"], isl=p["isl"], prefix="pairs", labels={"isl": p["isl"]})]


def _prefix_summary(p: dict[str, Any], runs: list[tuple[Stage, list[RequestResult], dict[str, Any]]]) -> dict[str, Any]:
    _, results, agg = runs[0]
    ok = [r for r in results if r.phase == "measure" and r.ok and r.ttft_ms is not None]
    cold = [r.ttft_ms for r in ok if r.tag == "cold" and r.ttft_ms is not None]
    warm = [r.ttft_ms for r in ok if r.tag == "warm" and r.ttft_ms is not None]
    c50, w50 = percentile(cold, 50), percentile(warm, 50)
    return {"headline": {"ttft_cold_ms_p50": c50, "ttft_warm_ms_p50": w50,
                         "prefix_speedup": (c50 / w50) if c50 and w50 else None, "errors": agg["errors"]},
            "cold_ms": summarize(cold), "warm_ms": summarize(warm)}


# --- long-decode --------------------------------------------------------------------------------
def _long_stages(p: dict[str, Any]) -> list[Stage]:
    load = _base(p, concurrency=p["concurrency"], warmup_requests=0, requests=p["repeats"])
    return [Stage(f"long osl={p['osl']}", load, p["osl"], isl=p["isl"], keep_content=True,
                  labels={"concurrency": p["concurrency"], "isl": p["isl"], "osl": p["osl"]})]


def repetition(text: str, n: int = 4) -> float | None:
    """1 - distinct word n-grams / all n-grams: 0 for varied text, near 1 for a loop."""
    words = text.split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else None


def _long_summary(p: dict[str, Any], runs: list[tuple[Stage, list[RequestResult], dict[str, Any]]]) -> dict[str, Any]:
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


# --- tool-call ----------------------------------------------------------------------------------
def _tool_stages(p: dict[str, Any]) -> list[Stage]:
    load = _base(p, concurrency=p["concurrency"], warmup_requests=0, requests=p["repeats"])
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
        except ValueError:
            problems.append(f"call {i}: arguments are not valid JSON: {str(call.get('arguments'))[:60]!r}")
    if r.finish_reason != "tool_calls":
        problems.append(f"finish_reason {r.finish_reason!r}, expected 'tool_calls'")
    return problems


def _tool_summary(p: dict[str, Any], runs: list[tuple[Stage, list[RequestResult], dict[str, Any]]]) -> dict[str, Any]:
    _, results, agg = runs[0]
    measured = [r for r in results if r.phase == "measure"]
    names = {t["function"]["name"] for t in WEATHER_TOOL}
    bad = {r.index: tool_call_problems(r, names) for r in measured if r.ok}
    bad = {k: v for k, v in bad.items() if v}
    good = sum(1 for r in measured if r.ok) - len(bad)
    return {"headline": {"well_formed_frac": good / len(measured) if measured else None, "well_formed": good,
                         "requests": len(measured), "ttft_ms_p50": agg["ttft_ms"]["p50"], "errors": agg["errors"]},
            "malformed": {str(k): v for k, v in list(bad.items())[:20]}}


# --- rate ---------------------------------------------------------------------------------------
def _rate_stages(p: dict[str, Any]) -> list[Stage]:
    out = []
    for r in p["rates"]:
        load = _base(p, mode=p["arrival"], rate=r, concurrency=p["max_inflight"], warmup_s=p["warmup_s"],
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


def _rate_summary(p: dict[str, Any], runs: list[tuple[Stage, list[RequestResult], dict[str, Any]]]) -> dict[str, Any]:
    headline: dict[str, Any] = {}
    for stage, results, agg in runs:
        key = f"rate{stage.labels['rate']:g}."
        g = goodput(results, p["slo_ttft_ms"], p["slo_tpot_ms"], agg.get("window_s") or 0.0)
        agg.update(g)
        headline.update({key + k: v for k, v in g.items()})
        headline.update(_flat(key, agg, ("p50", "p95")))
    return {"headline": headline}


SUITES: dict[str, Suite] = {s.id: s for s in (
    Suite("decode", "single-request decode tok/s", f"One stream, short prompt ({FRANCE!r}), N repeats -> p50 "
          "decode tok/s: the recipes' headline number. Gated against the recipe's validated value.", (
              Param("prompt", "str", FRANCE, "the prompt, sent as is"),
              Param("max_tokens", "int", 128, "output tokens per request", 1, 128),
              Param("temperature", "float", 0.0, "sampling temperature", 0, 0.1),
              Param("repeats", "int", 10, "measured requests", 1),
              Param("warmup", "int", 2, "unmeasured requests first", 0),
              Param("tolerance", "float", 0.10, "recipe gate: p50 may be this fraction below the validated tok/s", 0, 1),
              Param("min_tok_s", "float", 0.0, "gate: p50 decode tok/s at least this (0: recipe gate only)", 0)),
          _decode_stages, _decode_summary),
    Suite("concurrency-sweep", "throughput and latency per concurrency", "Concurrencies x input/output lengths; per "
          "rung aggregate output tok/s, per-stream tok/s, TTFT p50/p95/p99, TPOT and ITL p50/p95, E2E, errors.", (
              Param("concurrencies", "ints", [1, 2, 4, 8, 16], "parallel streams per rung", 1, 4096),
              Param("isls", "ints", [128], "prompt lengths (tokens)", 1),
              Param("osl", "ints", [128], "output lengths (tokens)", 1),
              Param("duration_s", "float", 20.0, "measured window per rung", 0.1),
              Param("warmup_s", "float", 3.0, "load before each window opens", 0),
              Param("temperature", "float", 0.0, "sampling temperature", 0, 2),
              Param("shard", "str", "0/1", "run rung k when k % n == i (i/n), to split a sweep over nodes")),
          _sweep_stages, _sweep_summary),
    Suite("ttft-prefix", "prefix-cache TTFT, cold vs warm", "The same long prompt twice: cold, then warm (needs "
          "--enable-prefix-caching on the engine). Reports TTFT of each and the speed-up.", (
              Param("isl", "int", 2048, "prompt length (tokens)", 16),
              Param("osl", "int", 16, "output tokens", 1),
              Param("repeats", "int", 5, "cold/warm pairs", 1),
              Param("temperature", "float", 0.0, "sampling temperature", 0, 2),
              Param("min_speedup", "float", 0.0, "gate: cold/warm TTFT ratio at least this (0: none)", 0)),
          _prefix_stages, _prefix_summary),
    Suite("long-decode", "sustained long decodes", "600-token decodes: tok/s over the first and second half, TPOT, "
          "worst ITL (stalls), repetition of the text (coherence smoke test).", (
              Param("osl", "int", 600, "output tokens", 2),
              Param("isl", "int", 128, "prompt length (tokens)", 1),
              Param("repeats", "int", 3, "measured requests", 1),
              Param("concurrency", "int", 1, "parallel streams", 1),
              Param("temperature", "float", 0.0, "sampling temperature", 0, 2),
              Param("max_repetition", "float", 0.0, "gate: repetition of any output at most this (0: none)", 0, 1)),
          _long_stages, _long_summary),
    Suite("tool-call", "tool calls come back well-formed", "Requests with a get_weather tool; every response must "
          "carry tool_calls with an id, a known name and JSON-object arguments, and finish with 'tool_calls'.", (
              Param("prompt", "str", "What is the weather in Paris? Use get_weather.", "the prompt"),
              Param("tool_choice", "str", "required", "tool_choice to send", choices=("required", "auto")),
              Param("max_tokens", "int", 256, "output token cap", 1),
              Param("repeats", "int", 10, "measured requests", 1),
              Param("concurrency", "int", 1, "parallel streams", 1),
              Param("temperature", "float", 0.0, "sampling temperature", 0, 2),
              Param("min_well_formed", "float", 1.0, "gate: fraction of well-formed responses", 0, 1)),
          _tool_stages, _tool_summary),
    Suite("rate", "goodput under open-loop arrivals", "Open-loop arrivals (Poisson or constant) per rate; goodput = "
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
          _rate_stages, _rate_summary),
)}


def get_suite(name: str) -> Suite:
    if name in SUITES:
        return SUITES[name]
    guess = did_you_mean(name, SUITES)
    raise NotFound(f"no benchmark suite named {name!r}",
                   f"did you mean `{guess}`?" if guess else f"suites: {', '.join(SUITES)}")

