"""The gateway's CPUs of its own, and its engines kept off them (docs/gateway.md, "Cores of its own").

Why: on a box whose engines also run on the CPU (llama-server's HTTP threads and sampling, a vLLM's scheduler),
the kernel puts an engine thread that the gateway's own write just woke on the gateway's CPU and preempts it:
on a lent H100 at 64 streams, ~240 times a second, 55 ms of every second spent runnable and waiting, and the
gateway's own time per request at p99 went from 0.12 ms to 1.4-2.3 ms. With the gateway on CPUs of its own and the
engines kept off them, that tail was gone.

`pin` is the gateway's (`metralectl gateway --cpus`, box.yaml's `gateway-cpus`): its process on those CPUs only.
`for_engines` is every launch's (lifecycle/placing.py): the CPUs an engine may use, this process's CPUs as it
started (a pinned gateway's loads must not inherit its few) less the gateway's.
"""

from __future__ import annotations

import os

_before: list[frozenset[int]] = []  # this process's CPUs before pin(), once it pinned
_reserved: list[frozenset[int]] = []  # the CPUs pin() took for the gateway


def usable() -> frozenset[int] | None:
    """The CPUs this process may run on; None where the OS cannot say (not Linux)."""
    if _before:
        return _before[0]
    getter = getattr(os, "sched_getaffinity", None)
    return frozenset(getter(0)) if getter is not None else None


def check(cpus: frozenset[int]) -> str | None:
    """Why `cpus` cannot be the gateway's (None: they can): CPUs this process may not use, or all of them (the
    engines would have none left)."""
    allowed = usable()
    if allowed is None:
        return "this system sets no CPU affinity (Linux only)"
    outside = cpus - allowed
    if outside:
        from metralectl.core.cpulist import render

        return f"CPU {render(outside)} is not one this process may use (it may use {render(allowed)})"
    if cpus >= allowed:
        from metralectl.core.cpulist import render

        return f"{render(cpus)} is every CPU this process may use ({render(allowed)}): none would be left for engines"
    return None


def pin(cpus: frozenset[int]) -> None:
    """This process (the gateway, before its threads start) on `cpus` only; check() first. Engines this process
    starts later get the others (for_engines)."""
    allowed = usable()
    assert allowed is not None and check(cpus) is None
    os.sched_setaffinity(0, cpus)
    _before[:] = [allowed]
    _reserved[:] = [cpus]


def for_engines(configured: frozenset[int] = frozenset()) -> tuple[int, ...] | None:
    """The CPUs an engine started now may use: this process's (as it started) less the gateway's (box.yaml's
    gateway-cpus, `configured`, and this process's own pin()). None: nothing to keep off (no gateway CPUs, none of
    them usable here, or they would leave none)."""
    allowed = usable()
    if allowed is None:
        return None
    keep_off = (configured | (_reserved[0] if _reserved else frozenset())) & allowed
    rest = allowed - keep_off
    if not keep_off or not rest:
        return None
    return tuple(sorted(rest))


def apply(pid: int, cpus: tuple[int, ...] | None) -> None:
    """A started process (a host engine's supervisor, before it starts the engine) on `cpus`; nothing for None."""
    if cpus is not None:
        os.sched_setaffinity(pid, cpus)
