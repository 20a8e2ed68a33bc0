"""Where a new engine goes on this box's GPUs (core/placement.py judges; lifecycle/budget.py gathers the figures):
the GPUs that hold least, on a box of several. Every start goes through `place` (run, swap, a rollback, the
gateway's loads: they all start through launch.start_and_wait), and `run --print` shows the same choice.

A box of one GPU, of an unknown count, or a recipe of `gpus: all`/`none`: nothing is placed, the spec stays as
rendered (Docker's count, a host process's first devices), exactly as before placement existed.
Every start is also kept off the gateway's own CPUs where box.yaml names them (`gateway-cpus`, seams/affinity.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from metralectl.core.render import ContainerSpec, placed

if TYPE_CHECKING:
    from metralectl.core.catalog import Catalog
    from metralectl.core.recipe import Recipe
    from metralectl.seams.docker.protocol import ContainerRuntime


def placement_for(catalog: Catalog, recipe: Recipe, runtime: ContainerRuntime,
                  budget_gb: float | None = None) -> tuple[int, ...] | None:
    """The GPUs a new engine of `recipe` goes on: the least held (the first ones when nothing of ours runs); None
    where nothing is placed."""
    from metralectl.lifecycle.budget import box_gpus, gpus_needed, room_for

    if recipe.resources.gpus == "all" or recipe.multi_rank:
        return None
    box = box_gpus()
    need = gpus_needed(catalog, recipe, box)
    if box <= 1 or not 0 < need <= box:
        return None
    running = [c for c in runtime.containers() if c.running]
    if not running:
        return tuple(range(need))
    placement = room_for(catalog, recipe, runtime, running, budget_gb).placement
    return placement.chosen if placement is not None and placement.chosen else None


def place(catalog: Catalog, recipe: Recipe, runtime: ContainerRuntime, spec: ContainerSpec,
          budget_gb: float | None = None) -> ContainerSpec:
    """spec on the GPUs placement_for chooses (unchanged where nothing is placed), kept off the gateway's CPUs."""
    if spec.gpu_ids is None:
        spec = placed(spec, recipe, placement_for(catalog, recipe, runtime, budget_gb))
    return spec if recipe.multi_rank else off_gateway_cpus(spec)  # ranks on other nodes: not this box's CPUs


def off_gateway_cpus(spec: ContainerSpec) -> ContainerSpec:
    """spec on this box's CPUs less the gateway's own (box.yaml's gateway-cpus, and this process's if it is a
    gateway pinned with --cpus: seams/affinity.py); unchanged where there are none to keep off."""
    from dataclasses import replace

    from metralectl.lifecycle.budget import box_config
    from metralectl.seams import affinity

    if spec.cpu_ids is not None:
        return spec
    cpus = affinity.for_engines(box_config().gateway_cpus)
    return spec if cpus is None else replace(spec, cpu_ids=cpus)


def place_for_print(catalog: Catalog, recipe: Recipe, spec: ContainerSpec) -> ContainerSpec:
    """`run --print`'s spec on the GPUs `run` would choose now; as rendered when what runs cannot be looked at
    (no daemon, no host process recorded): --print never fails for want of Docker."""
    from metralectl.errors import MetralError
    from metralectl.lifecycle.budget import box_gpus

    if recipe.multi_rank:
        return spec
    if box_gpus() <= 1 or recipe.resources.gpus in ("all", "none"):
        return off_gateway_cpus(spec)  # nothing to place: no runtime opened
    from metralectl.lifecycle.local_runtime import open_local

    try:
        with open_local(need_docker=False, timeout=5.0) as runtime:
            return place(catalog, recipe, runtime, spec)
    except (MetralError, OSError):
        return off_gateway_cpus(spec)
