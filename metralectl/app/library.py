"""The recipe library as rows: what `list`, the TUI's Library view and the agent all show."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from metralectl.seams import machine
from metralectl.seams.hf import state as hfstate
from metralectl.core.catalog import Catalog
from metralectl.core.fit import MemoryEstimate, estimate, parallel_sizes
from metralectl.core.hardware import HardwareClass
from metralectl.core.recipe import Recipe

if TYPE_CHECKING:
    from metralectl.lifecycle.launch import LaunchOptions
    from metralectl.lifecycle.preflight import Refusal
    from metralectl.seams.docker.protocol import ContainerRuntime


@dataclass(frozen=True)
class Target:
    """The hardware class recipes are judged against, and how it was chosen."""

    hardware: str | None
    how: str  # "--hardware", "detected <gpu name>", or "none detected"
    gpu_name: str | None = None
    gpus_seen: tuple[str, ...] = ()  # what the driver lists (none: no NVIDIA GPU on this box)
    nodes: int = 1  # `list` judges one box; a multi-node recipe spans others (`run --worker`)
    host_ram_gb: float | None = None  # this box's RAM: the budget of a class without an accelerator
    cpu_arch: str | None = None  # this box's CPU architecture (what a class without an accelerator is judged on)


@dataclass(frozen=True)
class LibraryRow:
    name: str
    engine: str  # the engine's short name, as the recipe's `engine:` says (engine/<name>.yaml)
    model: str
    repo: str
    quant: str
    hardware: str
    mtp: bool
    validated_tok_s: float | None
    memory_gb: float | None
    budget_gb: float | None
    fits: bool | None  # on the target; None = unknown
    fits_reason: str
    weights: str  # complete | present | partial | absent
    source: str  # shipped | shipped (book) | synced bNN | user
    source_path: str
    overrides: str | None
    tags: tuple[str, ...]
    description: str
    image: str = ""  # the image ref the recipe runs
    image_availability: str = ""  # pulled, or built from source (and whether the engine certifies it)
    image_pullable: bool = True
    nodes: int = 1  # the machines the recipe's ranks run on

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def choose_target(catalog: Catalog, hardware: str | None) -> Target:
    ram, arch = machine.host_memory_gb(), machine.cpu_arch()
    if hardware:
        return Target(hardware, "--hardware", host_ram_gb=ram, cpu_arch=arch)
    names = machine.gpu_names()
    found = machine.classify(names, catalog.hardware.values())
    if found:
        return Target(found, f"detected {names[0]}", names[0], tuple(names), host_ram_gb=ram, cpu_arch=arch)
    return Target(None, f"none detected ({', '.join(names) or 'no NVIDIA GPU'})", None, tuple(names),
                  host_ram_gb=ram, cpu_arch=arch)


def _judge(recipe: Recipe, hardware: HardwareClass, target: Target, est: MemoryEstimate,
           spread: int = 1) -> tuple[bool | None, str]:
    """FITS on this box: every fact that rules the recipe out is named; `?` only when no fact does and the
    memory estimate (or this box's class) is unknown. A class without an accelerator runs on any box of its CPU
    architecture, whatever GPU it has (or none): judged on that and on this box's RAM only."""
    against: list[str] = []
    nodes = recipe.resources.nodes
    if nodes > target.nodes:
        against.append(f"needs {nodes} nodes, this is one box (`run --worker` spans them)")
    if not hardware.has_accelerator:
        if target.cpu_arch and target.cpu_arch != hardware.cpu_arch:
            against.append(f"built for {hardware.cpu_arch} CPUs, this box is {target.cpu_arch}")
        if est.fits is False:
            against.append(_memory_reason(est) or "the memory estimate exceeds this box's RAM")
        if against:
            return False, "; ".join(against)
        if est.fits is None:
            unknown = next((p for p in (est.weights, est.kv_pool, est.budget) if p.gb is None), None)
            return None, f"memory estimate unknown ({unknown.label}: {unknown.basis})" if unknown else "unknown"
        return True, f"{_memory_reason(est)} of this box's RAM, on the CPU"
    if target.hardware and target.hardware != recipe.hardware:
        against.append(f"built for {recipe.hardware}, this is {target.hardware}")
    elif target.hardware is None and not target.gpus_seen:
        against.append(f"built for {recipe.hardware}, and this box has no NVIDIA GPU")
    if 0 < len(target.gpus_seen) < spread:  # tensor × pipeline parallel over more GPUs than this box has
        against.append(f"spreads the model over {spread} GPUs, this box has {len(target.gpus_seen)}")
    if est.fits is False:
        against.append(_memory_reason(est) or "the memory estimate exceeds the budget")
    if against:
        return False, "; ".join(against)
    if target.hardware is None:
        return None, f"this box's GPU ({target.gpus_seen[0]}) is none of the known classes"
    if est.fits is None:
        unknown = next((p for p in (est.weights, est.kv_pool, est.budget) if p.gb is None), None)
        why = f" ({unknown.label}: {unknown.basis})" if unknown else ""
        return None, f"memory estimate unknown{why}"
    return True, _memory_reason(est)


def _memory_reason(est: MemoryEstimate) -> str:
    total, budget = est.total_gb, est.budget.gb
    if total is None and est.fits is False and budget:
        return f"the weights alone {est.known_gb:.1f} of {budget:.1f} GB"
    return f"{total:.1f} of {budget:.1f} GB" if total is not None and budget else ""


def row(catalog: Catalog, recipe: Recipe, target: Target) -> LibraryRow:
    model = catalog.model_of(recipe)
    hardware = catalog.hardware[recipe.hardware]
    est: MemoryEstimate = estimate(recipe, model, hardware,
                                   target.gpu_name if target.hardware == recipe.hardware else None,
                                   catalog.engines[recipe.engine].memory_meaning, host_ram_gb=target.host_ram_gb,
                                   roles=catalog.engines[recipe.engine].fit_roles)
    tp, pp = parallel_sizes(recipe.serve, catalog.engines[recipe.engine].fit_roles)
    fits, reason = _judge(recipe, hardware, target, est, tp * pp)
    cache = hfstate.checkpoint_state(recipe.checkpoint)
    image = catalog.image_for(recipe)
    return LibraryRow(
        name=recipe.name, engine=recipe.engine, model=model.display_name, repo=recipe.checkpoint.repo, quant=recipe.checkpoint.quant,
        hardware=recipe.hardware, mtp=recipe.mtp, validated_tok_s=recipe.validated.decode_tok_s,
        memory_gb=est.total_gb, budget_gb=est.budget.gb, fits=fits, nodes=recipe.resources.nodes,
        fits_reason=reason, weights=cache.status,
        source=_source(recipe), source_path=recipe.origin.path, overrides=recipe.origin.overrides,
        tags=recipe.tags, description=recipe.description, image=image.ref, image_availability=image.availability(),
        image_pullable=image.pullable,
    )


def _source(recipe: Recipe) -> str:
    """shipped | shipped (book) | synced bNN | user"""
    origin = recipe.origin
    if origin.kind == "synced":
        return f"synced {origin.release}"
    if origin.kind == "shipped" and recipe.source == "book":
        return "shipped (book)"
    return origin.kind


def rows(catalog: Catalog, target: Target, *, hardware: str | None = None, tags: list[str] | None = None) -> list[LibraryRow]:
    out = []
    for recipe in sorted(catalog.recipes.values(), key=lambda r: r.name):
        if hardware and recipe.hardware != hardware:
            continue
        if tags and not all(t in recipe.tags for t in tags):
            continue
        out.append(row(catalog, recipe, target))
    return out


def blocked(catalog: Catalog, names: list[str], runtime: ContainerRuntime, options: LaunchOptions) -> dict[str, Refusal]:
    """Why Run/Swap of each recipe cannot go on this box whatever serves (lifecycle.preflight.standing_refusal,
    the words the launch itself would say), with the launch options of the front end asking: the dashboard's
    (it never pulls: a missing image or weights is `p` first) or the agent's (it pulls). Absent: it may go."""
    from metralectl.lifecycle.preflight import observe_staging, standing_refusal

    out: dict[str, Refusal] = {}
    for name in names:
        recipe = catalog.recipes[name]
        refused = standing_refusal(recipe, options, observe_staging(recipe, catalog, runtime))
        if refused is not None:
            out[name] = refused
    return out
