"""What this machine is, cheaply (no NVML): CPU architecture and the GPU names the driver lists.

`list` runs this on every call, so it reads a few /proc files and nothing else; doctor and
telemetry use NVML for the full picture.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from metralectl.core.hardware import HardwareClass

_DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")
_MEMINFO = Path("/proc/meminfo")


def cpu_arch() -> str:
    import platform

    machine = platform.machine().lower()
    return {"arm64": "aarch64", "amd64": "x86_64"}.get(machine, machine)


def host_memory_gb(meminfo: Path = _MEMINFO) -> float | None:
    """This machine's RAM (MemTotal), in GB; None when /proc/meminfo cannot be read."""
    try:
        text = meminfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                return int(fields[1]) * 1024 / 1e9  # the kernel writes kB meaning KiB
    return None


def gpu_names(root: Path = _DRIVER_GPUS) -> list[str]:
    """GPU model names from the NVIDIA driver's /proc entries (empty without a driver)."""
    names = []
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return []
    for entry in entries:
        try:
            text = (entry / "information").read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Model:"):
                names.append(line.split(":", 1)[1].strip())
    return names


def classify(names: Iterable[str], classes: Iterable[HardwareClass]) -> str | None:
    """The hardware class whose gpu-names match a GPU of this machine."""
    classes = list(classes)
    for name in names:
        for hw in classes:
            if any(pattern.lower() in name.lower() for pattern in hw.gpu_names):
                return hw.id
    return None


def peak_rss_mib(pids: Iterable[int], proc: Path = Path("/proc")) -> float | None:
    """The sum of the processes' resident-set high-water marks (VmHWM: the most each held since it started), in
    MiB; None when none could be read. An upper bound of the group's peak: each process's peak, not their peak at
    one moment."""
    total, seen = 0, False
    for pid in pids:
        try:
            text = (proc / str(pid) / "status").read_text(errors="replace")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        for line in text.splitlines():
            if line.startswith("VmHWM:"):
                fields = line.split()
                if len(fields) >= 2 and fields[1].isdigit():
                    total, seen = total + int(fields[1]), True
    return round(total / 1024, 1) if seen else None
