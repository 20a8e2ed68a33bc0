"""The Serving view's charts as values: TopViews in, one series per chart out. Pure.

Several GPUs are folded into one line per chart the way an operator reads a box: utilisation is the
mean, power and memory the sum, temperature the hottest GPU (it is the one that parks the node).
On unified memory (GB10) memory is the host pool as `metralectl top` defines it — MemTotal minus
MemAvailable, with what GPU processes hold shown beside it — because NVML has no device memory there.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from metralectl.tui.chart_data import RefLine, Series

if TYPE_CHECKING:
    from metralectl.telemetry.view import TopView

GB = 1e9
KEEP = 600  # points per series (10 min at 1 Hz); a chart shows as many as it is wide


def _fmt(value: float | None, spec: str, unit: str) -> str:
    return "?" if value is None else f"{value:{spec}}{unit}"


def _sum(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


@dataclass
class TelemetryHistory:
    keep: int = KEEP
    series: dict[str, collections.deque[float | None]] = field(default_factory=dict)
    latest: TopView | None = None

    def _add(self, name: str, value: float | None) -> None:
        self.series.setdefault(name, collections.deque(maxlen=self.keep)).append(value)

    def gap(self) -> None:
        """One empty point in every series: the time the feed was closed (its tab hidden) shows as a break,
        not as the two sides joined."""
        for series in self.series.values():
            if series and series[-1] is not None:
                series.append(None)

    def add(self, view: TopView) -> None:
        self.latest = view
        gpus = view.gpus
        utils = [g.util_gpu_pct for g in gpus if g.util_gpu_pct is not None]
        temps = [g.temp_gpu_c for g in gpus if g.temp_gpu_c is not None]
        self._add("util", sum(utils) / len(utils) if utils else None)
        self._add("power", _sum([g.energy.watts if g.energy.watts is not None else g.power_w for g in gpus]))
        self._add("temp", float(max(temps)) if temps else None)
        self._add("memory", self._memory_used(view))
        engines = view.engines
        self._add("tok_s", _sum([e.tokens_per_s for e in engines]))
        self._add("active", _sum([e.snapshot.requests_active if e.snapshot else None for e in engines]))
        ttft = [e.ttft_p50_s for e in engines if e.ttft_p50_s is not None]
        self._add("ttft", ttft[0] * 1000 if ttft else None)

    @staticmethod
    def _memory_used(view: TopView) -> float | None:
        if not view.gpus:
            return None
        m = view.gpus[0].memory
        if m.kind == "unified":  # one shared pool: counting it per GPU would multiply it
            return m.used_bytes / GB if m.used_bytes is not None else None
        return _sum([g.memory.used_bytes / GB if g.memory.used_bytes is not None else None for g in view.gpus])

    def values(self, name: str) -> tuple[float | None, ...]:
        return tuple(self.series.get(name, ()))

    def last(self, name: str) -> float | None:
        s = self.series.get(name)
        return s[-1] if s else None

    # -- one Series per chart -------------------------------------------------------------------
    def chart(self, name: str) -> Series:
        return getattr(self, f"_chart_{name}")()  # type: ignore[no-any-return]

    def _many(self) -> str:
        n = len(self.latest.gpus) if self.latest else 0
        return f"{n} GPUs" if n > 1 else ""

    def _chart_util(self) -> Series:
        return Series(self.values("util"), _fmt(self.last("util"), ".0f", " %"), y_max=100.0,
                      note=f"{self._many()} mean".strip() if self._many() else "")

    def _chart_power(self) -> Series:
        view = self.latest
        limit = _sum([g.power_limit_w for g in view.gpus]) if view and view.gpus else None
        lines = (RefLine(limit, f"limit {limit:.0f} W", "muted"),) if limit else ()
        method = view.gpus[0].energy.method if view and view.gpus else None
        note = f"energy rate ({method})" if method else ""
        if view and view.gpus and view.gpus[0].energy_scope == "gpu-only":
            note += " GPU only"
        return Series(self.values("power"), _fmt(self.last("power"), ".0f", " W"), lines, note=note.strip())

    def _chart_temp(self) -> Series:
        view = self.latest
        lines: tuple[RefLine, ...] = ()
        note = ""
        if view and view.gpus and view.gpus[0].lines is not None:
            ln = view.gpus[0].lines
            lines = (RefLine(ln.park_c, f"park {ln.park_c:g}", "error"), RefLine(ln.resume_c, f"resume {ln.resume_c:g}",
                                                                                 "warn"))
        if view and view.gpus:
            note = {"parked": "PARKED", "ok": "", "unknown": ""}.get(view.thermal, "")
        return Series(self.values("temp"), _fmt(self.last("temp"), ".0f", " °C"), lines, y_max=100.0, note=note)

    def _chart_memory(self) -> Series:
        view = self.latest
        if not view or not view.gpus:
            return Series(self.values("memory"), "?")
        m = view.gpus[0].memory
        unified = m.kind == "unified"
        total = (m.total_bytes / GB if m.total_bytes else None) if unified else _sum(
            [g.memory.total_bytes / GB if g.memory.total_bytes else None for g in view.gpus])
        used = self.last("memory")
        current = f"{_fmt(used, '.1f', '')}/{_fmt(total, '.0f', ' GB')}"
        if unified:
            resident = m.gpu_resident_bytes
            note = "unified pool" + (f", GPU-held {resident / GB:.1f} GB" if resident is not None else "")
        else:
            note = "device memory"
        lines = (RefLine(total, "total", "muted"),) if total else ()
        return Series(self.values("memory"), current, lines, y_max=total, note=note)

    def _chart_tok_s(self) -> Series:
        return Series(self.values("tok_s"), _fmt(self.last("tok_s"), ".0f", " tok/s"))

    def _chart_active(self) -> Series:
        return Series(self.values("active"), _fmt(self.last("active"), ".0f", ""))

    def _chart_ttft(self) -> Series:
        return Series(self.values("ttft"), _fmt(self.last("ttft"), ".0f", " ms"), note="p50")


CHARTS: tuple[tuple[str, str], ...] = (
    ("util", "GPU util"), ("power", "Power"), ("temp", "Temp"), ("memory", "Memory"),
    ("tok_s", "Tokens/s"), ("active", "Active requests"), ("ttft", "TTFT"),
)
