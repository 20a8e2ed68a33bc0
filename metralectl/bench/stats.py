"""Percentiles and summaries (pure). Linear interpolation, numpy's default, so numbers match pandas/numpy."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

QUANTILES = (50, 90, 95, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """q in [0, 100]; None for no data."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(values: Iterable[float], quantiles: Sequence[int] = QUANTILES, ndigits: int = 4) -> dict[str, Any]:
    """{n, mean, min, max, p50, p90, ...}; values None when there is no data (never 0, which would be a lie)."""
    data = sorted(v for v in values if v is not None and not math.isnan(v))
    out: dict[str, Any] = {"n": len(data)}
    if not data:
        out.update({"mean": None, "min": None, "max": None, **{f"p{q}": None for q in quantiles}})
        return out
    out["mean"] = round(sum(data) / len(data), ndigits)
    out["min"] = round(data[0], ndigits)
    out["max"] = round(data[-1], ndigits)
    for q in quantiles:
        value = percentile(data, q)
        out[f"p{q}"] = None if value is None else round(value, ndigits)
    return out


def rate(count: float, seconds: float) -> float | None:
    return count / seconds if seconds > 0 else None


def relative_delta(new: float | None, old: float | None) -> float | None:
    """(new - old) / |old|: +0.05 is 5 % higher."""
    if new is None or old is None or old == 0:
        return None
    return (new - old) / abs(old)


def largest_remainder(total: int, weights: Sequence[float]) -> list[int]:
    """Split an integer `total` over `weights` proportionally, exactly summing to total (Hamilton's method)."""
    if not weights:
        return []
    wsum = sum(weights)
    if wsum <= 0:
        weights = [1.0] * len(weights)
        wsum = float(len(weights))
    raw = [total * w / wsum for w in weights]
    base = [math.floor(r) for r in raw]
    short = total - sum(base)
    order = sorted(range(len(raw)), key=lambda i: (raw[i] - base[i], -i), reverse=True)
    for i in order[:short]:
        base[i] += 1
    return base
