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
    from metralectl.core.gpudata import GpuUnavailable, gpu_resident_bytes
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
        devices = [list(sample.processes or ()) for sample in probe.sample()]
    except MetralError:  # the GPU went away mid-read: nothing measured, which ps says as such
        return {}
    finally:
        probe.close()
    out: dict[str, int] = {}
    if not any(devices):  # nothing on the GPU: no need to ask the daemon for PIDs (that loads docker-py)
        return out
    for name in names:
        pids = pids_of(name)
        mine = [[p for p in device if p.pid in pids] for device in devices]
        held = [p for device in mine for p in device]
        if not held or any(p.used_bytes is None for p in held):
            continue
        parts = [gpu_resident_bytes(device) for device in mine if device] if busiest_gpu else [gpu_resident_bytes(held)]
        if all(part is not None for part in parts):
            out[name] = max(part for part in parts if part is not None)
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
