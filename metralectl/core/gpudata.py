"""GPU telemetry values and the pure rules behind them (no NVML here: see metralectl.seams.gpu).

Every reading is `None` when the driver cannot give it ("unknown"), never a made-up 0. Fields that
mean nothing on a machine (PCIe link and fan on a unified-memory GB10) are *hidden*: absent from
`to_json()` output rather than null.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

MemoryKind = Literal["discrete", "unified"]
PowerSource = Literal["instant", "average"]

# (pattern, hardware class id). A pattern matches an NVML device name as a whole word, case-insensitive
# ("H200" matches "NVIDIA H200 NVL" but "B200" does not match "NVIDIA GB200"). First match wins. The
# catalog's `gpu-names` lists extend this; the default only covers the classes we ship.
DEFAULT_GPU_CLASSES: tuple[tuple[str, str], ...] = (
    ("GB10", "gb10"),
    ("H100", "hopper"),
    ("H200", "hopper"),
    ("H800", "hopper"),
    ("GH200", "hopper"),
    ("B200", "b200"),
)
DEFAULT_UNIFIED_CLASSES: frozenset[str] = frozenset({"gb10"})
UNIFIED_TOLERANCE = 0.10  # an NVML total this close to host MemTotal is the shared pool, not device memory

# Clock event ("throttle") reason bits, as in nvml.h (nvmlClocksEventReason*).
CLOCK_REASON_BITS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal"),
    (0x040, "hw_thermal"),
    (0x080, "hw_power_brake"),
    (0x100, "display_clocks"),
)
THERMAL_REASONS = frozenset({"sw_thermal", "hw_thermal", "hw_slowdown"})
# Reasons that cost performance. Idle, application clocks, sync boost and display clocks are benign.
THROTTLE_REASONS = THERMAL_REASONS | {"sw_power_cap", "hw_power_brake"}


def decode_clock_reasons(mask: int | None) -> tuple[str, ...] | None:
    """Bit mask → reason names; unknown bits are kept as hex so nothing is silently dropped."""
    if mask is None:
        return None
    names = [name for bit, name in CLOCK_REASON_BITS if mask & bit]
    rest = mask & ~sum(bit for bit, _ in CLOCK_REASON_BITS)
    if rest:
        names.append(f"0x{rest:x}")
    return tuple(names)


def is_throttled(reasons: Iterable[str] | None, *, thermal_only: bool = False) -> bool | None:
    if reasons is None:
        return None
    wanted = THERMAL_REASONS if thermal_only else THROTTLE_REASONS
    return any(r in wanted for r in reasons)


def match_hw_class(name: str | None, patterns: Sequence[tuple[str, str]] = DEFAULT_GPU_CLASSES) -> str | None:
    """The hardware class id of an NVML device name, or None when no pattern matches."""
    if not name:
        return None
    for pattern, hw_class in patterns:
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(pattern)}(?![A-Za-z0-9])", name, re.IGNORECASE):
            return hw_class
    return None


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo → {key: bytes}. Values are in kB there (really KiB)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            scale = 1024 if len(parts) > 1 and parts[1].lower() == "kb" else 1
            out[key.strip()] = int(parts[0]) * scale
    return out


def is_unified(
    nvml_total: int | None,
    host_total: int | None,
    *,
    memory_info_supported: bool,
    class_unified: bool | None,
) -> bool:
    """Decide whether a GPU shares host memory (GB10) rather than owning its own.

    `class_unified` is the hardware class's word (None when the device matches no known class). A known
    discrete class (Hopper, B200) is never reclassified by the size heuristic: a single-H200 box with
    128 GiB of RAM would otherwise look "unified".
    """
    if not memory_info_supported or nvml_total == 0:
        return True
    if class_unified is not None:
        return class_unified
    if nvml_total is None or not host_total:
        return False
    return abs(nvml_total - host_total) <= UNIFIED_TOLERANCE * host_total


@dataclass(frozen=True)
class ProcessMemory:
    pid: int
    used_bytes: int | None  # None: the driver would not say (e.g. no permission, WDDM)
    kind: Literal["compute", "graphics"]


def gpu_resident_bytes(processes: Iterable[ProcessMemory] | None) -> int | None:
    """Σ per-process GPU memory, counting a pid listed as both compute and graphics once."""
    if processes is None:
        return None
    per_pid: dict[int, int] = {}
    for p in processes:
        if p.used_bytes is not None:
            per_pid[p.pid] = max(per_pid.get(p.pid, 0), p.used_bytes)
    return sum(per_pid.values())


@dataclass(frozen=True)
class MemoryState:
    """discrete: NVML's device memory. unified: the host pool (MemTotal/MemAvailable) plus what GPU
    processes hold (`gpu_resident_bytes`), because NVML answers NotSupported there."""

    kind: MemoryKind
    total_bytes: int | None
    used_bytes: int | None
    available_bytes: int | None
    gpu_resident_bytes: int | None


@dataclass(frozen=True)
class PowerReading:
    uuid: str
    t: float  # monotonic seconds, taken just before the read
    instant_w: float | None
    average_w: float | None  # nvmlDeviceGetPowerUsage: a ~1 s average on Ampere and later

    @property
    def watts(self) -> float | None:
        return self.instant_w if self.instant_w is not None else self.average_w

    @property
    def source(self) -> PowerSource | None:
        if self.instant_w is not None:
            return "instant"
        return "average" if self.average_w is not None else None


@dataclass(frozen=True)
class EnergyReading:
    uuid: str
    t: float
    energy_mj: int | None  # total energy since the driver loaded, millijoules


@dataclass(frozen=True)
class GpuInfo:
    """What does not change while a GPU is open."""

    index: int
    uuid: str
    name: str | None
    pci_bus_id: str | None
    hw_class: str | None
    memory_kind: MemoryKind
    power_source: PowerSource | None  # what the driver offers: instant where it can
    support: Mapping[str, str] = field(default_factory=dict)  # field → "ok" or the NVML error's name

    @property
    def hidden(self) -> frozenset[str]:
        return frozenset({"pcie_gen", "pcie_width", "fan_pct"}) if self.memory_kind == "unified" else frozenset()

    def to_json(self) -> dict[str, Any]:
        out = _plain(self)
        out["support"] = dict(self.support)
        return out


@dataclass(frozen=True)
class GpuSample:
    uuid: str
    index: int
    t: float
    power: PowerReading
    util_gpu_pct: int | None
    util_mem_pct: int | None
    temp_gpu_c: int | None
    temp_mem_c: int | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    clock_reasons: tuple[str, ...] | None
    power_limit_w: float | None
    memory: MemoryState
    processes: tuple[ProcessMemory, ...] | None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    fan_pct: int | None = None
    detail_t: float | None = None  # when temp_mem…fan_pct were read (they refresh at a lower rate)
    hidden: frozenset[str] = frozenset()

    @property
    def power_w(self) -> float | None:
        return self.power.watts

    @property
    def power_source(self) -> PowerSource | None:
        return self.power.source

    @property
    def throttled(self) -> bool | None:
        return is_throttled(self.clock_reasons)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready; hidden fields left out, unknown ones null."""
        out = _plain(self, skip=self.hidden | {"hidden", "power"})
        out["power_w"] = self.power_w
        out["power_source"] = self.power_source
        out["throttled"] = self.throttled
        return out


@dataclass(frozen=True)
class GpuSystem:
    driver_version: str | None
    cuda_driver_version: str | None  # "13.0"
    gpus: tuple[GpuInfo, ...]

    def to_json(self) -> dict[str, Any]:
        return {"available": True, "driver_version": self.driver_version,
                "cuda_driver_version": self.cuda_driver_version, "gpus": [g.to_json() for g in self.gpus]}


@dataclass(frozen=True)
class GpuUnavailable:
    """No usable GPU: a state to show, not an error to raise (CI machines, laptops, a dead driver)."""

    reason: str
    hint: str | None = None
    cause: str | None = None  # the NVML error's name, when there was one

    def to_json(self) -> dict[str, Any]:
        return {"available": False, "reason": self.reason, "hint": self.hint, "cause": self.cause}


def cuda_version_string(value: int | None) -> str | None:
    """NVML's 13000 → "13.0"; 12080 → "12.8"."""
    if value is None or value <= 0:
        return None
    return f"{value // 1000}.{(value % 1000) // 10}"


def _plain(obj: Any, skip: Iterable[str] = ()) -> dict[str, Any]:
    skipped = set(skip)
    out: dict[str, Any] = {}
    for f in fields(obj):
        if f.name in skipped:
            continue
        value = getattr(obj, f.name)
        if hasattr(value, "__dataclass_fields__"):
            value = _plain(value)
        elif isinstance(value, tuple):
            value = [_plain(v) if hasattr(v, "__dataclass_fields__") else v for v in value]
        elif isinstance(value, frozenset):
            value = sorted(value)
        out[f.name] = value
    return out
