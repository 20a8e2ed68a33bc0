"""The engine's Prometheus /metrics text → a snapshot; two snapshots → rates. Pure: no HTTP here
(the endpoint seam fetches the text).

Parsed with prometheus_client's own parser (imported when first used). Series are looked up by sample
name, so the text parses the same with or without `# TYPE` lines. Metric names: SPEC.md §2.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from metralectl.core.engine_profile import MetricsMap
from metralectl.errors import MetralError

Labels = tuple[tuple[str, str], ...]

# metrale_spec_decode_verify_total{k, outcome}: the engine's outcome words are not documented; these
# cover the usual spellings. Other outcomes are kept in `spec_verify` but count toward neither side.
ACCEPTED = frozenset({"accepted", "accept", "hit", "success", "ok", "true", "match"})
REJECTED = frozenset({"rejected", "reject", "miss", "failure", "fail", "false", "mismatch"})


@dataclass(frozen=True)
class Histogram:
    """A cumulative histogram summed over its label sets: ((le, cumulative count), …), +Inf last."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float

    def quantile(self, q: float) -> float | None:
        return histogram_quantile(q, self.buckets)

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def minus(self, older: Histogram) -> Histogram | None:
        """The observations made between two snapshots; None after a counter reset."""
        if self.count < older.count:
            return None
        before = dict(older.buckets)
        buckets = tuple((le, c - before.get(le, 0.0)) for le, c in self.buckets)
        if any(c < 0 for _, c in buckets):
            return None
        return Histogram(buckets, self.count - older.count, self.sum - older.sum)


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """Prometheus's histogram_quantile: linear interpolation inside the bucket holding rank q·count;
    the first bucket interpolates from 0; a rank in +Inf answers the highest finite bound."""
    ordered = sorted(buckets)
    if not ordered or not math.isinf(ordered[-1][0]):
        return None
    total = ordered[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in ordered:
        if count >= rank:
            if math.isinf(le):
                return prev_le if len(ordered) > 1 else None
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return None


# What a scrape is read by when it carries no series of any engine metralectl knows: nothing is mapped and the
# engine is said to be unknown (never another engine's name: vLLM's `vllm:*` text is not Metrale's).
UNKNOWN_ENGINE = MetricsMap(series={}, engine="unknown")


def unknown_engine_note(text: str) -> str:
    """What `top` says of a scrape no engine's mapping reads: a few of the series it does carry (bounded; the
    renderer escapes them), so the operator sees which engine it is."""
    seen: list[str] = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0][:48]
            if name and name not in seen:
                seen.append(name)
        if len(seen) >= 3:
            break
    shown = ", ".join(seen) if seen else "none"
    return f"unknown engine: no series metralectl maps in its /metrics (it has {shown}); nothing is read from them"


def mapping_for(names: Iterable[str], candidates: Iterable[MetricsMap]) -> MetricsMap | None:
    """The engine mapping whose series the text carries most of (None: no candidate matches a single one)."""
    present = set(names)
    best: tuple[int, MetricsMap] | None = None
    for mapping in candidates:
        hits = sum(1 for name in mapping.all_series if name in present or f"{name}_bucket" in present)
        if hits and (best is None or hits > best[0]):
            best = (hits, mapping)
    return best[1] if best else None


@dataclass(frozen=True)
class EngineSnapshot:
    t: float | None  # when the text was fetched (caller's monotonic clock), for rates
    requests_active: float | None
    requests_total: float | None
    prompt_tokens_total: float | None
    generation_tokens_total: float | None
    decoded_tokens_total: float | None
    ttft: Histogram | None
    prefix_cache_hits_total: float | None
    prefix_cache_misses_total: float | None
    prefix_cache_hit_rate_gauge: float | None
    spec_verify: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (k, outcome) → count
    tool_calls_total: float | None = None
    requests_waiting: float | None = None
    stream_tokens_per_s: float | None = None  # the engine's average decode rate of one request (llama.cpp), not throughput
    kv_cache_usage: float | None = None  # fraction 0..1
    spec_draft_tokens_total: float | None = None
    spec_accepted_tokens_total: float | None = None
    engine: str = ""  # whose series these are (the mapping's engine), "" when unknown
    itl: Histogram | None = None  # inter-token latency (vLLM's vllm:inter_token_latency_seconds)
    prefix_cache_queries_total: float | None = None  # tokens looked up (vLLM counts queries and hits, not misses)

    @property
    def ttft_p50_s(self) -> float | None:
        return self.ttft.quantile(0.5) if self.ttft else None

    @property
    def ttft_p95_s(self) -> float | None:
        return self.ttft.quantile(0.95) if self.ttft else None

    @property
    def itl_p50_s(self) -> float | None:
        return self.itl.quantile(0.5) if self.itl else None

    @property
    def itl_p95_s(self) -> float | None:
        return self.itl.quantile(0.95) if self.itl else None

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """From the counters when they are there (exact: hits and misses, or hits of queries), else the engine's
        own gauge."""
        rate = _ratio(self.prefix_cache_hits_total, self.prefix_cache_misses_total)
        if rate is None:
            rate = _share(self.prefix_cache_hits_total, self.prefix_cache_queries_total)
        return rate if rate is not None else self.prefix_cache_hit_rate_gauge

    @property
    def spec_acceptance(self) -> float | None:
        rate = spec_acceptance(self.spec_verify)
        if rate is None and self.spec_draft_tokens_total:
            return (self.spec_accepted_tokens_total or 0.0) / self.spec_draft_tokens_total
        return rate

    def spec_acceptance_by_k(self) -> dict[str, float]:
        return spec_acceptance_by_k(self.spec_verify)

    def to_json(self) -> dict[str, Any]:
        return {
            "requests_active": self.requests_active, "requests_total": self.requests_total,
            "prompt_tokens_total": self.prompt_tokens_total, "generation_tokens_total": self.generation_tokens_total,
            "decoded_tokens_total": self.decoded_tokens_total, "ttft_p50_s": self.ttft_p50_s,
            "ttft_p95_s": self.ttft_p95_s, "itl_p50_s": self.itl_p50_s, "itl_p95_s": self.itl_p95_s,
            "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
            "spec_acceptance": self.spec_acceptance, "spec_acceptance_by_k": self.spec_acceptance_by_k(),
            "tool_calls_total": self.tool_calls_total, "requests_waiting": self.requests_waiting,
            "stream_tokens_per_s": self.stream_tokens_per_s,
            "kv_cache_usage": self.kv_cache_usage, "engine": self.engine or None,
        }


def spec_acceptance(counts: Mapping[tuple[str, str], float]) -> float | None:
    accepted = sum(v for (_, o), v in counts.items() if o.lower() in ACCEPTED)
    rejected = sum(v for (_, o), v in counts.items() if o.lower() in REJECTED)
    return _ratio(accepted, rejected) if accepted + rejected > 0 else None


def spec_acceptance_by_k(counts: Mapping[tuple[str, str], float]) -> dict[str, float]:
    ks = sorted({k for k, _ in counts}, key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else 0, k))
    out = {}
    for k in ks:
        rate = spec_acceptance({key: v for key, v in counts.items() if key[0] == k})
        if rate is not None:
            out[k] = rate
    return out


def catalog_maps() -> tuple[MetricsMap, ...]:
    """The metrics mapping of every engine the catalog knows (a scrape is read by the one it matches); none when
    the catalog cannot be read: the scrape is then an unknown engine's, never a guess at one."""
    from metralectl.core.catalog import load_catalog

    try:
        return tuple(contract.metrics for contract in load_catalog().engines.values())
    except MetralError:
        return ()


def parse_metrics(text: str, *, t: float | None = None, mapping: MetricsMap | None = None,
                  candidates: Iterable[MetricsMap] = ()) -> EngineSnapshot:
    """Parse Prometheus exposition text into the canonical metrics, read through the engine's mapping (given,
    else the candidate whose series the text carries, the candidates being every catalog engine's when none are
    given, else none: the engine is "unknown"). Missing series are None (an older engine, a feature off)."""
    from prometheus_client.parser import text_string_to_metric_families

    series: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                series[s.name].append((dict(s.labels), float(s.value)))
    except (ValueError, TypeError, IndexError) as exc:
        raise MetralError(f"the engine's /metrics is not Prometheus text: {exc}",
                          "is the URL the engine's port? `curl http://HOST:PORT/metrics` shows what came back") from exc

    chosen = mapping or mapping_for(series, tuple(candidates) or catalog_maps()) or UNKNOWN_ENGINE

    def present(canonical: str, suffix: str = "") -> str | None:
        return next((n for n in chosen.names(canonical) if f"{n}{suffix}" in series), None)

    def total(canonical: str) -> float | None:
        name = present(canonical)
        values = series.get(name) if name else None
        return sum(v for _, v in values) if values else None

    spec: dict[tuple[str, str], float] = defaultdict(float)
    for labels, value in series.get(present("spec-verify-total") or "", ()):
        spec[(labels.get("k", ""), labels.get("outcome", ""))] += value
    ttft, itl = present("ttft-seconds", "_bucket"), present("itl-seconds", "_bucket")
    return EngineSnapshot(
        t=t,
        requests_active=total("requests-active"),
        requests_total=total("requests-total"),
        prompt_tokens_total=total("prompt-tokens-total"),
        generation_tokens_total=total("generation-tokens-total"),
        decoded_tokens_total=total("decoded-tokens-total"),
        ttft=_histogram(series, ttft) if ttft else None,
        prefix_cache_hits_total=total("prefix-cache-hits-total"),
        prefix_cache_misses_total=total("prefix-cache-misses-total"),
        prefix_cache_hit_rate_gauge=total("prefix-cache-hit-rate"),
        spec_verify=dict(spec),
        tool_calls_total=total("tool-calls-total"),
        requests_waiting=total("requests-waiting"),
        stream_tokens_per_s=total("stream-tokens-per-s"),
        kv_cache_usage=total("kv-cache-usage"),
        spec_draft_tokens_total=total("spec-draft-tokens-total"),
        spec_accepted_tokens_total=total("spec-accepted-tokens-total"),
        engine=chosen.engine,
        itl=_histogram(series, itl) if itl else None,
        prefix_cache_queries_total=total("prefix-cache-queries-total"),
    )


def _histogram(series: Mapping[str, list[tuple[dict[str, str], float]]], name: str) -> Histogram | None:
    rows = series.get(f"{name}_bucket")
    if not rows:
        return None
    by_le: dict[float, float] = defaultdict(float)
    for labels, value in rows:  # summed over label sets (one per model; one model per process)
        by_le[float(labels.get("le", "+Inf"))] += value
    count = sum(v for _, v in series.get(f"{name}_count", ())) or by_le.get(math.inf, 0.0)
    return Histogram(tuple(sorted(by_le.items())), count, sum(v for _, v in series.get(f"{name}_sum", ())))


@dataclass(frozen=True)
class EngineRates:
    """What happened between two snapshots. A counter that went backwards (engine restart, hot swap
    that resets metrics) makes its rate None rather than negative."""

    dt_s: float
    requests_per_s: float | None
    prompt_tokens_per_s: float | None
    generation_tokens_per_s: float | None
    decoded_tokens_per_s: float | None
    tool_calls_per_s: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    prefix_cache_hit_rate: float | None
    spec_acceptance: float | None
    reset: bool
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None


def engine_rates(old: EngineSnapshot, new: EngineSnapshot, dt_s: float | None = None) -> EngineRates:
    """Rates over the interval; dt from the snapshots' `t` unless given."""
    if dt_s is None:
        if old.t is None or new.t is None:
            raise MetralError("engine_rates needs the snapshots' fetch times (parse_metrics(..., t=)) or dt_s")
        dt_s = new.t - old.t
    if dt_s <= 0:
        raise MetralError(f"engine_rates needs a positive interval, not {dt_s:g} s")
    reset = False

    def rate(a: float | None, b: float | None) -> float | None:
        nonlocal reset
        if a is None or b is None:
            return None
        if b < a:
            reset = True
            return None
        return (b - a) / dt_s

    ttft = new.ttft.minus(old.ttft) if new.ttft and old.ttft else None
    if new.ttft and old.ttft and ttft is None:
        reset = True
    itl = new.itl.minus(old.itl) if new.itl and old.itl else None
    if new.itl and old.itl and itl is None:
        reset = True
    hits = _delta(old.prefix_cache_hits_total, new.prefix_cache_hits_total)
    misses = _delta(old.prefix_cache_misses_total, new.prefix_cache_misses_total)
    queries = _delta(old.prefix_cache_queries_total, new.prefix_cache_queries_total)
    hit_rate = _ratio(hits, misses) if hits is not None and misses is not None and hits + misses > 0 else None
    if hit_rate is None:
        hit_rate = _share(hits, queries)
    spec_delta = {k: v - old.spec_verify.get(k, 0.0) for k, v in new.spec_verify.items()}
    if any(v < 0 for v in spec_delta.values()):
        reset, spec_delta = True, {}
    acceptance = spec_acceptance(spec_delta)
    drafted = _delta(old.spec_draft_tokens_total, new.spec_draft_tokens_total)
    accepted = _delta(old.spec_accepted_tokens_total, new.spec_accepted_tokens_total)
    if acceptance is None and drafted and accepted is not None:
        acceptance = accepted / drafted  # engines that count drafted and accepted tokens (llama.cpp)
    return EngineRates(
        dt_s=dt_s,
        requests_per_s=rate(old.requests_total, new.requests_total),
        prompt_tokens_per_s=rate(old.prompt_tokens_total, new.prompt_tokens_total),
        generation_tokens_per_s=rate(old.generation_tokens_total, new.generation_tokens_total),
        decoded_tokens_per_s=rate(old.decoded_tokens_total, new.decoded_tokens_total),
        tool_calls_per_s=rate(old.tool_calls_total, new.tool_calls_total),
        ttft_p50_s=ttft.quantile(0.5) if ttft else None,
        ttft_p95_s=ttft.quantile(0.95) if ttft else None,
        prefix_cache_hit_rate=hit_rate,
        spec_acceptance=acceptance,
        reset=reset,
        itl_p50_s=itl.quantile(0.5) if itl else None,
        itl_p95_s=itl.quantile(0.95) if itl else None,
    )


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b < a else b - a


def _share(hits: float | None, queries: float | None) -> float | None:
    """hits of queries (vLLM's prefix cache counts both), None without a query or with more hits than queries."""
    if hits is None or queries is None or queries <= 0 or hits > queries:
        return None
    return hits / queries


def _ratio(hits: float | None, misses: float | None) -> float | None:
    if hits is None or misses is None or hits + misses <= 0:
        return None
    return hits / (hits + misses)
