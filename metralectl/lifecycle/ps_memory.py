"""`ps`'s memory per served model: measured through NVML where the driver says, else the recipe's
estimate (labelled as one), else unknown. Never a number nobody measured or computed.

NVML reports host PIDs and what each holds; a container's host PIDs come from the daemon, so a
model's memory is what its container's processes hold (on GB10, unified memory, these per-process
figures are all NVML has; lifecycle/memory.py watches the same ones after a stop).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

MEASURED = "nvml"
ESTIMATED = "estimate"


def measured_bytes(names: Iterable[str], pids_of: Callable[[str], set[int]],
                   probe_factory: Callable[[], Any] | None = None, *, busiest_gpu: bool = False) -> dict[str, int]:
    """Bytes held on the GPU by each named container's processes, for the containers NVML accounts
    for in full; a container left out is one it cannot measure (no driver, no process of it on the GPU,
    or a process whose memory the driver would not report). `busiest_gpu`: what it holds on the one GPU where
    it holds the most (the memory budget is one GPU's; an engine spread over several holds a share on each),
    not the sum over its GPUs (what `ps` shows). On a box of one GPU the two are the same."""
    from metralectl.core.gpudata import gpu_resident_bytes

    out: dict[str, int] = {}
    for name, mine in _mine(names, pids_of, probe_factory).items():
        held = [p for _, device in mine for p in device]
        parts = [gpu_resident_bytes(device) for _, device in mine] if busiest_gpu else [gpu_resident_bytes(held)]
        if all(part is not None for part in parts):
            out[name] = max(part for part in parts if part is not None)
    return out


def measured_per_gpu(names: Iterable[str], pids_of: Callable[[str], set[int]],
                     probe_factory: Callable[[], Any] | None = None) -> dict[str, dict[int, int]]:
    """What each named container's processes hold on each GPU (NVML's device index: the order Docker's device ids
    and CUDA_DEVICE_ORDER=PCI_BUS_ID use), for the containers NVML accounts for in full (as measured_bytes)."""
    from metralectl.core.gpudata import gpu_resident_bytes

    out: dict[str, dict[int, int]] = {}
    for name, mine in _mine(names, pids_of, probe_factory).items():
        parts = {index: gpu_resident_bytes(device) for index, device in mine}
        if all(part is not None for part in parts.values()):
            out[name] = {index: part for index, part in parts.items() if part is not None}
    return out


def _mine(names: Iterable[str], pids_of: Callable[[str], set[int]],
          probe_factory: Callable[[], Any] | None) -> dict[str, list[tuple[int, list[Any]]]]:
    """Each named container's processes on each GPU where it has any (GPU index, processes), for the containers
    with a process on the GPU whose memory the driver reports."""
    from metralectl.core.gpudata import GpuUnavailable
    from metralectl.errors import MetralError

    names = list(names)
    if not names:
        return {}
    if probe_factory is None:
        from metralectl.seams.gpu import NvmlProbe

        probe_factory = NvmlProbe
    probe = probe_factory()
    try:
        if isinstance(probe.open(), GpuUnavailable):
            return {}
        devices = [(int(getattr(sample, "index", n)), list(sample.processes or ()))
                   for n, sample in enumerate(probe.sample())]
    except MetralError:  # the GPU went away mid-read: nothing measured, which ps says as such
        return {}
    finally:
        probe.close()
    out: dict[str, list[tuple[int, list[Any]]]] = {}
    if not any(device for _, device in devices):  # nothing on the GPU: no need to ask the daemon for PIDs (that
        return out  # loads docker-py)
    for name in names:
        pids = pids_of(name)
        mine = [(index, [p for p in device if p.pid in pids]) for index, device in devices]
        mine = [(index, device) for index, device in mine if device]
        if not mine or any(p.used_bytes is None for _, device in mine for p in device):
            continue
        out[name] = mine
    return out


def is_local(serving: Any) -> bool:
    """A container on this host (its PIDs are this host's): not another node's rank."""
    return serving.node in (None, "local")


def per_model(serving: Iterable[Any], measured: dict[str, int],
              estimates: dict[str, float | None]) -> list[tuple[float | None, str | None]]:
    """(GB, source) for each row, in order: measured (a container on this host), else its recipe's estimate,
    else (None, None)."""
    out: list[tuple[float | None, str | None]] = []
    for s in serving:
        if is_local(s) and s.name in measured:
            out.append((round(measured[s.name] / 1e9, 1), MEASURED))
        elif estimates.get(s.recipe) is not None:
            out.append((estimates[s.recipe], ESTIMATED))
        else:
            out.append((None, None))
    return out


def label(gb: float | None, source: str | None) -> str:
    """The MEM GB cell: `41.2` measured, `40.0 est.` from the recipe, `?` unknown."""
    if gb is None:
        return "?"
    return f"{gb:.1f}" if source == MEASURED else f"{gb:.1f} est."
