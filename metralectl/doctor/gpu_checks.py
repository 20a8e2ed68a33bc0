"""The GPUs through NVML (metralectl.seams.gpu): driver and CUDA, model -> hardware class, memory, and who else
holds GPU memory: a program that is not metralectl's (in use), or metralectl's own left-overs (leaked)."""

from __future__ import annotations

from typing import Any

from metralectl.core.labels import LABEL_DOCTOR, LABEL_MANAGED, LABEL_OWNER, LABEL_PROBE, owner
from metralectl.doctor.context import Context
from metralectl.doctor.facts import Unanswered
from metralectl.doctor.host_checks import container_id_of_pid, process_name
from metralectl.doctor.model import Finding, ok, problem, skipped, warn

MIN_CUDA = "13.0"
MIN_DRIVER = "580.65.06"
NOISE_FLOOR_BYTES = 256 * 1024**2  # less than this held by others is noise (a display server, a monitor)
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


def _recorded_containers() -> dict[str, str]:
    """Container ids metralectl's state files name (multi-rank deployments), with what each was for."""
    from metralectl.lifecycle.deployment import load_all

    try:
        return {r.container_id: f"{d.recipe} rank {r.rank}" for d in load_all() for r in d.ranks if r.container_id}
    except Exception:  # noqa: BLE001 - an unreadable state dir: nothing recorded to compare with
        return {}


def _ours(labels: dict[str, str]) -> bool:
    """A container metralectl started for this user: an engine (managed, our owner) or a helper (probe, doctor)."""
    if labels.get(LABEL_MANAGED) == "true":
        return labels.get(LABEL_OWNER) == owner()
    return LABEL_DOCTOR in labels or (LABEL_PROBE in labels and labels.get(LABEL_OWNER) in (None, owner()))


def _classify(ctx: Context, entry: dict[str, Any], serving: dict[int, str], recorded: dict[str, str]) -> None:
    """entry["kind"]: serving (metralectl's engine, or this doctor's own GPU probe), leaked (metralectl's own
    left-over: a container of ours that exited or that no state knows, a recorded container that is gone
    while its process still holds memory) or other (a live program that is not metralectl's)."""
    pid = entry["pid"]
    if pid in serving:
        entry.update(container=serving[pid], kind="serving", ours=True)
        return
    cid = container_id_of_pid(ctx.proc_root, pid)
    if cid is None:
        entry.update(kind="other", ours=False)
        return
    try:
        info = ctx.container(cid)
        known = True
    except Exception:  # noqa: BLE001 - no daemon: the container cannot be named or judged
        info, known = None, False
    if info is None:
        entry["container"] = cid[:12]
        if cid in recorded:  # a state file names it, the daemon no longer knows it: its process outlived it
            entry.update(kind="leaked", ours=True, why=f"its container ({recorded[cid]}) is gone")
        else:
            entry.update(kind="other", ours=False, why="a container the daemon does not know" if known else None)
        return
    entry["container"] = info.name
    if not _ours(info.labels):
        other_owner = info.labels.get(LABEL_OWNER) if info.labels.get(LABEL_MANAGED) == "true" else None
        entry.update(kind="other", ours=False, why=f"metralectl's engine of user {other_owner}" if other_owner else None)
    elif not info.running:
        state = "exited" if info.status == "exited" else f"is {info.status}"
        entry.update(kind="leaked", ours=True, why=f"its container {state}", remove=info.name)
    elif LABEL_DOCTOR in info.labels:
        entry.update(kind="serving", ours=True)  # this run's own GPU probe (docker.gpu-request), removed after it
    elif info.labels.get(LABEL_MANAGED) != "true":
        entry.update(kind="leaked", ours=True, why="a helper container no state knows", remove=info.name)
    else:
        entry.update(kind="serving", ours=True)


def _left_for_a_start(samples: Any) -> str:
    parts = []
    for s in samples:
        m = s.memory
        if m.available_bytes is not None and m.total_bytes is not None:
            where = f"GPU {s.index}: " if len(samples) > 1 else ""
            parts.append(f"{where}{m.available_bytes / GiB:.1f} of {m.total_bytes / GiB:.1f} GiB")
    return f"{'; '.join(parts)} left for a start" if parts else "the rest is left for a start"


def check_in_use(ctx: Context) -> Finding:
    """Who holds GPU memory: metralectl's engine (fine), a program that is not metralectl's (in use: the
    memory it leaves for a start), or metralectl's own left-overs (leaked: remove them)."""
    system, _ = _gpu_system(ctx)
    if system is None:
        return skipped("no GPU visible (see the driver check)")
    samples = ctx.gpus().samples
    if not samples or all(s.processes is None for s in samples):
        return skipped("NVML does not list GPU processes here (permissions or driver)")
    try:
        serving = ctx.our_containers().pid_to_container
    except Exception:  # noqa: BLE001 - no daemon: PIDs without container names
        serving = {}
    held: dict[int, dict[str, Any]] = {}
    for s in samples:
        for p in s.processes or ():
            entry = held.setdefault(p.pid, {"pid": p.pid, "gpu": s.index, "used_bytes": None})
            if p.used_bytes is not None:
                entry["used_bytes"] = max(entry["used_bytes"] or 0, p.used_bytes)
    recorded = _recorded_containers()
    for entry in held.values():
        entry["process"] = process_name(ctx.proc_root, entry["pid"])
        entry["command"] = _command(ctx.proc_root, entry["pid"])
        _classify(ctx, entry, serving, recorded)
    by_kind = {kind: sorted((e for e in held.values() if e["kind"] == kind), key=lambda e: -(e["used_bytes"] or 0))
               for kind in ("serving", "leaked", "other")}
    in_use = sum(e["used_bytes"] or 0 for e in by_kind["other"])
    leaked = sum(e["used_bytes"] or 0 for e in by_kind["leaked"])
    data = {"processes": sorted(held.values(), key=lambda e: e["pid"]), "in_use_by_others_bytes": in_use,
            "leaked_bytes": leaked}
    note = (f"; metralectl's engine holds GPU memory ({', '.join(_describe(e) for e in by_kind['serving'])})"
            if by_kind["serving"] else "")
    others = ", ".join(_describe(e) for e in by_kind["other"])
    sized = all(e["used_bytes"] is not None for e in by_kind["other"] + by_kind["leaked"])
    if not by_kind["other"] and not by_kind["leaked"]:
        return ok(f"no other process holds GPU memory{note}", **data)
    if not by_kind["leaked"] and in_use < NOISE_FLOOR_BYTES and sized:
        return ok(f"only {in_use / 1024**2:.0f} MiB in use by others ({others}){note}", **data)
    sentences, remedies = [], []
    if by_kind["leaked"]:
        sentences.append(f"{leaked / GiB:.1f} GiB of GPU memory leaked by metralectl's own left-overs: "
                         + ", ".join(f"{_describe(e)}: {e['why']}" for e in by_kind["leaked"]))
        names = [e["remove"] for e in by_kind["leaked"] if e.get("remove")]
        pids = [str(e["pid"]) for e in by_kind["leaked"] if not e.get("remove")]
        if names:
            remedies.append(f"docker rm -f {' '.join(names)}")
        if pids:
            remedies.append(f"kill {' '.join(pids)} (its container is gone; if it stays, the driver holds it: reboot)")
    if by_kind["other"]:
        sentences.append(f"{in_use / GiB:.1f} GiB in use by {others}, not metralectl's: {_left_for_a_start(samples)}")
        remedies.append("if a recipe needs that memory, stop that program yourself (doctor leaves it alone), or pick a "
                        "recipe that fits (`metralectl list`)")
    return warn("; ".join(sentences) + note, "; ".join(remedies), **data)


def _command(proc_root: Any, pid: int) -> str | None:
    """The process's command line, escaped and capped (it is another program's text)."""
    from metralectl.safetext import clean

    try:
        raw = (proc_root / str(pid) / "cmdline").read_bytes()[:4096]
    except OSError:
        return None
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", errors="replace")
    return clean(text, 120) if text else None


def _describe(entry: dict[str, Any]) -> str:
    size = f"{entry['used_bytes'] / GiB:.1f} GiB" if entry.get("used_bytes") is not None else "? GiB"
    who = f"PID {entry['pid']}"
    if entry.get("process"):
        who += f" {entry['process']}"
    if entry.get("container"):
        who += f" in container {entry['container']}"
    detail = [size]
    if entry.get("kind") == "other" and entry.get("why"):
        detail.insert(0, entry["why"])
    if entry.get("kind") == "other" and entry.get("command"):
        detail.insert(0, f"`{entry['command']}`")
    return f"{who} ({', '.join(detail)})"
