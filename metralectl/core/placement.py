"""Which of a multi-GPU box's GPUs a new engine goes on, and whether it fits there. Pure.

The budget is one GPU's memory (lifecycle/budget.box_budget) and a footprint is what an engine holds on each
of its GPUs (core/fit divides an engine spread over tensor × pipeline parallel GPUs). On a box of several GPUs
each engine holds its own devices (the `gpu-ids` label, core/labels.py), so a new engine needing N GPUs is
judged on the N that hold least: each must keep held + need within the budget. The least-held N are the best
any choice can do (a fit on any other N would fit on these), so when they do not fit, nothing does. A box of
one GPU (or of an unknown count) keeps the sum rule of core/budget.Room.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from metralectl.wording import count as counted

SLACK_GB = 1e-9  # float sums: 0.1 + 0.2 fits in 0.3


@dataclass(frozen=True)
class Holding:
    """One running engine on the box's GPUs: what it holds on each (GB; None unknown) and which it holds."""

    name: str
    gb: float | None
    devices: tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    """The GPUs chosen for a new engine (its need per GPU, `count` of them) on a box of `gpus` GPUs."""

    gpus: int
    budget_gb: float | None
    need_gb: float | None
    count: int
    chosen: tuple[int, ...]  # ascending; empty when the box has fewer GPUs than the engine needs
    held: tuple[float | None, ...]  # per GPU index: what runs holds there (None: a holder's footprint is unknown)
    fixed: bool = False  # the engine's own GPUs (its CUDA_VISIBLE_DEVICES), not a choice

    @property
    def fits(self) -> bool:
        if self.budget_gb is None or self.need_gb is None or len(self.chosen) != self.count:
            return False
        return all(self.held[i] is not None and (self.held[i] or 0.0) + self.need_gb <= self.budget_gb + SLACK_GB
                   for i in self.chosen)


def held_per_gpu(gpus: int, holdings: Sequence[Holding]) -> tuple[float | None, ...]:
    """What each GPU holds: the sum of its holders' footprints; unknown when any of them is."""
    held: list[float | None] = [0.0] * gpus
    for h in holdings:
        for i in set(h.devices):
            if 0 <= i < gpus:
                before = held[i]
                held[i] = None if before is None or h.gb is None else before + h.gb
    return tuple(held)


def choose(gpus: int, budget_gb: float | None, holdings: Sequence[Holding], need_gb: float | None,
           count: int, fixed: tuple[int, ...] | None = None) -> Placement:
    """The `count` GPUs holding least (ties: the lower index; an unknown holding counts as the most); `fixed`: the
    GPUs the engine will be on whatever is chosen (a host process whose recipe sets CUDA_VISIBLE_DEVICES), judged
    as they are."""
    held = held_per_gpu(gpus, holdings)
    if fixed is not None:
        inside = all(0 <= i < gpus for i in fixed)
        return Placement(gpus, budget_gb, need_gb, len(fixed), tuple(sorted(set(fixed))) if inside else (), held,
                         fixed=True)
    order = sorted(range(gpus), key=lambda i: (held[i] is None, held[i] or 0.0, i))
    chosen = tuple(sorted(order[:count])) if 0 < count <= gpus else ()
    return Placement(gpus, budget_gb, need_gb, count, chosen, held)


def parse_ids(text: str | None, gpus: int) -> tuple[int, ...] | None:
    """A `gpu-ids` label read back ("1,3"): distinct non-negative decimal indices below `gpus`, else None (the
    label is another program's text, or a box that changed: the caller falls back to what an unlabelled engine
    holds)."""
    if not text or len(text) > 200:
        return None
    out: list[int] = []
    for part in text.split(","):
        if not (part.isascii() and part.isdigit()) or len(part) > 4:
            return None
        index = int(part)
        if index >= gpus or index in out:
            return None
        out.append(index)
    return tuple(out)


def ids_text(ids: Sequence[int]) -> str:
    """The label's value and CUDA_VISIBLE_DEVICES's: "1,3"."""
    return ",".join(str(i) for i in ids)


def devices_held(setting: str | int, gpus: int, label: str | None, *, accelerator: bool = True) -> tuple[int, ...]:
    """The GPUs an engine of `resources.gpus: setting` holds on a box of `gpus`: `all` every one, `none` (or a class
    without an accelerator) none, a count the ids its label names, else the first ones (what Docker's count and an
    older metralectl gave it)."""
    if not accelerator or setting == "none" or gpus <= 0:
        return ()
    if setting == "all" or not isinstance(setting, int):
        return tuple(range(gpus))
    ids = parse_ids(label, gpus)
    return ids if ids is not None and len(ids) == setting else tuple(range(min(setting, gpus)))


def _gb(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.2f} GB"


def refusal_words(name: str, placement: Placement, holdings: Sequence[Holding], budget_basis: str) -> str:
    """Why `name` fits on no `count` of the box's GPUs, with the numbers: its need per GPU, and what the least held
    of them hold and who holds it."""
    p = placement
    if p.budget_gb is None:
        return f"{name} cannot be placed beside what serves: this box's memory budget is unknown ({budget_basis})"
    if p.need_gb is None:
        return f"{name}'s memory footprint per GPU is unknown, so it cannot be placed beside what serves"
    if not p.chosen:
        return f"{name} needs {counted(p.count, 'GPU')}; this box has {counted(p.gpus, 'GPU')}"

    def who(i: int) -> str:
        names = [f"{h.name} {_gb(h.gb)}" for h in holdings if i in h.devices]
        return ", ".join(names) or "nothing"

    on = f"each of {p.count}" if p.count > 1 else "1"
    gpus = "; ".join(f"GPU {i}: free {_gb(None if p.held[i] is None else max(p.budget_gb - (p.held[i] or 0.0), 0.0))}"
                     f" (held by {who(i)})" for i in p.chosen)
    which = "its own CUDA_VISIBLE_DEVICES do not fit" if p.fixed else "not even the least held fit"
    return (f"{name} needs {_gb(p.need_gb)} on {on} of this box's {counted(p.gpus, 'GPU')}, and {which} "
            f"(budget {_gb(p.budget_gb)} per GPU, {budget_basis}): {gpus}")
