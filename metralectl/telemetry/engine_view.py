"""What `metralectl top` shows of one engine, as values: the /metrics snapshots the poller kept for the
trailing window -> its row (state, rates over the window, lifetime figures) and the row's JSON. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from metralectl.telemetry.engine_metrics import EngineRates, EngineSnapshot, engine_rates

EngineSource = Literal["container", "url"]
EngineState = Literal["ok", "unreachable", "bad-metrics", "unknown-engine"]


@dataclass(frozen=True)
class EngineTarget:
    url: str
    name: str | None = None  # the container's name
    recipe: str | None = None
    source: EngineSource = "url"
    engine: str | None = None  # the engine file's name (its container's label)
    # its container's labels: whether it asks metralectl's engine token (lifecycle/engine_token.engine_headers)
    labels: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def port(self) -> int | None:
        from urllib.parse import urlsplit

        try:
            return urlsplit(self.url).port
        except ValueError:
            return None


@dataclass(frozen=True)
class EngineObservation:
    """What the poller holds for one engine: the snapshots of the trailing window (oldest first) and the
    last scrape's error, if the last scrape failed."""

    target: EngineTarget
    snapshots: tuple[EngineSnapshot, ...] = ()
    error: str | None = None
    state: EngineState = "ok"
    model: str | None = None  # the id the engine's /v1/models lists first (asked once per engine)


@dataclass(frozen=True)
class EngineRow:
    target: EngineTarget
    state: EngineState
    error: str | None
    snapshot: EngineSnapshot | None  # the newest
    rates: EngineRates | None  # over the window; None until two snapshots are there
    model: str | None = None

    @property
    def engine(self) -> str | None:
        return self.target.engine or (self.snapshot.engine if self.snapshot and self.snapshot.engine else None)

    @property
    def tokens_per_s(self) -> float | None:
        return self.rates.generation_tokens_per_s if self.rates else None

    @property
    def ttft_p50_s(self) -> float | None:
        """Over the window when requests started in it, else since the engine started."""
        if self.rates and self.rates.ttft_p50_s is not None:
            return self.rates.ttft_p50_s
        return self.snapshot.ttft_p50_s if self.snapshot else None

    @property
    def ttft_p95_s(self) -> float | None:
        if self.rates and self.rates.ttft_p95_s is not None:
            return self.rates.ttft_p95_s
        return self.snapshot.ttft_p95_s if self.snapshot else None

    @property
    def ttft_scope(self) -> str | None:
        if self.rates and self.rates.ttft_p50_s is not None:
            return "window"
        return "lifetime" if self.snapshot and self.snapshot.ttft_p50_s is not None else None

    @property
    def itl_p50_s(self) -> float | None:
        """Inter-token latency over the window when tokens were streamed in it, else since the engine started."""
        if self.rates and self.rates.itl_p50_s is not None:
            return self.rates.itl_p50_s
        return self.snapshot.itl_p50_s if self.snapshot else None

    @property
    def itl_p95_s(self) -> float | None:
        if self.rates and self.rates.itl_p95_s is not None:
            return self.rates.itl_p95_s
        return self.snapshot.itl_p95_s if self.snapshot else None

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        if self.rates and self.rates.prefix_cache_hit_rate is not None:
            return self.rates.prefix_cache_hit_rate
        return self.snapshot.prefix_cache_hit_rate if self.snapshot else None

    @property
    def spec_acceptance(self) -> float | None:
        if self.rates and self.rates.spec_acceptance is not None:
            return self.rates.spec_acceptance
        return self.snapshot.spec_acceptance if self.snapshot else None

    def to_json(self) -> dict[str, Any]:
        s, r = self.snapshot, self.rates
        return {
            "url": self.target.url, "name": self.target.name, "recipe": self.target.recipe,
            "source": self.target.source, "port": self.target.port, "model": self.model,
            "state": self.state, "error": self.error,
            "engine": self.engine,
            "requests_active": _count(s.requests_active) if s else None,
            "requests_waiting": _count(s.requests_waiting) if s else None,
            "engine_stream_tokens_per_s": s.stream_tokens_per_s if s else None,  # one request's decode rate, not the server's
            "tokens_per_s": self.tokens_per_s, "ttft_p50_s": self.ttft_p50_s, "ttft_p95_s": self.ttft_p95_s,
            "ttft_scope": self.ttft_scope, "itl_p50_s": self.itl_p50_s, "itl_p95_s": self.itl_p95_s,
            "kv_cache_usage": s.kv_cache_usage if s else None,
            "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
            "spec_acceptance": self.spec_acceptance,
            "totals": None if s is None else {
                "requests": _count(s.requests_total), "prompt_tokens": _count(s.prompt_tokens_total),
                "generation_tokens": _count(s.generation_tokens_total),
                "decoded_tokens": _count(s.decoded_tokens_total),
                "tool_calls": _count(s.tool_calls_total)},
            "lifetime": None if s is None else {
                "ttft_p50_s": s.ttft_p50_s, "ttft_p95_s": s.ttft_p95_s,
                "ttft_count": _count(s.ttft.count) if s.ttft else None,
                "itl_p50_s": s.itl_p50_s, "itl_p95_s": s.itl_p95_s,
                "prefix_cache_hit_rate": s.prefix_cache_hit_rate, "spec_acceptance": s.spec_acceptance,
                "spec_acceptance_by_k": s.spec_acceptance_by_k()},
            "window": None if r is None else {
                "span_s": r.dt_s, "requests_per_s": r.requests_per_s,
                "prompt_tokens_per_s": r.prompt_tokens_per_s,
                "generation_tokens_per_s": r.generation_tokens_per_s,
                "decoded_tokens_per_s": r.decoded_tokens_per_s, "tool_calls_per_s": r.tool_calls_per_s,
                "ttft_p50_s": r.ttft_p50_s, "ttft_p95_s": r.ttft_p95_s,
                "itl_p50_s": r.itl_p50_s, "itl_p95_s": r.itl_p95_s,
                "prefix_cache_hit_rate": r.prefix_cache_hit_rate, "spec_acceptance": r.spec_acceptance,
                "counter_reset": r.reset},
        }


def _count(value: float | None) -> float | int | None:
    """Prometheus values are floats; counts that are whole print as integers in JSON."""
    return int(value) if value is not None and math.isfinite(value) and value.is_integer() else value


def engine_row(obs: EngineObservation) -> EngineRow:
    """Rates between the newest snapshot and the oldest one since the last counter reset."""
    snaps = [s for s in obs.snapshots if s.t is not None]
    newest = obs.snapshots[-1] if obs.snapshots else None
    rates = None
    if len(snaps) >= 2:
        for old in snaps[:-1]:  # oldest first; an engine restart in the window makes the older ones useless
            if snaps[-1].t - old.t <= 0:  # type: ignore[operator]
                continue
            candidate = engine_rates(old, snaps[-1])
            if not candidate.reset:
                rates = candidate
                break
            rates = candidate  # keep the reset flag visible if nothing newer works
    return EngineRow(obs.target, obs.state, obs.error, newest, rates, obs.model)
