"""What a chart draws, as values (no Textual here): a series, its headline, reference lines. Pure."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RefLine:
    value: float
    label: str
    kind: str = "warn"  # warn | error | muted: which component class colours it


@dataclass(frozen=True)
class Series:
    values: tuple[float | None, ...]
    current: str
    lines: tuple[RefLine, ...] = ()
    y_max: float | None = None
    note: str = ""
