"""What every suite is made of: the common parameters, a stage (one load shape), a suite (pure)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from metralectl.bench.loadgen import LoadSpec
from metralectl.bench.params import Param
from metralectl.bench.results import RequestResult
from metralectl.bench.transport import TRANSPORTS

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
    depth: int | None = None  # context tokens ahead of the prompt (the depth suite): sized with /tokenize too
    trace: tuple[tuple[int, int, str | None], ...] = ()  # a replay: (input, output tokens, session) per request
    turns: tuple[tuple[str, str], ...] = ()  # conversations: (JSON of the messages so far, the next user text) each
    labels: dict[str, Any] = field(default_factory=dict)


# What a suite's summary is computed from: each measured stage, its results and their aggregate.
Measured = list[tuple[Stage, list[RequestResult], dict[str, Any]]]


@dataclass(frozen=True)
class Suite:
    id: str
    title: str
    description: str
    params: tuple[Param, ...]
    stages: Callable[[dict[str, Any]], list[Stage]]
    summarize: Callable[[dict[str, Any], list[tuple[Stage, list[RequestResult], dict[str, Any]]]], dict[str, Any]]
    # Stages decided by what was measured (a sweep to saturation): given the stages measured so far, the next
    # ones to run ([] to stop). None: `stages` is the whole plan.
    more: Callable[[dict[str, Any], list[tuple[Stage, list[RequestResult], dict[str, Any]]]], list[Stage]] | None = None

    @property
    def schema(self) -> tuple[Param, ...]:
        return self.params + COMMON


def base_load(p: dict[str, Any], **kw: Any) -> LoadSpec:
    return LoadSpec(timeout_s=p["timeout_s"], seed=p["seed"], transport=p["transport"],
                    drain_timeout_s=p["drain_timeout_s"], tokenizer=p["tokenizer"], **kw)


def flat(prefix: str, agg: dict[str, Any], keys: tuple[str, ...] = ("p50", "p95", "p99")) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric in ("ttft_ms", "ttft_content_ms", "tpot_ms", "itl_ms", "e2e_ms", "stream_tok_s"):
        for k in keys:
            out[f"{prefix}{metric}_{k}"] = (agg.get(metric) or {}).get(k)
    for metric in ("output_tok_s", "requests_per_s", "errors", "requests"):
        out[f"{prefix}{metric}"] = agg.get(metric)
    return out
