"""CPU lists as Linux writes them (`0-3,8,10-11`, taskset -c and /proc's Cpus_allowed_list): parsed strictly, since
one comes from box.yaml or a command line and becomes a CPU affinity (seams/affinity.py)."""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_CPU = 4095  # Linux's NR_CPUS at its largest in common kernels; a bound on what one list may name
_ITEM = re.compile(r"([0-9]{1,4})(?:-([0-9]{1,4}))?")  # ASCII digits only (\d takes any script's)


def parse(text: str) -> frozenset[int]:
    """The CPUs `text` names; ValueError saying what is wrong (an empty list, a malformed item, a range backwards,
    a CPU past MAX_CPU)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("an empty CPU list (write CPUs as 0-3,8)")
    cpus: set[int] = set()
    for item in text.strip().split(","):
        match = _ITEM.fullmatch(item.strip())
        if match is None:
            raise ValueError(f"{item.strip()[:40]!r} is not a CPU or a range of them (write CPUs as 0-3,8)")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise ValueError(f"{item.strip()!r}: a range runs from the lower CPU to the higher")
        if last > MAX_CPU:
            raise ValueError(f"{item.strip()!r}: CPU {last} is past {MAX_CPU}")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def render(cpus: Iterable[int]) -> str:
    """The shortest list naming `cpus` (`0-3,8`), as parse() reads it."""
    ordered = sorted(set(cpus))
    out: list[str] = []
    start = prev = None
    for cpu in ordered:
        if prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            out.append(f"{start}-{prev}" if prev != start else f"{start}")
        start = prev = cpu
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(out)
