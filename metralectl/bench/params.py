"""Suite parameter schemas and `--param k=v` parsing (pure). An unknown key lists the valid ones."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from metralectl.errors import UsageError

# What a suite parameter holds once parsed: bool, int, float, a choice or free text, or a list of numbers.
ParamValue = bool | int | float | str | list[int] | list[float]  # a list's choices: the word itself


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "int" | "float" | "str" | "bool" | "ints" | "floats"
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()

    def describe_type(self) -> str:
        kind = {"ints": "int,int,...", "floats": "float,float,..."}.get(self.kind, self.kind)
        if self.choices and self.kind in ("ints", "floats"):
            kind = "|".join((kind, *self.choices))
        elif self.choices:
            kind = "|".join(self.choices)
        bounds = ""
        if self.minimum is not None or self.maximum is not None:
            lo = "" if self.minimum is None else f"{self.minimum:g}"
            hi = "" if self.maximum is None else f"{self.maximum:g}"
            bounds = f" [{lo}..{hi}]"
        return kind + bounds

    def parse(self, text: str, suite: str) -> ParamValue:
        def bad(why: str) -> UsageError:
            return UsageError(f"--param {self.name}={text}: {why} (suite {suite})",
                              f"{self.name}: {self.describe_type()} — {self.help}")

        text = text.strip()
        if self.kind == "bool":
            low = text.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise bad("expected true or false")
        if self.kind in ("ints", "floats"):
            if text in self.choices:  # a word the list also takes (rates=auto)
                return text
            parts = [p for p in text.split(",") if p.strip()]
            if not parts:
                raise bad("expected one or more comma-separated numbers")
            conv = int if self.kind == "ints" else float
            try:
                values = [conv(p) for p in parts]
            except ValueError:
                raise bad(f"expected {'integers' if conv is int else 'numbers'}") from None
            for v in values:
                self._check_range(v, bad)
            return values
        if self.kind in ("int", "float"):
            try:
                value: Any = int(text) if self.kind == "int" else float(text)
            except ValueError:
                raise bad(f"expected {'an integer' if self.kind == 'int' else 'a number'}") from None
            self._check_range(value, bad)
            return value
        if self.choices and text not in self.choices:
            raise bad(f"expected one of {', '.join(self.choices)}")
        return text

    def _check_range(self, value: float, bad: Any) -> None:
        if self.minimum is not None and value < self.minimum:
            raise bad(f"{value:g} is below the minimum {self.minimum:g}")
        if self.maximum is not None and value > self.maximum:
            raise bad(f"{value:g} is above the maximum {self.maximum:g}")


def parse_params(suite: str, schema: Sequence[Param], pairs: Iterable[str]) -> dict[str, Any]:
    """Every parameter of the schema (defaults filled in), overridden by `k=v` pairs."""
    by_name = {p.name: p for p in schema}
    values = {p.name: p.default for p in schema}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--param {pair!r}: expected KEY=VALUE",
                             f"valid keys for {suite}: {', '.join(sorted(by_name))}")
        if key not in by_name:
            raise UsageError(f"unknown parameter {key!r} for suite {suite}; valid: {', '.join(sorted(by_name))}",
                             f"`metralectl bench list {suite}` describes them")
        values[key] = by_name[key].parse(text, suite)
    return values


def parse_shard(text: str) -> tuple[int, int]:
    """`shard=i/n` (0-based i): this node runs every n-th rung starting at i."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UsageError(f"shard={text}: expected i/n, e.g. 0/2") from None
    if n < 1 or not 0 <= i < n:
        raise UsageError(f"shard={text}: need 0 <= i < n")
    return i, n
