"""Energy over a window, and what it cost per token. Pure apart from the small accumulator the
sampler thread feeds while a window is open.

Method, best first:
  counter          Σ GPUs of the NVML total-energy counter delta between the window's edges
  instant-integral trapezoid of *instant* power; trustworthy at ≥ 20 Hz
  average-integral trapezoid of the ~1 s averaged power: lags load changes (−14 % / +7 % seen on an
                   H200 around ramps), so only a flagged last resort
A counter that goes backwards inside a window (driver reload, GPU reset) invalidates the window.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from metralectl.core.gpudata import EnergyReading, PowerReading

Method = Literal["counter", "instant-integral", "average-integral"]
Scope = Literal["gpu", "gpu-only"]
METHOD_ORDER: tuple[Method, ...] = ("counter", "instant-integral", "average-integral")
MIN_WINDOW_S = 10.0  # the counter updates every ~100 ms; shorter windows carry a visible edge error
MIN_INSTANT_HZ = 20.0


def trapezoid(points: Iterable[tuple[float, float | None]]) -> float | None:
    """∫P dt over (t, watts) points in time order; None readings are skipped (bridged), not zeroed."""
    acc = Trapezoid()
    for t, w in points:
        acc.add(t, w)
    return acc.joules


def counter_delta_j(start_mj: int | None, end_mj: int | None) -> float | None:
    """Joules between two counter readings; None when unknown *or* when the counter went backwards."""
    if start_mj is None or end_mj is None or end_mj < start_mj:
        return None
    return (end_mj - start_mj) / 1000.0


class Trapezoid:
    """Running trapezoid integral; also remembers how densely it was fed."""

    __slots__ = ("first_t", "joules_acc", "last_t", "last_w", "max_gap_s", "points")

    def __init__(self) -> None:
        self.first_t: float | None = None
        self.last_t: float | None = None
        self.last_w: float | None = None
        self.joules_acc = 0.0
        self.points = 0
        self.max_gap_s = 0.0

    def add(self, t: float, watts: float | None) -> None:
        if watts is None:
            return
        if self.last_t is not None and self.last_w is not None:
            dt = t - self.last_t
            if dt < 0:
                return  # out-of-order reading: ignore rather than subtract
            self.joules_acc += 0.5 * (watts + self.last_w) * dt
            self.max_gap_s = max(self.max_gap_s, dt)
        else:
            self.first_t = t
        self.last_t, self.last_w = t, watts
        self.points += 1

    @property
    def joules(self) -> float | None:
        return self.joules_acc if self.points >= 2 else None

    @property
    def span_s(self) -> float:
        if self.first_t is None or self.last_t is None:
            return 0.0
        return self.last_t - self.first_t

    @property
    def rate_hz(self) -> float | None:
        return (self.points - 1) / self.span_s if self.points >= 2 and self.span_s > 0 else None


@dataclass(frozen=True)
class GpuWindow:
    """What the sampler saw of one GPU over one window."""

    uuid: str
    counter_start_mj: int | None
    counter_end_mj: int | None
    counter_span_s: float | None
    counter_reset: bool
    instant_j: float | None
    instant_points: int
    instant_rate_hz: float | None
    instant_max_gap_s: float
    average_j: float | None
    average_points: int

    @property
    def counter_j(self) -> float | None:
        return None if self.counter_reset else counter_delta_j(self.counter_start_mj, self.counter_end_mj)


@dataclass(frozen=True)
class WindowData:
    t_start: float
    t_end: float
    gpus: tuple[GpuWindow, ...]
    scope: Scope  # "gpu-only" on unified-memory machines: the board draws more than the GPU reports

    @property
    def duration_s(self) -> float:
        return self.t_end - self.t_start


class WindowAccumulator:
    """Fed by the sampler thread while a window is open: O(1) memory however long the window."""

    def __init__(self, t_start: float, counters: Iterable[EnergyReading], powers: Iterable[PowerReading],
                 *, scope: Scope = "gpu") -> None:
        self.t_start = t_start
        self.scope: Scope = scope
        self._start = {c.uuid: c for c in counters}
        self._last = dict(self._start)
        self._reset: set[str] = set()
        self._instant: dict[str, Trapezoid] = {}
        self._average: dict[str, Trapezoid] = {}
        self.add_power(powers)

    def add_power(self, readings: Iterable[PowerReading]) -> None:
        for r in readings:
            self._instant.setdefault(r.uuid, Trapezoid()).add(r.t, r.instant_w)
            self._average.setdefault(r.uuid, Trapezoid()).add(r.t, r.average_w)

    def add_counters(self, readings: Iterable[EnergyReading]) -> None:
        for r in readings:
            if r.energy_mj is None:
                continue
            prev = self._last.get(r.uuid)
            if prev is not None and prev.energy_mj is not None and r.energy_mj < prev.energy_mj:
                self._reset.add(r.uuid)
            self._last[r.uuid] = r

    def finish(self, t_end: float, counters: Iterable[EnergyReading], powers: Iterable[PowerReading]) -> WindowData:
        self.add_power(powers)
        end = list(counters)
        self.add_counters(end)
        by_end = {c.uuid: c for c in end}
        uuids = list(dict.fromkeys([*self._start, *self._instant, *by_end]))
        gpus = []
        for uuid in uuids:
            s, e = self._start.get(uuid), by_end.get(uuid)
            inst, avg = self._instant.get(uuid, Trapezoid()), self._average.get(uuid, Trapezoid())
            gpus.append(GpuWindow(
                uuid=uuid,
                counter_start_mj=s.energy_mj if s else None,
                counter_end_mj=e.energy_mj if e else None,
                counter_span_s=(e.t - s.t) if s and e else None,
                counter_reset=uuid in self._reset,
                instant_j=inst.joules, instant_points=inst.points, instant_rate_hz=inst.rate_hz,
                instant_max_gap_s=inst.max_gap_s,
                average_j=avg.joules, average_points=avg.points,
            ))
        return WindowData(self.t_start, t_end, tuple(gpus), self.scope)


@dataclass(frozen=True)
class GpuEnergy:
    uuid: str
    method: Method | None
    joules: float | None
    counter_j: float | None
    instant_j: float | None
    average_j: float | None


@dataclass(frozen=True)
class EnergyReport:
    valid: bool
    method: Method | None  # the weakest method any GPU needed
    scope: Scope
    duration_s: float
    joules: float | None  # gross, all GPUs
    net_joules: float | None  # after idle-baseline subtraction (== joules without a baseline)
    average_w: float | None  # gross
    baseline_w: float | None
    output_tokens: int | None
    j_per_token: float | None  # from net_joules
    tokens_per_j: float | None
    flags: tuple[str, ...]
    per_gpu: tuple[GpuEnergy, ...]

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "per_gpu"}
        out["flags"] = list(self.flags)
        out["per_gpu"] = [g.__dict__.copy() for g in self.per_gpu]
        return out


def gpu_energy(g: GpuWindow, *, min_instant_hz: float = MIN_INSTANT_HZ) -> tuple[GpuEnergy, list[str]]:
    """Pick the best method this GPU's data allows; say what is doubtful about it."""
    flags: list[str] = []
    backwards = g.counter_start_mj is not None and g.counter_end_mj is not None and g.counter_end_mj < g.counter_start_mj
    if g.counter_reset or backwards:
        flags.append(f"counter-reset:{g.uuid}")
        return GpuEnergy(g.uuid, "counter", None, None, g.instant_j, g.average_j), flags
    if g.counter_j is not None:
        return GpuEnergy(g.uuid, "counter", g.counter_j, g.counter_j, g.instant_j, g.average_j), flags
    if g.instant_j is not None:
        # 5 % slack: a 20 Hz sampler with a little jitter must not be called undersampled
        if g.instant_rate_hz is None or g.instant_rate_hz < 0.95 * min_instant_hz:
            flags.append(f"undersampled:{g.uuid}")
        return GpuEnergy(g.uuid, "instant-integral", g.instant_j, None, g.instant_j, g.average_j), flags
    if g.average_j is not None:
        flags.append(f"average-power:{g.uuid}")
        return GpuEnergy(g.uuid, "average-integral", g.average_j, None, None, g.average_j), flags
    flags.append(f"no-energy-data:{g.uuid}")
    return GpuEnergy(g.uuid, None, None, None, None, None), flags


def energy_report(
    window: WindowData,
    *,
    output_tokens: int | None = None,
    baseline_w: float | None = None,
    min_window_s: float = MIN_WINDOW_S,
    min_instant_hz: float = MIN_INSTANT_HZ,
) -> EnergyReport:
    """Energy of a window, J/token and tokens/J. `baseline_w` (total idle watts of the GPUs, e.g. the
    average_w of an idle window's report) is subtracted over the window's duration when given."""
    per_gpu: list[GpuEnergy] = []
    flags: list[str] = []
    for g in window.gpus:
        e, f = gpu_energy(g, min_instant_hz=min_instant_hz)
        per_gpu.append(e)
        flags.extend(f)
    duration = window.duration_s
    if duration < min_window_s:
        flags.append("short-window")
    valid = bool(per_gpu) and all(e.joules is not None for e in per_gpu)
    methods = [e.method for e in per_gpu if e.method is not None]
    method = max(methods, key=METHOD_ORDER.index) if methods else None
    joules = sum(e.joules for e in per_gpu if e.joules is not None) if valid else None
    net = joules
    if joules is not None and baseline_w is not None:
        net = joules - baseline_w * duration
        if net <= 0:
            flags.append("below-baseline")
    j_per_token = tokens_per_j = None
    if net is not None and output_tokens:
        j_per_token = net / output_tokens
        tokens_per_j = output_tokens / net if net > 0 else None
    return EnergyReport(
        valid=valid, method=method, scope=window.scope, duration_s=duration, joules=joules, net_joules=net,
        average_w=joules / duration if joules is not None and duration > 0 else None, baseline_w=baseline_w,
        output_tokens=output_tokens, j_per_token=j_per_token, tokens_per_j=tokens_per_j,
        flags=tuple(flags), per_gpu=tuple(per_gpu),
    )


def relative_difference(a: float | None, b: float | None) -> float | None:
    """(a − b) / b, for comparing methods (e.g. instant integral against the counter)."""
    if a is None or b is None or b == 0:
        return None
    return (a - b) / b


def window_from_points(
    t_start: float, t_end: float, counters_start: Sequence[EnergyReading], counters_end: Sequence[EnergyReading],
    powers: Sequence[PowerReading], *, counters_between: Sequence[EnergyReading] = (), scope: Scope = "gpu",
) -> WindowData:
    """Build a WindowData from recorded readings (tests, or JSONL replays of `top --record`)."""
    acc = WindowAccumulator(t_start, counters_start, (), scope=scope)
    acc.add_counters(counters_between)
    acc.add_power(powers)
    return acc.finish(t_end, counters_end, ())
