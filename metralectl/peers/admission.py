"""Is this node admitted for benchmark units? Every check with its reason, so a refusal says why.

The checks (SPEC §6): bench enabled, the requester granted `bench`, a hardware class, a signer
identity, not busy (the lifecycle lock), nothing queued, memory and disk above bench.yaml's floors,
a GPU it can name. Every fact comes from an injectable source (`Facts`); the defaults are the real
seams (NvmlProbe, psutil, shutil.disk_usage, store.lock_holder).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from metralectl import paths
from metralectl.peers.config import BenchConfig
from metralectl.wording import count

GB = 1e9


@dataclass(frozen=True)
class GpuFact:
    name: str | None  # None: no GPU could be named
    hw_class: str | None = None
    reason: str | None = None  # why not, when name is None
    hint: str | None = None


@dataclass(frozen=True)
class AdmissionCheck:
    id: str
    ok: bool
    detail: str
    remedy: str | None = None


@dataclass(frozen=True)
class Admission:
    admitted: bool
    fingerprint: str
    name: str
    hardware_class: str | None
    gpu: str | None
    checks: list[AdmissionCheck] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)  # memory_available_gb, disk_free_gb (planning uses them)

    @property
    def reasons(self) -> list[AdmissionCheck]:
        return [c for c in self.checks if not c.ok]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["checks"] = [asdict(c) for c in self.checks]
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Admission:
        checks = [AdmissionCheck(str(c["id"]), bool(c["ok"]), str(c["detail"]), c.get("remedy"))
                  for c in raw.get("checks", [])]
        given = raw.get("facts")
        facts: dict[str, Any] = given if isinstance(given, dict) else {}
        return cls(bool(raw["admitted"]), str(raw["fingerprint"]), str(raw.get("name", "")),
                   raw.get("hardware_class"), raw.get("gpu"), checks, dict(facts))


def probe_gpu() -> GpuFact:
    """The real GPU fact: the first GPU NVML can name, with its hardware class."""
    from metralectl.seams.gpu import NvmlProbe
    from metralectl.core.gpudata import GpuUnavailable

    probe = NvmlProbe()
    try:
        system = probe.open()
        if isinstance(system, GpuUnavailable):
            return GpuFact(None, None, system.reason, system.hint)
        named = [g for g in system.gpus if g.name]
        if not named:
            return GpuFact(None, None, "NVML lists no GPU with a name", "check `nvidia-smi`")
        return GpuFact(named[0].name, named[0].hw_class)
    except Exception as exc:  # noqa: BLE001 - a probe that breaks is a refusal reason, not a crash
        return GpuFact(None, None, f"the GPU probe failed: {exc}", "check `nvidia-smi`")
    finally:
        try:
            probe.close()
        except Exception:  # noqa: BLE001 - closing a half-open probe
            pass


def probe_thermal() -> dict[str, Any]:
    """The node's hottest GPU and the driver's clock reasons, for a campaign's thermal parking.
    {"temp_c": None, "reason": ...} when no GPU can be read (such a node is never parked)."""
    from metralectl.seams.gpu import NvmlProbe
    from metralectl.core.gpudata import GpuUnavailable

    probe = NvmlProbe()
    try:
        system = probe.open()
        if isinstance(system, GpuUnavailable):
            return {"temp_c": None, "clock_reasons": None, "reason": system.reason}
        samples = probe.sample(detail=True)
    except Exception as exc:  # noqa: BLE001 - an unreadable sensor is an answer, not a crash
        return {"temp_c": None, "clock_reasons": None, "reason": f"the GPU probe failed: {exc}"}
    finally:
        try:
            probe.close()
        except Exception:  # noqa: BLE001 - closing a half-open probe
            pass
    temps = [float(t) for s in samples for t in (s.temp_gpu_c, s.temp_mem_c) if t is not None]
    reasons = sorted({r for s in samples for r in (s.clock_reasons or ())})
    known = any(s.clock_reasons is not None for s in samples)
    return {"temp_c": max(temps) if temps else None, "clock_reasons": reasons if known else None,
            "reason": None if temps else "the GPUs report no temperature",
            "gpus": [{"index": s.index, "temp_gpu_c": s.temp_gpu_c, "temp_mem_c": s.temp_mem_c} for s in samples]}


def available_memory() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - unknown is a value here
        return None


def free_disk(path: Path) -> int | None:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent  # the cache may not exist yet: the disk it would land on
    try:
        return int(shutil.disk_usage(probe).free)
    except OSError:
        return None


def lifecycle_busy() -> str | None:
    """What holds the lifecycle lock, unless it is a peer's benchmark unit (the queue check counts those)."""
    from metralectl.seams.store import UNIT_HOLDER, lock_holder

    holder = lock_holder()
    return None if holder is None or holder.startswith(UNIT_HOLDER) else holder


@dataclass
class Facts:
    gpu: Callable[[], GpuFact] = probe_gpu
    busy: Callable[[], str | None] = lifecycle_busy  # what holds the lifecycle lock (None: nothing)
    queued: Callable[[], int] = lambda: 0  # units queued elsewhere (the node adds its own unit queue)
    memory: Callable[[], int | None] = available_memory
    disk: Callable[[Path], int | None] = free_disk
    thermal: Callable[[], dict[str, Any]] = probe_thermal


def judge(config: BenchConfig, *, fingerprint: str, name: str, facts: Facts,
          requester_grants: tuple[str, ...] | None = None, config_path: Path | None = None,
          queued: int = 0) -> Admission:
    """The admission answer. requester_grants None: asked locally (no grant needed); queued: this node's
    own units waiting or running (added to what facts.queued says)."""
    where = paths.display(config_path) if config_path else "bench.yaml"
    checks: list[AdmissionCheck] = []
    add = checks.append
    if config.enabled:
        add(AdmissionCheck("bench.enabled", True, "bench is enabled"))
    else:
        add(AdmissionCheck("bench.enabled", False, "bench is not enabled on this node" +
                           ("" if config.exists else f" (no {where})"),
                           "on that node: `metralectl peer bench-config --enable`"))
    if requester_grants is not None:
        if "bench" in requester_grants:
            add(AdmissionCheck("grant", True, "you are granted bench here"))
        else:
            add(AdmissionCheck("grant", False, "this node has not granted you bench",
                               "on that node: `metralectl peer grant-bench <your fingerprint from `metralectl id`>`"))
    gpu = facts.gpu()
    hw = config.hardware_class or gpu.hw_class
    if hw:
        how = "bench.yaml" if config.hardware_class else f"detected from {gpu.name}"
        add(AdmissionCheck("hardware_class", True, f"hardware class {hw} ({how})"))
    else:
        add(AdmissionCheck("hardware_class", False, "no hardware class: none set and none detected",
                           "set `hardware_class:` in bench.yaml (`metralectl peer bench-config --hardware-class gb10`)"))
    add(AdmissionCheck("signer", True, f"signs records as {fingerprint}"))
    holder = facts.busy()
    if holder:
        add(AdmissionCheck("busy", False, f"busy: {holder} holds the lifecycle lock", "try again when it has finished"))
    else:
        add(AdmissionCheck("busy", True, "not busy"))
    queued += facts.queued()
    add(AdmissionCheck("queue", queued == 0, "nothing queued" if queued == 0 else f"{count(queued, 'unit')} queued or running",
                       None if queued == 0 else "try again when the queue has drained"))
    mem = facts.memory()
    if mem is None:
        add(AdmissionCheck("memory", False, "available memory unknown", "check /proc/meminfo"))
    else:
        ok = mem >= config.memory_floor_gb * GB
        add(AdmissionCheck("memory", ok, f"{mem / GB:.1f} GB available, floor {config.memory_floor_gb:g} GB",
                           None if ok else "stop what holds memory (`metralectl ps`), or lower floors.memory_gb"))
    disk_path = config.resolved_disk_path()
    free = facts.disk(disk_path)
    if free is None:
        add(AdmissionCheck("disk", False, f"free disk under {paths.display(disk_path)} unknown", "check the path"))
    else:
        ok = free >= config.disk_floor_gb * GB
        add(AdmissionCheck("disk", ok, f"{free / GB:.1f} GB free under {paths.display(disk_path)}, "
                           f"floor {config.disk_floor_gb:g} GB",
                           None if ok else "free disk space (old weights: `metralectl` cache tools), or lower floors.disk_gb"))
    if gpu.name:
        add(AdmissionCheck("gpu", True, f"GPU {gpu.name}"))
    else:
        add(AdmissionCheck("gpu", False, f"no GPU it can name: {gpu.reason or 'unknown'}", gpu.hint))
    facts_out = {"memory_available_gb": None if mem is None else round(mem / GB, 2),
                 "disk_free_gb": None if free is None else round(free / GB, 2)}
    return Admission(all(c.ok for c in checks), fingerprint, name, hw, gpu.name, checks, facts_out)
