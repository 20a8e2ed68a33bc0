"""The GPU seam: the only module that imports pynvml (nvidia-ml-py), and only inside functions.

Every NVML call goes through `NvmlProbe._call`, which turns "this field is not available here"
errors into None (unknown) and remembers, per GPU and field, what the driver answered; errors that
mean the GPU or driver is gone raise `GpuLost`. No NVML library / no driver is a value
(`GpuUnavailable`), not an exception. What NVML's answers mean (fatal, permanent, their names) is
seams.nvml_answers'.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, TypeVar

from metralectl.errors import ExitCode, MetralError
from metralectl.core.gpudata import (
    DEFAULT_GPU_CLASSES,
    DEFAULT_UNIFIED_CLASSES,
    EnergyReading,
    GpuInfo,
    GpuSample,
    GpuSystem,
    GpuUnavailable,
    MemoryState,
    PowerReading,
    PowerSource,
    ProcessMemory,
    cuda_version_string,
    decode_clock_reasons,
    gpu_resident_bytes,
    is_unified,
    match_hw_class,
    parse_meminfo,
)
from metralectl.seams.nvml_answers import (
    FATAL,
    FIELD_NAMES,
    PERMANENT,
    UNAVAILABLE_HINTS,
    Never,
    as_int,
    as_text,
    code_name,
    error_name,
    field_value,
    scaled,
)

T = TypeVar("T")


class GpuLost(MetralError):
    """The GPU or its driver went away while we were reading it (GPU lost, driver unloaded, reset)."""

    exit_code = ExitCode.FAILED


class GpuProbe(Protocol):
    """What telemetry needs from the GPUs. NvmlProbe is the real one; tests use a fake pynvml under it."""

    def open(self) -> GpuSystem | GpuUnavailable: ...

    def power(self) -> tuple[PowerReading, ...]: ...

    def energy(self) -> tuple[EnergyReading, ...]: ...

    def sample(self, *, detail: bool = True) -> tuple[GpuSample, ...]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class _Detail:
    """The slow-changing part of a sample, read at a lower rate than the rest."""

    t: float
    temp_mem_c: int | None
    power_limit_w: float | None
    memory: MemoryState
    processes: tuple[ProcessMemory, ...] | None
    pcie_gen: int | None
    pcie_width: int | None
    fan_pct: int | None


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str
    unified: bool = False
    support: dict[str, str] = field(default_factory=dict)
    detail: _Detail | None = None


class NvmlProbe:
    """GpuProbe over NVML. Not thread-safe by design: one thread (the sampler's) owns it."""

    def __init__(
        self,
        *,
        gpu_classes: Sequence[tuple[str, str]] = DEFAULT_GPU_CLASSES,
        unified_classes: frozenset[str] | set[str] = DEFAULT_UNIFIED_CLASSES,
        meminfo_path: str | Path = "/proc/meminfo",
        nvml: ModuleType | Any | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gpu_classes = tuple(gpu_classes)
        self._unified_classes = frozenset(unified_classes)
        self._meminfo_path = Path(meminfo_path)
        self._nv: Any = nvml  # a module; injected by tests, else imported in open()
        self._clock = clock
        self._devices: list[_Device] = []
        self._open = False
        self._instant_field: int | None = None
        self._reasons_fn: Callable[[Any], int] | None = None

    # -- the choke point ------------------------------------------------------------------------
    def _call(self, dev: _Device | None, name: str, fn: Callable[..., T], *args: Any) -> T | None:
        nv = self._nv
        if dev is not None and dev.support.get(name) in PERMANENT:
            return None  # asking again costs time (an unsupported fan read: ~150 µs on an H200) for nothing
        try:
            value = fn(*args)
        except nv.NVMLError as exc:
            kind = error_name(exc)
            if kind in FATAL:
                where = f"GPU {dev.index} ({dev.uuid})" if dev else "NVML"
                raise GpuLost(f"{where}: NVML says {kind} while reading {name}",
                              "check `nvidia-smi`; the driver may need a reload or the machine a reboot") from exc
            self._note(dev, name, kind)
            return None
        except getattr(nv, "NVMLLibraryMismatchError", Never):
            self._note(dev, name, "LibraryMismatch")  # pynvml newer than the driver: the function is absent
            return None
        self._note(dev, name, "ok")
        return value

    @staticmethod
    def _note(dev: _Device | None, name: str, outcome: str) -> None:
        if dev is not None:
            dev.support[name] = outcome

    # -- lifecycle ------------------------------------------------------------------------------
    def open(self) -> GpuSystem | GpuUnavailable:
        try:
            return self._open_devices()
        except GpuLost as exc:
            self.close()
            return GpuUnavailable(exc.message, exc.hint, "GpuLost")

    def _open_devices(self) -> GpuSystem | GpuUnavailable:
        if self._nv is None:
            try:
                self._nv = importlib.import_module("pynvml")
            except ImportError:
                return GpuUnavailable("nvidia-ml-py (pynvml) is not installed", "pip install nvidia-ml-py")
        nv = self._nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            kind = error_name(exc)
            reason, hint = UNAVAILABLE_HINTS.get(kind, (f"NVML could not start ({kind})", "check `nvidia-smi`"))
            return GpuUnavailable(reason, hint, kind)
        self._open = True
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            self.close()
            return GpuUnavailable(f"NVML could not count GPUs ({error_name(exc)})", "check `nvidia-smi`",
                                  error_name(exc))
        if count == 0:
            self.close()
            return GpuUnavailable("the NVIDIA driver is loaded but sees no GPU", "check `nvidia-smi`")
        self._instant_field = getattr(nv, "NVML_FI_DEV_POWER_INSTANT", None)
        host_total = self._meminfo().get("MemTotal")
        infos = []
        for index in range(count):
            handle = self._call(None, "handle", nv.nvmlDeviceGetHandleByIndex, index)
            if handle is None:
                continue  # a GPU this process may not see (permissions, MIG); the others still work
            dev = _Device(index, handle, uuid=self._call(None, "uuid", nv.nvmlDeviceGetUUID, handle) or f"index-{index}")
            infos.append(self._describe(dev, host_total))
            self._devices.append(dev)
        if not infos:
            self.close()
            return GpuUnavailable("NVML lists GPUs but none could be opened", "check the permissions of /dev/nvidia*")
        self._reasons_fn = self._pick_reasons_fn()
        driver = self._call(None, "driver_version", nv.nvmlSystemGetDriverVersion)
        cuda_fn = getattr(nv, "nvmlSystemGetCudaDriverVersion_v2", None) or nv.nvmlSystemGetCudaDriverVersion
        cuda = cuda_version_string(self._call(None, "cuda_driver_version", cuda_fn))
        # One full read now, so `support` says what this driver answers for every field we use.
        self.sample()
        self.energy()
        infos = [replace(i, support=dict(d.support)) for i, d in zip(infos, self._devices)]
        return GpuSystem(as_text(driver), cuda, tuple(infos))

    def _describe(self, dev: _Device, host_total: int | None) -> GpuInfo:
        nv = self._nv
        name = as_text(self._call(dev, "name", nv.nvmlDeviceGetName, dev.handle))
        pci = self._call(dev, "pci", nv.nvmlDeviceGetPciInfo, dev.handle)
        hw_class = match_hw_class(name, self._gpu_classes)
        mem = self._call(dev, "memory", nv.nvmlDeviceGetMemoryInfo, dev.handle)
        dev.unified = is_unified(
            getattr(mem, "total", None), host_total,
            memory_info_supported=mem is not None,
            class_unified=None if hw_class is None else hw_class in self._unified_classes,
        )
        instant = self._fields(dev, [self._instant_field]).get(self._instant_field) if self._instant_field else None
        average = self._call(dev, "power.average", nv.nvmlDeviceGetPowerUsage, dev.handle)
        source: PowerSource | None = "instant" if instant is not None else ("average" if average is not None else None)
        return GpuInfo(index=dev.index, uuid=dev.uuid, name=name, pci_bus_id=as_text(getattr(pci, "busId", None)),
                       hw_class=hw_class, memory_kind="unified" if dev.unified else "discrete",
                       power_source=source)

    def _pick_reasons_fn(self) -> Callable[[Any], int] | None:
        """Clock *event* reasons (driver ≥ 535) where the driver has them, else the older throttle call."""
        nv, dev = self._nv, self._devices[0]
        for fn_name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn: Callable[[Any], int] | None = getattr(nv, fn_name, None)
            if fn is not None:
                dev.support.pop("clock_reasons", None)  # the older call gets its own chance
                self._call(dev, "clock_reasons", fn, dev.handle)
                if dev.support.get("clock_reasons") not in ("FunctionNotFound", "LibraryMismatch"):
                    return fn
        return None

    def close(self) -> None:
        if self._open:
            self._open = False
            self._devices = []
            try:
                self._nv.nvmlShutdown()
            except self._nv.NVMLError:
                pass  # shutting down a library that already lost its driver: nothing left to release

    def support(self) -> dict[str, dict[str, str]]:
        """uuid → {field: "ok" | NVML error name}: what the driver answered most recently."""
        return {d.uuid: dict(d.support) for d in self._devices}

    # -- readings -------------------------------------------------------------------------------
    def power(self) -> tuple[PowerReading, ...]:
        """The cheap read (µs): instant power where offered, and the averaged reading."""
        return tuple(self._power(dev) for dev in self._devices)

    def _power(self, dev: _Device) -> PowerReading:
        t = self._clock()
        instant_mw = self._fields(dev, [self._instant_field]).get(self._instant_field) if self._instant_field else None
        average_mw = self._call(dev, "power.average", self._nv.nvmlDeviceGetPowerUsage, dev.handle)
        return PowerReading(dev.uuid, t, scaled(instant_mw, 1e-3), scaled(average_mw, 1e-3))

    def energy(self) -> tuple[EnergyReading, ...]:
        """The expensive read (3-16 ms per GPU on an H200): the total-energy counter, in mJ."""
        out = []
        for dev in self._devices:
            t = self._clock()
            mj = self._call(dev, "energy", self._nv.nvmlDeviceGetTotalEnergyConsumption, dev.handle)
            out.append(EnergyReading(dev.uuid, t, mj))
        return tuple(out)

    def sample(self, *, detail: bool = True) -> tuple[GpuSample, ...]:
        """Every field. With detail=False the slow-changing ones (memory, processes, power limit, HBM
        temperature, PCIe, fan: about half the cost of a sample) are carried over from the last detailed
        read; `GpuSample.detail_t` says when that was."""
        # Power first for every GPU: its timestamp is the one energy integration relies on.
        powers = [self._power(dev) for dev in self._devices]
        if detail or any(d.detail is None for d in self._devices):
            host = self._meminfo() if any(d.unified for d in self._devices) else {}
            for dev in self._devices:
                dev.detail = self._detail(dev, host)
        return tuple(self._sample(dev, p) for dev, p in zip(self._devices, powers))

    def _sample(self, dev: _Device, power: PowerReading) -> GpuSample:
        nv, h = self._nv, dev.handle
        util = self._call(dev, "utilization", nv.nvmlDeviceGetUtilizationRates, h)
        reasons = self._call(dev, "clock_reasons", self._reasons_fn, h) if self._reasons_fn else None
        d = dev.detail
        assert d is not None
        return GpuSample(
            uuid=dev.uuid, index=dev.index, t=power.t, power=power,
            util_gpu_pct=getattr(util, "gpu", None), util_mem_pct=getattr(util, "memory", None),
            temp_gpu_c=self._call(dev, "temp_gpu", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
            sm_clock_mhz=self._call(dev, "clock_sm", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
            mem_clock_mhz=self._call(dev, "clock_mem", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
            clock_reasons=decode_clock_reasons(reasons),
            temp_mem_c=d.temp_mem_c, power_limit_w=d.power_limit_w, memory=d.memory, processes=d.processes,
            pcie_gen=d.pcie_gen, pcie_width=d.pcie_width, fan_pct=d.fan_pct, detail_t=d.t,
            hidden=frozenset({"pcie_gen", "pcie_width", "fan_pct"}) if dev.unified else frozenset(),
        )

    def _detail(self, dev: _Device, host: dict[str, int]) -> _Detail:
        nv, h = self._nv, dev.handle
        t = self._clock()
        mem_temp_field = getattr(nv, "NVML_FI_DEV_MEMORY_TEMP", None)
        mem_temp = self._fields(dev, [mem_temp_field]).get(mem_temp_field) if mem_temp_field else None
        processes = self._processes(dev)
        discrete = not dev.unified
        return _Detail(
            t=t, temp_mem_c=as_int(mem_temp),
            power_limit_w=scaled(self._call(dev, "power_limit", nv.nvmlDeviceGetEnforcedPowerLimit, h), 1e-3),
            memory=self._memory(dev, host, processes), processes=processes,
            pcie_gen=self._call(dev, "pcie_gen", nv.nvmlDeviceGetCurrPcieLinkGeneration, h) if discrete else None,
            pcie_width=self._call(dev, "pcie_width", nv.nvmlDeviceGetCurrPcieLinkWidth, h) if discrete else None,
            fan_pct=self._call(dev, "fan", nv.nvmlDeviceGetFanSpeed, h) if discrete else None,
        )

    def _memory(self, dev: _Device, host: dict[str, int], processes: tuple[ProcessMemory, ...] | None) -> MemoryState:
        resident = gpu_resident_bytes(processes)
        if dev.unified:
            # MemAvailable, not MemFree: page cache is reclaimable and the engine can have it.
            total, avail = host.get("MemTotal"), host.get("MemAvailable")
            used = total - avail if total is not None and avail is not None else None
            return MemoryState("unified", total, used, avail, resident)
        mem = self._call(dev, "memory", self._nv.nvmlDeviceGetMemoryInfo, dev.handle)
        if mem is None:
            return MemoryState("discrete", None, None, None, resident)
        return MemoryState("discrete", mem.total, mem.used, mem.free, mem.used)

    def _processes(self, dev: _Device) -> tuple[ProcessMemory, ...] | None:
        nv = self._nv
        found: list[ProcessMemory] = []
        answered = False
        for kind, fn_name in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                              ("graphics", "nvmlDeviceGetGraphicsRunningProcesses")):
            procs = self._call(dev, f"processes.{kind}", getattr(nv, fn_name), dev.handle)
            if procs is None:
                continue
            answered = True
            found.extend(ProcessMemory(int(p.pid), as_int(getattr(p, "usedGpuMemory", None)), kind)  # type: ignore[arg-type]
                         for p in procs)
        return tuple(found) if answered else None

    def _fields(self, dev: _Device, ids: list[int | None]) -> dict[int, float | int | None]:
        """nvmlDeviceGetFieldValues: each field carries its own return code, so one unsupported field
        costs only itself."""
        nv = self._nv
        out: dict[int, float | int | None] = {i: None for i in ids if i is not None}
        wanted = [i for i in out if dev.support.get(FIELD_NAMES.get(i, f"field.{i}")) not in PERMANENT]
        if not wanted:
            return out
        values = self._call(dev, "fields", nv.nvmlDeviceGetFieldValues, dev.handle, wanted)
        for v in values or ():
            name = FIELD_NAMES.get(v.fieldId, f"field.{v.fieldId}")
            if v.nvmlReturn != 0:
                self._note(dev, name, code_name(nv, v.nvmlReturn))
                continue
            self._note(dev, name, "ok")
            out[v.fieldId] = field_value(v)
        return out

    def _meminfo(self) -> dict[str, int]:
        try:
            return parse_meminfo(self._meminfo_path.read_text())
        except OSError:
            return {}  # not Linux, or /proc hidden: unified memory totals become unknown
