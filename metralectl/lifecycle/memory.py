"""After a stop: did the GPU memory come back? (Leaked GPU state is the usual cause of a failed next start.)

NVML reports host PIDs, so we note the container's PIDs (a host process: its process group's) before stopping
it and wait, after, until none of them holds GPU memory. No NVML is said plainly ("no GPU here"), never a
pass. On GB10 (unified memory, no NVML device memory) the per-process figures are what there is, which is
why we watch processes rather than a device total.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from metralectl import cancel
from metralectl.seams.docker.containers import ContainerInfo
from metralectl.seams.docker.protocol import ContainerRuntime
from metralectl.seams.docker.runtime import container_pids

WAIT_S = 20.0


class MemoryWatch(Protocol):
    def before(self, container: ContainerInfo) -> None: ...

    def after(self, container: ContainerInfo) -> str: ...


class NoMemoryWatch:
    def before(self, container: ContainerInfo) -> None:
        pass

    def after(self, container: ContainerInfo) -> str:
        return "not checked"


class NvmlMemoryWatch:
    """Watches the stopped container's processes leave the GPU, through the NVML seam."""

    def __init__(self, runtime: ContainerRuntime, wait_s: float = WAIT_S, probe_factory: Callable[[], Any] | None = None,
                 poll_s: float = 0.5) -> None:
        self.runtime = runtime
        self.wait_s = wait_s
        self.poll_s = poll_s
        self._probe_factory = probe_factory
        self._pids: dict[str, set[int]] = {}

    def before(self, container: ContainerInfo) -> None:
        self._pids[container.id] = container_pids(self.runtime, container.id)

    def after(self, container: ContainerInfo) -> str:
        from metralectl.seams.gpu import NvmlProbe
        from metralectl.core.gpudata import GpuUnavailable

        pids = self._pids.pop(container.id, set())
        probe = self._probe_factory() if self._probe_factory else NvmlProbe()
        system = probe.open()
        if isinstance(system, GpuUnavailable):  # said plainly: nothing was checked, so nothing passed
            gpu_less = system.cause == "LibraryNotFound" or "sees no GPU" in system.reason
            return f"not checked: {'no GPU here' if gpu_less else 'NVML cannot be read here'} ({system.reason})"
        if not pids:  # no process of it was known before the stop: "none holds memory" would prove nothing
            probe.close()
            return "not checked (its processes were not known before the stop)"
        try:
            deadline = time.monotonic() + self.wait_s
            while True:
                held = {p.pid: p.used_bytes or 0 for s in probe.sample() for p in (s.processes or ()) if p.pid in pids}
                if not held:
                    return "returned"
                if time.monotonic() > deadline:
                    return (f"still held: {sum(held.values()) / 1e9:.1f} GB by PIDs {sorted(held)} {self.wait_s:g} s "
                            "after the stop (`metralectl doctor` lists GPU processes)")
                cancel.sleep(self.poll_s)  # the stop's wait: a cancel ends it (the container is gone already)
        finally:
            probe.close()
