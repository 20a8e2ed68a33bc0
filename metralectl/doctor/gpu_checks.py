"""The GPUs through NVML (metralectl.seams.gpu): driver and CUDA, model -> hardware class, memory, and GPU memory
already held by other processes (leaked state from an earlier container)."""

from __future__ import annotations

from typing import Any

from metralectl.doctor.context import Context, Unanswered
from metralectl.doctor.host_checks import container_id_of_pid, process_name
from metralectl.doctor.model import Finding, ok, problem, skipped, warn

MIN_CUDA = "13.0"
MIN_DRIVER = "580.65.06"
LEAK_FLOOR_BYTES = 256 * 1024**2  # less than this held by others is noise (a display server, a monitor)
GiB = 1024**3  # what nvidia-smi and free(1) users read ("143771 MiB" = 140.4 GiB)


def _gpu_system(ctx: Context) -> tuple[Any | None, Finding | None]:
    """(GpuSystem, None) or (None, the finding that says why there is none)."""
    try:
        facts = ctx.gpus()
    except Unanswered as exc:
        return None, warn(f"NVML did not answer within {exc.budget_s:g} s (the driver may be initialising)",
                          "enable persistence mode (`sudo nvidia-smi -pm 1`) and check `nvidia-smi`")
    system = facts.system
    if not getattr(system, "gpus", None):
        return None, problem(f"no usable NVIDIA GPU: {system.reason}", system.hint, cause=system.cause)
    return system, None


def _version(text: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in (text or "").split("."))
    except ValueError:
        return ()


def _minimums(ctx: Context) -> tuple[str, str]:
    """The CUDA / driver floor of the images (the catalog's min-cuda / min-driver; the book says 13.0)."""
    try:
        images = list(ctx.catalog().images.values())
    except Exception:  # noqa: BLE001
        return MIN_CUDA, MIN_DRIVER
    cudas = [i.min_cuda for i in images if i.min_cuda]
    drivers = [i.min_driver for i in images if i.min_driver]
    return (max(cudas, key=_version) if cudas else MIN_CUDA), (max(drivers, key=_version) if drivers else MIN_DRIVER)


def check_driver(ctx: Context) -> Finding:
    system, why = _gpu_system(ctx)
    if system is None:
        assert why is not None
        return why
    min_cuda, min_driver = _minimums(ctx)
    driver, cuda = system.driver_version, system.cuda_driver_version
    data = {"driver_version": driver, "cuda_driver_version": cuda, "min_cuda": min_cuda, "gpus": len(system.gpus)}
    if cuda is None:
        return warn(f"NVIDIA driver {driver}; NVML did not report the CUDA driver version", **data)
    if _version(cuda) < _version(min_cuda):
        return problem(f"NVIDIA driver {driver} supports CUDA {cuda}; the engine images need a CUDA {min_cuda}+ "
                       "driver", f"upgrade the NVIDIA driver to {min_driver} or newer (CUDA {min_cuda})", **data)
    return ok(f"NVIDIA driver {driver}, CUDA {cuda} (≥ {min_cuda})", **data)


def check_model(ctx: Context) -> Finding:
    system, _ = _gpu_system(ctx)
    if system is None:
        return skipped("no GPU visible (see the driver check)")
    gpus = [{"index": g.index, "name": g.name, "hardware": g.hw_class, "uuid": g.uuid} for g in system.gpus]
    first = system.gpus[0]
    count = f"{len(gpus)} × " if len(gpus) > 1 else ""
    classes = sorted({g.hw_class or "unknown" for g in system.gpus})
    if first.hw_class is None:
        try:
            known = ", ".join(sorted(ctx.catalog().hardware))
        except Exception:  # noqa: BLE001
            known = "gb10, hopper, b200"
        return warn(f"{count}{first.name}: not a hardware class any recipe is validated for (known: {known})",
                    "recipes may still run, but nothing is validated here; `metralectl list --hardware CLASS` "
                    "judges fit against a class", gpus=gpus)
    if len(classes) > 1:
        return warn(f"mixed GPUs: {', '.join(str(g['name']) for g in gpus)}", gpus=gpus)
    return ok(f"{count}{first.name} → hardware class {first.hw_class}", hardware=first.hw_class, gpus=gpus)


def check_memory(ctx: Context) -> Finding:
    system, _ = _gpu_system(ctx)
    if system is None:
        return skipped("no GPU visible (see the driver check)")
    samples = ctx.gpus().samples
    if not samples:
        return warn("NVML gave no memory reading")
    parts, data = [], []
    for s in samples:
        m = s.memory
        data.append({"index": s.index, "kind": m.kind, "total_bytes": m.total_bytes, "available_bytes": m.available_bytes,
                     "used_bytes": m.used_bytes})
        total = f"{m.total_bytes / GiB:.1f} GiB" if m.total_bytes is not None else "? GiB"
        avail = f"{m.available_bytes / GiB:.1f} GiB" if m.available_bytes is not None else "?"
        if m.kind == "unified":
            parts.append(f"unified {total}, {avail} available (host MemTotal/MemAvailable: NVML reports GPU memory "
                         "as not supported on unified-memory GPUs)")
        else:
            parts.append(f"{total} GPU memory, {avail} free")
    prefix = [f"GPU {d['index']}: " for d in data] if len(data) > 1 else [""]
    return ok("; ".join(p + t for p, t in zip(prefix, parts)), memory=data)


def check_leaked(ctx: Context) -> Finding:
    system, _ = _gpu_system(ctx)
    if system is None:
        return skipped("no GPU visible (see the driver check)")
    samples = ctx.gpus().samples
    if not samples or all(s.processes is None for s in samples):
        return skipped("NVML does not list GPU processes here (permissions or driver)")
    try:
        ours = ctx.our_containers()
        by_pid, names = ours.pid_to_container, ours.names
    except Exception:  # noqa: BLE001 - no daemon: PIDs without container names
        by_pid, names = {}, {}
    held: dict[int, dict[str, Any]] = {}
    for s in samples:
        for p in s.processes or ():
            entry = held.setdefault(p.pid, {"pid": p.pid, "gpu": s.index, "used_bytes": None})
            if p.used_bytes is not None:
                entry["used_bytes"] = max(entry["used_bytes"] or 0, p.used_bytes)
    for pid, entry in held.items():
        entry["process"] = process_name(ctx.proc_root, pid)
        if pid in by_pid:
            entry["container"] = by_pid[pid]
            entry["ours"] = True
        else:
            cid = container_id_of_pid(ctx.proc_root, pid)
            if cid:
                entry["container"] = names.get(cid, cid[:12])
                entry["ours"] = cid in names
    others = [e for e in held.values() if not e.get("ours")]
    serving = [e for e in held.values() if e.get("ours")]
    total_others = sum(e["used_bytes"] or 0 for e in others)
    listed = [_describe(e) for e in sorted(others, key=lambda e: -(e["used_bytes"] or 0))]
    data = {"processes": sorted(held.values(), key=lambda e: e["pid"]), "held_by_others_bytes": total_others}
    note = f"; metralectl's engine holds GPU memory ({', '.join(_describe(e) for e in serving)})" if serving else ""
    if not others:
        return ok(f"no other process holds GPU memory{note}", **data)
    if total_others < LEAK_FLOOR_BYTES and all(e["used_bytes"] is not None for e in others):
        return ok(f"only {total_others / 1024**2:.0f} MiB held by others ({', '.join(listed)}){note}", **data)
    pids = " ".join(str(e["pid"]) for e in others)
    return warn(f"{total_others / GiB:.1f} GiB of GPU memory already held by {', '.join(listed)}{note}: leaked state "
                "from an earlier container makes the next start run out of memory",
                f"if these are leftovers, stop them (`docker ps` / `docker stop NAME`, or `kill {pids}`); "
                "`nvidia-smi` should show ~0 MB used before a start", **data)


def _describe(entry: dict[str, Any]) -> str:
    size = f"{entry['used_bytes'] / GiB:.1f} GiB" if entry.get("used_bytes") is not None else "? GiB"
    who = f"PID {entry['pid']}"
    if entry.get("process"):
        who += f" {entry['process']}"
    if entry.get("container"):
        who += f" in container {entry['container']}"
    return f"{who} ({size})"
