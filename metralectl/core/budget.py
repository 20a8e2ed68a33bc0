"""The box's memory budget and what each model takes of it: the rule that replaced "one model per box". Pure.

A box has a budget (GB: the GPU's memory, or a configured `budget`); every engine that runs, and every model
asked for, has a footprint (GB: its recipe's fit estimate, and for one that runs the larger of that and its
measured memory). A model may start beside what runs when the sum stays within the budget. `run` refuses with
the numbers (`short_words`); the gateway's loader evicts the least recently used idle models first
(`plan_room`). Nothing here looks at the machine: lifecycle/budget.py gathers the figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from metralectl.core.engine_profile import MemoryMeaning
from metralectl.core.fit import MemoryEstimate
from metralectl.core.placement import Holding, Placement, choose, refusal_words


@dataclass(frozen=True)
class Footprint:
    """What one model takes of the budget, in GB (None: unknown, which never fits), and how that was found."""

    name: str  # the recipe (or the engine's container name when its recipe is unknown)
    gb: float | None
    basis: str  # "estimate", "measured 1.2 GB (rss)", "unknown: ..."
    # the GPUs it holds, on a box of several (core/placement.py); None: not known, counted on every GPU. For a
    # recipe not yet started: the GPUs it will be on whatever is chosen (its own CUDA_VISIBLE_DEVICES), else None
    devices: tuple[int, ...] | None = None
    gpus: int = 0  # the GPUs a recipe's engine takes (`all`: the box's); 0: none, judged by the sum rule


@dataclass(frozen=True)
class Budget:
    gb: float | None  # None: unknown (no GPU memory known and none configured)
    basis: str  # "configured budget", "NVIDIA H200 GPU memory", ...
    gpus: int = 0  # the box's GPUs (0: none, or no driver listing): on a box of several, the budget is per GPU


@dataclass(frozen=True)
class Room:
    """Whether `new` fits beside `held` within `budget`: summed on a box of one GPU (or an unknown count), per GPU
    on the `new.gpus` least-held of a box of `budget.gpus` GPUs (core/placement.py)."""

    budget: Budget
    new: Footprint
    held: tuple[Footprint, ...]

    @property
    def placement(self) -> Placement | None:
        """The GPUs `new` would go on, where the box has several and `new` takes some; None: the sum rule."""
        if self.budget.gpus <= 1 or self.new.gpus <= 0:
            return None
        return choose(self.budget.gpus, self.budget.gb, self.holdings, self.new.gb, self.new.gpus, self.new.devices)

    @property
    def holdings(self) -> tuple[Holding, ...]:
        return holdings(self.budget.gpus, self.held)

    @property
    def used_gb(self) -> float | None:
        parts = [h.gb for h in self.held]
        return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)

    @property
    def free_gb(self) -> float | None:
        used = self.used_gb
        return None if used is None or self.budget.gb is None else self.budget.gb - used

    @property
    def fits(self) -> bool:
        placed = self.placement
        if placed is not None:
            return placed.fits
        free = self.free_gb
        return free is not None and self.new.gb is not None and self.new.gb <= free + 1e-9


def footprint_of_estimate(name: str, est: MemoryEstimate, meaning: MemoryMeaning) -> Footprint:
    """A recipe's footprint from its fit estimate. An engine that takes a fraction of the memory whatever the model
    needs (vLLM's --gpu-memory-utilization of the total, SGLang's of what the weights leave) takes that share:
    the estimate's budget when it is larger than weights + KV + reserve. Not when the engine's cache is a fixed size
    (vLLM's CPU build with VLLM_CPU_KVCACHE_SPACE): then the fraction is not what it takes."""
    total = est.total_gb
    if (meaning in ("fraction-of-total", "fraction-of-free-after-weights") and est.budget.gb is not None
            and not est.kv_pool.fixed):
        if total is None and est.known_gb > est.budget.gb:  # the weights alone exceed the share it would take
            return Footprint(name, est.known_gb, f"estimate: the weights alone, more than {est.budget.basis}")
        if total is None or est.budget.gb > total:
            return Footprint(name, est.budget.gb, f"estimate: the engine takes {est.budget.basis}")
    if total is None:
        unknown = next((p for p in (est.weights, est.kv_pool, est.reserve) if p.gb is None), None)
        return Footprint(name, None, f"unknown: {unknown.label}: {unknown.basis}" if unknown else "unknown")
    return Footprint(name, total, "estimate")


def with_measured(estimated: Footprint, measured_gb: float | None, how: str) -> Footprint:
    """A running engine's footprint: the larger of its estimate and what it was measured to hold."""
    if measured_gb is None:
        return estimated
    if estimated.gb is not None and estimated.gb >= measured_gb:
        return estimated
    return replace(estimated, gb=measured_gb, basis=f"measured ({how})")


def holdings(gpus: int, held: Sequence[Footprint]) -> tuple[Holding, ...]:
    """What runs, on the box's GPUs: one whose GPUs are unknown is counted on every one."""
    every = tuple(range(gpus))
    return tuple(Holding(h.name, h.gb, every if h.devices is None else h.devices) for h in held)


def gb(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.2f} GB"


def holders(held: Sequence[Footprint]) -> str:
    return ", ".join(f"{h.name} {gb(h.gb)}" for h in held) or "nothing"


def short_words(room: Room) -> str:
    """Why `room.new` does not fit, with the numbers: needs X, free Y of budget Z, what holds it (on a box of several
    GPUs: on which GPUs)."""
    placed = room.placement
    if placed is not None:
        return refusal_words(room.new.name, placed, room.holdings, room.budget.basis)
    if room.budget.gb is None:
        return (f"{room.new.name} cannot be placed beside what serves: this box's memory budget is unknown "
                f"({room.budget.basis})")
    if room.new.gb is None:
        return f"{room.new.name}'s memory footprint is {room.new.basis}, so it cannot be placed beside what serves"
    free = room.free_gb
    unknown = [h for h in room.held if h.gb is None]
    if free is None:
        return (f"{room.new.name} needs {gb(room.new.gb)}, but the footprint of what serves is not known: "
                + "; ".join(f"{h.name}: {h.basis}" for h in unknown)
                + f" (budget {gb(room.budget.gb)}, {room.budget.basis})")
    return (f"{room.new.name} needs {gb(room.new.gb)}, free {gb(max(free, 0.0))} of budget {gb(room.budget.gb)} "
            f"({room.budget.basis}); held by {holders(room.held)}")


@dataclass(frozen=True)
class Resident:
    """One model the gateway's loader may keep or evict."""

    name: str
    gb: float | None
    last_used: float  # monotonic time of its last request's start (0: never)
    in_flight: int = 0
    pinned: bool = False
    loading: bool = False  # being started: never evicted
    devices: tuple[int, ...] | None = None  # the GPUs it holds on a box of several (None: every one)


@dataclass(frozen=True)
class RoomPlan:
    evict: tuple[str, ...]  # idle now: stopped at once, least recently used first
    drain: tuple[str, ...]  # busy now: their requests finish first (bounded), then they are stopped


def plan_room(need_gb: float | None, budget_gb: float | None, residents: Sequence[Resident]) -> RoomPlan | None:
    """The fewest models to stop, least recently used first, so `need_gb` fits in `budget_gb` beside the rest:
    idle ones before busy ones (a busy one is drained, never killed mid-request); pinned and loading ones never.
    None: it cannot fit even with every evictable model stopped (or a figure is unknown)."""
    if need_gb is None or budget_gb is None or any(r.gb is None for r in residents):
        return None
    used = sum(r.gb for r in residents if r.gb is not None)
    free = budget_gb - used
    if need_gb <= free + 1e-9:
        return RoomPlan((), ())
    movable = [r for r in residents if not r.pinned and not r.loading]
    order = sorted(movable, key=lambda r: (r.in_flight > 0, r.last_used, r.name))
    evict: list[str] = []
    drain: list[str] = []
    for r in order:
        (drain if r.in_flight > 0 else evict).append(r.name)
        free += r.gb or 0.0
        if need_gb <= free + 1e-9:
            return RoomPlan(tuple(evict), tuple(drain))
    return None


def plan_gpus(need: Footprint, budget: Budget, residents: Sequence[Resident]) -> RoomPlan | None:
    """plan_room, on a box of several GPUs per GPU (core/placement.py): stop models in plan_room's order (least
    recently used idle first, busy ones drained, pinned and loading never) until the least-held `need.gpus` GPUs
    fit `need`, then keep any of those stopped before the last whose staying still leaves it room (never more
    stopped than needed). On a box of one GPU, or for a model that takes none: plan_room itself."""
    if budget.gpus <= 1 or need.gpus <= 0:
        return plan_room(need.gb, budget.gb, residents)
    if need.gb is None or budget.gb is None:
        return None

    def placed(kept: Sequence[Resident]) -> Placement:
        held = holdings(budget.gpus, [Footprint(r.name, r.gb, "", r.devices) for r in kept])
        return choose(budget.gpus, budget.gb, held, need.gb, need.gpus, need.devices)

    if placed(residents).fits:
        return RoomPlan((), ())
    order = sorted((r for r in residents if not r.pinned and not r.loading),
                   key=lambda r: (r.in_flight > 0, r.last_used, r.name))
    gone: list[Resident] = []
    for r in order:
        gone.append(r)
        kept = [k for k in residents if k not in gone]
        if not placed(kept).fits:
            continue
        for g in reversed(gone[:-1]):  # the last one made the room; one before it that need not go stays
            if placed([*kept, g]).fits:
                kept.append(g)
                gone.remove(g)
        return RoomPlan(tuple(g.name for g in gone if g.in_flight == 0), tuple(g.name for g in gone if g.in_flight > 0))
    return None
