"""What `metralectl top` shows, as values: GPU samples + engine /metrics snapshots + thermal lines →
rows and JSON-ready dicts. Pure (no NVML, no HTTP, no printing), so the CLI, the TUI and the agent
render the same numbers.

The GPU rows are built here, the engine rows in telemetry.engine_view.

`TopModel` is the one stateful piece: it remembers each GPU's thermal state (the park/resume lines
have hysteresis, so the next state depends on the last) and which samples it has already seen.
Rates come from trailing windows: GPU energy rate from the NVML energy counter's delta over the last
`rate_window_s` (instant-power integral when the counter is missing), engine token rates from the
oldest and newest /metrics snapshots the caller kept for that window.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from metralectl.core.gpudata import GpuInfo, GpuSample, GpuSystem, GpuUnavailable, MemoryState
from metralectl.telemetry.energy import Method, Scope, Trapezoid
from metralectl.telemetry.engine_view import EngineObservation, EngineRow, engine_row
from metralectl.telemetry.gateway_view import GatewayRow
from metralectl.telemetry.sampler import Sample, SamplerStats
from metralectl.telemetry.thermal import (
    ThermalLines,
    ThermalState,
    ThermalStatus,
    node_thermal,
    thermal_status,
)

SCHEMA = 1
RATE_WINDOW_S = 5.0  # the counter ticks every ~100 ms on an H200: ±2 % edge error over 5 s, ±10 % over 1 s
UNIFIED_LABEL = ("unified: host MemTotal/MemAvailable (NVML has no device memory here); "
                 "GPU-resident = Σ GPU processes")


# -- GPU ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EnergyRate:
    """Average power over the trailing window, and how it was measured."""

    watts: float | None
    method: Method | None  # counter | instant-integral | average-integral
    span_s: float | None


def energy_rates(samples: Sequence[Sample], *, window_s: float = RATE_WINDOW_S) -> dict[str, EnergyRate]:
    """Per GPU uuid: the energy counter's delta over the newest `window_s` of samples divided by the time
    between its readings; where fewer than two counter readings are there (no counter, just started) or
    the counter went backwards in between and left fewer than two, the trapezoid of instant power (or,
    last resort, the averaged reading) over the same samples."""
    if not samples:
        return {}
    end_t = samples[-1].t
    recent = [s for s in samples if s.t >= end_t - window_s]
    out: dict[str, EnergyRate] = {}
    for g in samples[-1].gpus:
        counter = _counter_rate([e for s in recent if s.energy for e in s.energy if e.uuid == g.uuid])
        out[g.uuid] = counter if counter is not None else _integral_rate([x for s in recent for x in s.gpus
                                                                         if x.uuid == g.uuid])
    return out


def _counter_rate(readings: list[Any]) -> EnergyRate | None:
    usable = [r for r in readings if r.energy_mj is not None]
    for i in range(len(usable) - 1, 0, -1):  # after a reset only the readings since it count
        if usable[i].energy_mj < usable[i - 1].energy_mj:
            usable = usable[i:]
            break
    if len(usable) < 2:
        return None
    first, last = usable[0], usable[-1]
    span = last.t - first.t
    if span <= 0:
        return None
    return EnergyRate((last.energy_mj - first.energy_mj) / 1000.0 / span, "counter", span)


def _integral_rate(gpus: list[GpuSample]) -> EnergyRate:
    for method, attr in (("instant-integral", "instant_w"), ("average-integral", "average_w")):
        acc = Trapezoid()
        for g in gpus:
            acc.add(g.power.t, getattr(g.power, attr))
        if acc.joules is not None and acc.span_s > 0:
            return EnergyRate(acc.joules / acc.span_s, method, acc.span_s)  # type: ignore[arg-type]
    return EnergyRate(None, None, None)


@dataclass(frozen=True)
class GpuRow:
    index: int
    uuid: str
    name: str | None
    hw_class: str | None
    util_gpu_pct: int | None
    util_mem_pct: int | None
    power_w: float | None
    power_source: str | None  # "instant" | "average" (a ~1 s average on Ampere and later) | None
    power_limit_w: float | None
    energy_mj: int | None  # the latest counter reading in the window
    energy: EnergyRate
    energy_scope: Scope  # "gpu-only" on unified memory: the board draws more than the GPU reports
    temp_gpu_c: int | None
    temp_mem_c: int | None
    thermal: ThermalStatus | None  # None: this hardware class has no thermal lines
    lines: ThermalLines | None
    clock_reasons: tuple[str, ...] | None
    throttled: bool | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    memory: MemoryState
    processes: int | None  # GPU processes listed by the driver (None: it would not say)
    process_list: tuple[ProcessRow, ...] = ()  # per PID: its GPU memory and our container, when one of ours

    @property
    def memory_label(self) -> str:
        return UNIFIED_LABEL if self.memory.kind == "unified" else "discrete: NVML device memory"

    def to_json(self) -> dict[str, Any]:
        m = self.memory
        return {
            "index": self.index, "uuid": self.uuid, "name": self.name, "hw_class": self.hw_class,
            "util_gpu_pct": self.util_gpu_pct, "util_mem_pct": self.util_mem_pct,
            "power_w": self.power_w, "power_source": self.power_source, "power_limit_w": self.power_limit_w,
            "energy_mj": self.energy_mj, "energy_rate_w": self.energy.watts,
            "energy_rate_method": self.energy.method, "energy_rate_span_s": self.energy.span_s,
            "energy_scope": self.energy_scope,
            "temp_gpu_c": self.temp_gpu_c, "temp_mem_c": self.temp_mem_c,
            "thermal": None if self.thermal is None else {
                "state": self.thermal.state, "reason": self.thermal.reason,
                "thermal_throttle": self.thermal.throttled,
                "park_c": self.lines.park_c if self.lines else None,
                "resume_c": self.lines.resume_c if self.lines else None},
            "clock_reasons": None if self.clock_reasons is None else list(self.clock_reasons),
            "throttled": self.throttled,
            "sm_clock_mhz": self.sm_clock_mhz, "mem_clock_mhz": self.mem_clock_mhz,
            "memory": {"kind": m.kind, "total_bytes": m.total_bytes, "used_bytes": m.used_bytes,
                       "available_bytes": m.available_bytes, "gpu_resident_bytes": m.gpu_resident_bytes,
                       "label": self.memory_label},
            "processes": self.processes,
            "process_list": [{"pid": p.pid, "used_bytes": p.used_bytes, "kind": p.kind, "container": p.container}
                             for p in self.process_list],
        }


@dataclass(frozen=True)
class ProcessRow:
    pid: int
    used_bytes: int | None
    kind: str
    container: str | None  # the metralectl container this PID runs in, when it is one of ours


ContainerOf = Callable[[int], "str | None"]


def gpu_row(sample: GpuSample, info: GpuInfo | None, rate: EnergyRate | None, energy_mj: int | None,
            thermal: ThermalStatus | None, lines: ThermalLines | None,
            container_of: ContainerOf | None = None) -> GpuRow:
    procs = tuple(ProcessRow(p.pid, p.used_bytes, p.kind, container_of(p.pid) if container_of else None)
                  for p in sample.processes or ())
    return GpuRow(
        index=sample.index, uuid=sample.uuid,
        name=info.name if info else None, hw_class=info.hw_class if info else None,
        util_gpu_pct=sample.util_gpu_pct, util_mem_pct=sample.util_mem_pct,
        power_w=sample.power_w, power_source=sample.power_source, power_limit_w=sample.power_limit_w,
        energy_mj=energy_mj, energy=rate or EnergyRate(None, None, None),
        energy_scope="gpu-only" if sample.memory.kind == "unified" else "gpu",
        temp_gpu_c=sample.temp_gpu_c, temp_mem_c=sample.temp_mem_c, thermal=thermal, lines=lines,
        clock_reasons=sample.clock_reasons, throttled=sample.throttled,
        sm_clock_mhz=sample.sm_clock_mhz, mem_clock_mhz=sample.mem_clock_mhz, memory=sample.memory,
        processes=None if sample.processes is None else len({p.pid for p in sample.processes}),
        process_list=procs,
    )


# -- the whole view -------------------------------------------------------------------------------
@dataclass(frozen=True)
class TopView:
    wall: float  # time.time() of the newest data
    t: float | None  # the newest sample's monotonic time
    interval_s: float
    gpu: GpuSystem | GpuUnavailable
    gpus: tuple[GpuRow, ...]
    engines: tuple[EngineRow, ...]
    engine_note: str | None  # why no engine is shown ("metralectl is serving nothing", "Docker: …")
    sampler: SamplerStats | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    gateways: tuple[GatewayRow, ...] = ()  # this box's gateways (their records and /metrics), gone ones included

    @property
    def thermal(self) -> ThermalState:
        return node_thermal([g.thermal for g in self.gpus if g.thermal is not None])

    def to_json(self) -> dict[str, Any]:
        if isinstance(self.gpu, GpuSystem):
            gpu: dict[str, Any] = {"available": True, "driver_version": self.gpu.driver_version,
                                   "cuda_driver_version": self.gpu.cuda_driver_version}
        else:
            gpu = {"available": False, "reason": f"no GPU: {self.gpu.reason}", "hint": self.gpu.hint,
                   "cause": self.gpu.cause}
        st = self.sampler
        out = {
            "schema": SCHEMA, "wall": self.wall, "t": self.t, "interval_s": self.interval_s,
            "gpu": gpu, "gpus": [g.to_json() for g in self.gpus],
            "thermal": self.thermal if self.gpus else None,
            "engines": [e.to_json() for e in self.engines], "engine_note": self.engine_note,
            "gateways": [g.to_json() for g in self.gateways],
            "sampler": None if st is None else {
                "hz": st.hz, "tick_hz": st.tick_hz, "energy_hz": st.energy_hz, "samples": st.samples,
                "missed_ticks": st.missed_ticks, "cpu_pct": st.cpu_pct, "lateness_p99_s": st.lateness_p99_s,
                "error": st.error},
            "notes": list(self.notes),
        }
        return finite(out)


def finite(doc: dict[str, Any]) -> dict[str, Any]:
    """NaN/±inf → None, recursively: the output must stay strict JSON (json.dumps(allow_nan=False))."""
    return {k: _finite(v) for k, v in doc.items()}


def _finite(value: object) -> object:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class TopModel:
    """Builds TopViews; keeps the thermal hysteresis state per GPU between calls."""

    def __init__(self, lines: Mapping[str, ThermalLines], *, rate_window_s: float = RATE_WINDOW_S) -> None:
        self.lines = dict(lines)
        self.rate_window_s = rate_window_s
        self._thermal: dict[str, ThermalStatus] = {}
        self._last_seq = -1

    def _lines_for(self, info: GpuInfo | None) -> ThermalLines | None:
        return self.lines.get(info.hw_class) if info is not None and info.hw_class else None

    def _advance_thermal(self, samples: Sequence[Sample], infos: Mapping[str, GpuInfo]) -> None:
        """Feed every sample not seen yet through the hysteresis, in order."""
        for s in samples:
            if s.seq <= self._last_seq:
                continue
            for g in s.gpus:
                lines = self._lines_for(infos.get(g.uuid))
                if lines is None:
                    continue
                prev = self._thermal.get(g.uuid)
                self._thermal[g.uuid] = thermal_status(g.temp_gpu_c, g.clock_reasons, park_c=lines.park_c,
                                                       resume_c=lines.resume_c,
                                                       previous=prev.state if prev else "ok")
            self._last_seq = s.seq

    def view(
        self,
        *,
        gpu: GpuSystem | GpuUnavailable,
        samples: Sequence[Sample],
        engines: Sequence[EngineObservation] = (),
        engine_note: str | None = None,
        wall: float,
        interval_s: float,
        sampler: SamplerStats | None = None,
        notes: Sequence[str] = (),
        container_of: ContainerOf | None = None,
        gateways: Sequence[GatewayRow] = (),
    ) -> TopView:
        """`samples`: the sampler's newest samples, oldest first, covering at least the rate window."""
        rows: list[GpuRow] = []
        infos = {g.uuid: g for g in gpu.gpus} if isinstance(gpu, GpuSystem) else {}
        if isinstance(gpu, GpuSystem) and samples:
            self._advance_thermal(samples, infos)
            rates = energy_rates(samples, window_s=self.rate_window_s)
            latest_mj = {e.uuid: e.energy_mj for s in samples if s.energy for e in s.energy}
            for g in samples[-1].gpus:
                info = infos.get(g.uuid)
                rows.append(gpu_row(g, info, rates.get(g.uuid), latest_mj.get(g.uuid),
                                    self._thermal.get(g.uuid), self._lines_for(info), container_of))
        return TopView(wall=wall, t=samples[-1].t if samples else None, interval_s=interval_s, gpu=gpu,
                       gpus=tuple(rows), engines=tuple(engine_row(o) for o in engines),
                       engine_note=engine_note, sampler=sampler, notes=tuple(notes), gateways=tuple(gateways))


def thermal_lines_from(hardware: Mapping[str, Any]) -> dict[str, ThermalLines]:
    """{class id: lines} from the catalog's hardware classes (those stating both lines)."""
    out = {}
    for hw_id, hw in hardware.items():
        park, resume = getattr(hw, "park_c", None), getattr(hw, "resume_c", None)
        if park is not None and resume is not None:
            out[hw_id] = ThermalLines(float(park), float(resume))
    return out
