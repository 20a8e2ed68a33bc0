"""A fake `pynvml` module for tests and benchmarks: real constants and the library's OWN exception
classes (imported from the installed nvidia-ml-py, so `except pynvml.NVMLError_NotSupported` and
isinstance checks in metralectl.seams.gpu are genuine), fake devices behind the functions.

A device attribute may hold a value, a callable returning one (for changing counters), or an
exception class to raise (e.g. pynvml.NVMLError_NotSupported).
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml as real

NotSupported = real.NVMLError_NotSupported
NotFound = real.NVMLError_NotFound
NoPermission = real.NVMLError_NoPermission
FunctionNotFound = real.NVMLError_FunctionNotFound
LibraryNotFound = real.NVMLError_LibraryNotFound
DriverNotLoaded = real.NVMLError_DriverNotLoaded
GpuIsLost = real.NVMLError_GpuIsLost

GiB = 1024**3


@dataclass
class FakeDevice:
    name: Any = "NVIDIA H200"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    bus_id: str = "00000000:19:00.0"
    memory: Any = (143771 * 1024**2, 600 * 1024**2)  # (total, used) bytes, or an exception class
    instant_mw: Any = 120_000
    average_mw: Any = 118_000
    energy_mj: Any = 1_000_000
    energy_delay_s: float = 0.0  # mimic the H200's slow counter read
    temp_gpu: Any = 35
    temp_mem: Any = 40
    util: Any = (0, 0)
    clocks: Any = (345, 3201)
    reasons: Any = 0x1
    power_limit_mw: Any = 700_000
    compute_procs: Any = field(default_factory=list)  # [(pid, used bytes or None)]
    graphics_procs: Any = field(default_factory=list)
    fan: Any = NotSupported
    pcie: Any = (5, 16)


def gb10(**kw: Any) -> FakeDevice:
    """What a DGX Spark answers: memory NotSupported, no fan, no PCIe link info."""
    base: dict[str, Any] = {
        "name": "NVIDIA GB10", "uuid": "GPU-gb10-0000", "bus_id": "0000000F:01:00.0", "memory": NotSupported,
        "instant_mw": NotSupported, "average_mw": 11_000, "power_limit_mw": NotSupported,
        "temp_mem": NotSupported, "fan": NotSupported, "pcie": NotSupported, "clocks": (2411, NotSupported),
    }
    base.update(kw)
    return FakeDevice(**base)


def _get(value: Any) -> Any:
    if isinstance(value, type) and issubclass(value, BaseException):
        raise value()
    return value() if callable(value) else value


def make_fake(devices: list[FakeDevice], *, init_error: type[BaseException] | None = None,
              driver: str = "580.95.05", cuda: int = 13000, events_fn: bool = True) -> types.ModuleType:
    nv = types.ModuleType("fake_pynvml")
    for name in dir(real):  # constants and exception classes, the real ones
        if name.startswith(("NVML_", "NVMLError", "nvmlClocks")) or name in ("NVMLLibraryMismatchError",
                                                                           "nvmlExceptionClass"):
            setattr(nv, name, getattr(real, name))
    nv.calls = []  # type: ignore[attr-defined]
    handles = {id(d): d for d in devices}

    def dev(h: int) -> FakeDevice:
        return handles[h]

    def init() -> None:
        nv.calls.append("init")
        if init_error is not None:
            raise init_error()

    def field_values(h: int, ids: list[int]) -> list[Any]:
        d = dev(h)
        out = []
        for fid in ids:
            source = {real.NVML_FI_DEV_POWER_INSTANT: d.instant_mw, real.NVML_FI_DEV_MEMORY_TEMP: d.temp_mem}.get(
                fid, NotSupported)
            try:
                value, ret = _get(source), 0
            except real.NVMLError as exc:
                value, ret = 0, exc.value
            out.append(types.SimpleNamespace(fieldId=fid, nvmlReturn=ret, valueType=real.NVML_VALUE_TYPE_UNSIGNED_INT,
                                             value=types.SimpleNamespace(uiVal=value)))
        return out

    def energy(h: int) -> int:
        d = dev(h)
        if d.energy_delay_s:
            time.sleep(d.energy_delay_s)
        return _get(d.energy_mj)

    def memory(h: int) -> Any:
        total, used = _get(dev(h).memory)
        return types.SimpleNamespace(total=total, used=used, free=total - used)

    def procs(attr: str) -> Callable[[int], list[Any]]:
        def fn(h: int) -> list[Any]:
            return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in _get(getattr(dev(h), attr))]
        return fn

    def clock(h: int, kind: int) -> int:
        pair = dev(h).clocks
        return _get(pair[0] if kind == real.NVML_CLOCK_SM else pair[1])

    def util(h: int) -> Any:
        gpu, mem = _get(dev(h).util)
        return types.SimpleNamespace(gpu=gpu, memory=mem)

    def pcie(i: int) -> Callable[[int], int]:
        return lambda h: _get(dev(h).pcie)[i]

    fns: dict[str, Callable[..., Any]] = {
        "nvmlInit": init,
        "nvmlShutdown": lambda: nv.calls.append("shutdown"),
        "nvmlDeviceGetCount": lambda: len(devices),
        "nvmlDeviceGetHandleByIndex": lambda i: id(devices[i]),
        "nvmlDeviceGetUUID": lambda h: dev(h).uuid,
        "nvmlDeviceGetName": lambda h: _get(dev(h).name),
        "nvmlDeviceGetPciInfo": lambda h: types.SimpleNamespace(busId=dev(h).bus_id.encode()),
        "nvmlDeviceGetMemoryInfo": memory,
        "nvmlDeviceGetFieldValues": field_values,
        "nvmlDeviceGetPowerUsage": lambda h: _get(dev(h).average_mw),
        "nvmlDeviceGetTotalEnergyConsumption": energy,
        "nvmlDeviceGetTemperature": lambda h, sensor: _get(dev(h).temp_gpu),
        "nvmlDeviceGetClockInfo": clock,
        "nvmlDeviceGetUtilizationRates": util,
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: _get(dev(h).power_limit_mw),
        "nvmlDeviceGetComputeRunningProcesses": procs("compute_procs"),
        "nvmlDeviceGetGraphicsRunningProcesses": procs("graphics_procs"),
        "nvmlDeviceGetFanSpeed": lambda h: _get(dev(h).fan),
        "nvmlDeviceGetCurrPcieLinkGeneration": pcie(0),
        "nvmlDeviceGetCurrPcieLinkWidth": pcie(1),
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: _get(dev(h).reasons),
        "nvmlSystemGetDriverVersion": lambda: driver,
        "nvmlSystemGetCudaDriverVersion_v2": lambda: cuda,
        "nvmlSystemGetCudaDriverVersion": lambda: cuda,
    }
    if events_fn:
        fns["nvmlDeviceGetCurrentClocksEventReasons"] = lambda h: _get(dev(h).reasons)
    for name, fn in fns.items():
        setattr(nv, name, fn)
    return nv


class Counter:
    """An energy counter that advances by `step_mj` per read, and can be reset to `reset_to`."""

    def __init__(self, start: int = 1_000_000, step_mj: int = 100) -> None:
        self.value = start
        self.step = step_mj

    def __call__(self) -> int:
        self.value += self.step
        return self.value

    def reset(self, to: int = 0) -> None:
        self.value = to
