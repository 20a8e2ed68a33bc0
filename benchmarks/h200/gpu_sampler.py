"""GPU memory as NVML reads it, sampled on a thread for the lifecycle run (lifecycle_gpu.py).

`GpuSampler.open()` answers a sampler, or one whose `why_not` says plainly why there is none ("no GPU:
…"): no pynvml, no driver, no device. The lifecycle still runs then; every memory figure is None and the
run says "no GPU", never a number nobody read.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

MIB = 1 << 20


@dataclass(frozen=True)
class Sample:
    t: float  # time.time()
    used_mib: float


class GpuSampler:
    def __init__(self, nvml: Any = None, handle: Any = None, why_not: str = "", name: str = "",
                 total_mib: float | None = None, interval_s: float = 0.05) -> None:
        self.nvml, self.handle, self.why_not = nvml, handle, why_not
        self.name, self.total_mib, self.interval_s = name, total_mib, interval_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @classmethod
    def open(cls, index: int = 0, interval_s: float = 0.05) -> GpuSampler:
        try:
            import pynvml
        except ImportError as exc:
            return cls(why_not=f"no GPU: pynvml is not installed ({exc})")
        try:
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            total = pynvml.nvmlDeviceGetMemoryInfo(handle).total / MIB
        except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, _NotFound, ...
            return cls(why_not=f"no GPU: NVML cannot be read here ({type(exc).__name__}: {exc})")
        return cls(pynvml, handle, "", name.decode() if isinstance(name, bytes) else str(name), total, interval_s)

    @property
    def present(self) -> bool:
        return self.nvml is not None

    def used_mib(self) -> float | None:
        if not self.present:
            return None
        return float(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used) / MIB

    def processes(self) -> list[dict[str, Any]]:
        """NVML's compute processes on the GPU: pid and memory (MiB; None where the driver does not say)."""
        if not self.present:
            return []
        try:
            procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        except Exception as exc:  # noqa: BLE001 - an old driver without the call: say so in the record
            return [{"error": f"{type(exc).__name__}: {exc}"}]
        return [{"pid": p.pid, "used_mib": None if p.usedGpuMemory is None else round(p.usedGpuMemory / MIB, 1)}
                for p in procs]

    def start(self) -> None:
        if not self.present:
            return
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                used = self.used_mib()
            except Exception:  # noqa: BLE001 - one failed read is a gap in the series, not the end of it
                used = None
            if used is not None:
                with self._lock:
                    self.samples.append(Sample(time.time(), round(used, 1)))
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.present:
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down a library that is going away anyway
                pass

    def between(self, t0: float, t1: float) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples if t0 <= s.t <= t1]

    def snapshot(self) -> list[Sample]:
        with self._lock:
            return list(self.samples)

    def describe(self) -> dict[str, Any]:
        return {"present": self.present, "why_not": self.why_not or None, "name": self.name or None,
                "total_mib": None if self.total_mib is None else round(self.total_mib, 1),
                "interval_s": self.interval_s}
