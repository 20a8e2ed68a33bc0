"""A benchmark campaign's plan: its units, their expected durations, and who may take what (pure).

Scheduling is longest-first list scheduling: whenever a node is free it takes the longest remaining unit
it may run (within 4/3 of the optimal makespan), with the same rule at plan time (`--dry-run`'s makespan)
and at run time. Among equals, a unit whose group (the shards of one entry) already has a unit on that
node yields to one that has not, so losing a node costs one shard of a group, not all of it.

Speed-class units (the suites whose numbers compare across runs: decode, sweeps, TTFT, rates, long
decodes) are bundled on one reference node (which takes them before anything else: no other node may), even when the nodes look equivalent at rest: two
"identical" boxes differed by 6.6-13 % J/token and 0.66 tok/s under load. The reference is the one
named, else the node with the most free memory, then the coolest. Correctness units spread over all.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from metralectl.errors import MetralError

SPEED_SUITES = frozenset({"decode", "concurrency-sweep", "ttft-prefix", "long-decode", "rate"})
STARTUP_S = 5.0  # a unit's fixed cost: the child starts, sizes prompts, warms the connection pool


@dataclass(frozen=True)
class PlannedUnit:
    id: str  # unique in the campaign: the entry's id, plus "-s<i>of<n>" for a shard
    suite: str
    params: dict[str, str] = field(default_factory=dict)  # KEY -> VALUE text
    gates: tuple[str, ...] = ()
    recipe: str | None = None
    expected_s: float = 60.0
    group: str = ""  # the entry it came from (its shards share it)

    @property
    def speed(self) -> bool:
        return self.suite in SPEED_SUITES

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "suite": self.suite, "params": dict(self.params), "gates": list(self.gates),
                "recipe": self.recipe, "expected_s": round(self.expected_s, 1), "group": self.group,
                "speed": self.speed}


def estimate_s(suite: str, params: Mapping[str, Any]) -> float:
    """A unit's expected wall time from its schema-parsed parameters (a planning estimate, refined from
    history when a completed run of the same shape exists)."""
    p = params
    if suite == "decode":
        per = p["max_tokens"] / 60.0 + 0.2  # ~60 tok/s as a conservative single-stream rate
        return STARTUP_S + (p["repeats"] + p["warmup"]) * per
    if suite == "concurrency-sweep":
        i, n = _shard(p.get("shard", "0/1"))
        rungs = len(p["concurrencies"]) * len(p["isls"]) * len(p["osl"])
        mine = len([k for k in range(rungs) if k % n == i])
        return STARTUP_S + mine * (p["duration_s"] + p["warmup_s"] + 2.0)
    if suite == "ttft-prefix":
        return STARTUP_S + p["repeats"] * 2 * (p["isl"] / 2000.0 + p["osl"] / 60.0 + 0.3)
    if suite == "long-decode":
        return STARTUP_S + p["repeats"] * (p["osl"] / 60.0 + 0.5) / max(1, p["concurrency"])
    if suite == "tool-call":
        return STARTUP_S + p["repeats"] * (p["max_tokens"] / 60.0 + 0.2) / max(1, p["concurrency"])
    if suite == "rate":
        rates = p["max_rates"] if p["rates"] == "auto" else len(p["rates"])  # auto: at most max_rates
        return STARTUP_S + rates * (p["duration_s"] + p["warmup_s"] + 2.0)
    if suite == "shared-prefix":
        return STARTUP_S + len(p["users"]) * (p["duration_s"] + p["warmup_s"] + 2.0)
    if suite == "multi-turn":
        return STARTUP_S + p["turns"] * (p["osl"] / 60.0 + 1.0)
    if suite == "trace":
        return STARTUP_S + 120.0  # the trace's own span, unknown until it is read
    if suite == "depth":
        per = 2 if p["prefix_cache"] else 1
        return STARTUP_S + sum(per * (p["runs"] + p["warmup"]) * ((p["pp"] + d) / 2000.0 + p["tg"] / 60.0 + 0.3)
                               for d in p["depths"])
    return STARTUP_S + 60.0


def _shard(text: str) -> tuple[int, int]:
    i, _, n = str(text).partition("/")
    return (int(i), int(n)) if i.isdigit() and n.isdigit() and int(n) > 0 else (0, 1)


@dataclass(frozen=True)
class NodeFacts:
    """What planning needs to know of an admitted node."""

    name: str  # as the operator spelled it (an address)
    free_memory_gb: float | None = None
    temp_c: float | None = None


def choose_reference(nodes: Sequence[NodeFacts], named: str | None) -> tuple[str, str]:
    """(the node that hosts every speed-class unit, why). A named reference must be admitted."""
    if not nodes:
        raise MetralError("no node is admitted: nothing to run the campaign on", "`metralectl bench nodes ADDR...` says why")
    if named is not None:
        if named not in {n.name for n in nodes}:
            raise MetralError(f"the reference node {named} is not among the admitted nodes "
                              f"({', '.join(n.name for n in nodes)})",
                              "name one of --node as --reference, or fix its admission; nothing falls back to another box")
        return named, "named with --reference"
    if len(nodes) == 1:
        return nodes[0].name, "the only admitted node"
    best = sorted(nodes, key=lambda n: (-(n.free_memory_gb or 0.0), n.temp_c if n.temp_c is not None else 1e9, n.name))[0]
    facts = [f"{best.free_memory_gb:.0f} GB free" if best.free_memory_gb is not None else "free memory unknown",
             f"{best.temp_c:.0f} °C" if best.temp_c is not None else "temperature unknown"]
    return best.name, f"most free memory, then coolest ({', '.join(facts)})"


def may_run(unit: PlannedUnit, node: str, reference: str) -> bool:
    return not unit.speed or node == reference


def pick(pending: Iterable[PlannedUnit], node: str, reference: str, groups_on_node: set[str],
         excluded: Mapping[str, set[str]] | None = None) -> PlannedUnit | None:
    """The unit a free node takes: the longest it may run; among equals one whose group it has not got.
    The reference takes speed-class units first: nobody else may run them, while others can take the rest."""
    excluded = excluded or {}
    candidates = [u for u in pending if may_run(u, node, reference) and node not in excluded.get(u.id, set())]
    if not candidates:
        return None
    return min(candidates, key=lambda u: (node == reference and not u.speed, -u.expected_s,
                                          u.group in groups_on_node, u.id))


@dataclass(frozen=True)
class Plan:
    reference: str
    reference_why: str
    queues: dict[str, list[str]]  # node -> unit ids, in the order it takes them
    finish_s: dict[str, float]  # node -> when its last unit ends (simulated)
    unassigned: list[str]  # units no admitted node may run

    @property
    def makespan_s(self) -> float:
        return max(self.finish_s.values(), default=0.0)

    def to_json(self) -> dict[str, Any]:
        return {"reference": self.reference, "reference_why": self.reference_why, "queues": self.queues,
                "finish_s": {k: round(v, 1) for k, v in self.finish_s.items()},
                "makespan_s": round(self.makespan_s, 1), "unassigned": self.unassigned}


def simulate(units: Sequence[PlannedUnit], nodes: Sequence[NodeFacts], reference: str, why: str = "") -> Plan:
    """The run-time rule played out with expected durations: every free node takes its pick."""
    pending = list(units)
    free_at = [(0.0, k, n.name) for k, n in enumerate(nodes)]
    heapq.heapify(free_at)
    queues: dict[str, list[str]] = {n.name: [] for n in nodes}
    groups: dict[str, set[str]] = {n.name: set() for n in nodes}
    finish = {n.name: 0.0 for n in nodes}
    idle: list[tuple[float, int, str]] = []
    while pending and free_at:
        t, k, name = heapq.heappop(free_at)
        unit = pick(pending, name, reference, groups[name])
        if unit is None:
            idle.append((t, k, name))  # nothing it may run now; since nothing returns in a plan, nothing later
            continue
        pending.remove(unit)
        queues[name].append(unit.id)
        groups[name].add(unit.group)
        finish[name] = t + unit.expected_s
        heapq.heappush(free_at, (finish[name], k, name))
    return Plan(reference, why, queues, finish, [u.id for u in pending])


def expand(entry_id: str, suite: str, params: dict[str, str], shards: int, **kw: Any) -> list[PlannedUnit]:
    """One plan entry as units: itself, or `shards` units with `shard=i/n` (a suite that takes it)."""
    base = PlannedUnit(entry_id, suite, dict(params), group=entry_id, **kw)
    if shards <= 1:
        return [base]
    return [replace(base, id=f"{entry_id}-s{i}of{shards}", params={**params, "shard": f"{i}/{shards}"})
            for i in range(shards)]
