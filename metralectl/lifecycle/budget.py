"""The figures core/budget.py judges, gathered on this machine: the box's budget (configured, else the GPU's memory,
else the host's RAM less what the OS keeps), each recipe's footprint (its fit estimate) and each running engine's
(the larger of its recipe's estimate and its measured memory: NVML's per-process bytes, else its processes' RSS).

The configured budget is `<config dir>/box.yaml`'s `budget:` (GB; a number, e.g. `budget: 24` or `budget: 1.5`),
or `--budget GB` where a command takes it (run, gateway); `pin:` there lists the recipes the gateway never evicts;
`gateway-cpus:` (a CPU list, `14-15`) the CPUs the gateway runs on and every engine keeps off (seams/affinity.py);
`gateway-busy-poll:` (milliseconds) how long the gateway's loop stays awake after each read (gateway/busy.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metralectl import paths
from metralectl.core.budget import Budget, Footprint, Room, footprint_of_estimate, with_measured
from metralectl.errors import MetralError, RecipeInvalid

if TYPE_CHECKING:
    from metralectl.core.catalog import Catalog
    from metralectl.core.recipe import Recipe
    from metralectl.seams.docker.containers import ContainerInfo
    from metralectl.seams.docker.protocol import ContainerRuntime

CONFIG_FILE = "box.yaml"
BUSY_POLL_MAX_MS = 10_000.0  # longer is a mistake, not a setting: 10 s of a core flat out after each read
KEYS = ("budget", "pin", "gateway-cpus", "gateway-busy-poll")


@dataclass(frozen=True)
class BoxConfig:
    budget_gb: float | None = None
    pin: tuple[str, ...] = ()
    gateway_cpus: frozenset[int] = frozenset()
    gateway_busy_poll_ms: float = 0.0


def config_path() -> Path:
    return paths.config_dir() / CONFIG_FILE


def box_config() -> BoxConfig:
    """box.yaml, checked like a recipe (an unknown key or a budget that is no positive number: refused by line)."""
    from metralectl.core.schema import Checker
    from metralectl.core.yamlsrc import YamlSyntax, load_file

    path = config_path()
    if not path.exists():
        return BoxConfig()
    try:
        doc = load_file(path, paths.display(path))
    except YamlSyntax as exc:
        raise RecipeInvalid([exc.problem]) from None
    check = Checker(doc)
    top = check.mapping(doc.data if doc.data is not None else {}, (), CONFIG_FILE)
    check.known_keys(top, (), KEYS, CONFIG_FILE)
    budget = check.number(top, (), "budget", required=False, nullable=True, minimum=0)
    pin = check.string_list(top, (), "pin")
    cpus = _gateway_cpus(check, top)
    busy_ms = check.number(top, (), "gateway-busy-poll", required=False, nullable=True, minimum=0)
    if busy_ms is not None and busy_ms > BUSY_POLL_MAX_MS:  # (.nan and .inf: refused as the YAML is read)
        check.error(("gateway-busy-poll",), f"must be at most {BUSY_POLL_MAX_MS:g} (milliseconds), not {busy_ms}",
                    "e.g. `gateway-busy-poll: 50` (the gateway's loop awake 50 ms after each read), or 0 for off")
        busy_ms = None
    if not check.ok:
        raise RecipeInvalid(check.problems)
    return BoxConfig(float(budget) if budget is not None else None, tuple(pin), cpus, float(busy_ms or 0))


def _gateway_cpus(check: Any, top: dict[str, Any]) -> frozenset[int]:
    """box.yaml's gateway-cpus: a CPU list (`"14-15"`, `7`), refused by line when it is not one."""
    from metralectl.core.cpulist import parse

    value = top.get("gateway-cpus")
    if value is None:
        return frozenset()
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        check.error(("gateway-cpus",), f"must be a CPU list, not {type(value).__name__}",
                    'write it as `gateway-cpus: "14-15"` (the CPUs the gateway runs on, the engines keep off)')
        return frozenset()
    try:
        return parse(str(value))
    except ValueError as bad:
        check.error(("gateway-cpus",), str(bad), 'e.g. `gateway-cpus: "14-15"`')
        return frozenset()


def box_budget(catalog: Catalog, override_gb: float | None = None) -> Budget:
    """`override_gb` (--budget), else box.yaml's budget, else the first GPU's memory (its hardware class's SKU),
    else this machine's RAM less what the OS keeps (fit.os_headroom_gb). On a box of several GPUs (`gpus`), each
    has this budget (core/placement.py)."""
    from metralectl.core.fit import os_headroom_gb
    from metralectl.seams import machine

    names = machine.gpu_names()
    if override_gb is not None:
        return Budget(override_gb, "--budget", len(names))
    configured = box_config().budget_gb
    if configured is not None:
        return Budget(configured, f"budget in {paths.display(config_path())}", len(names))
    if names:
        for hw in catalog.hardware.values():
            for sku in hw.skus:
                if sku.total_gb and sku.match.lower() in names[0].lower():
                    return Budget(sku.total_gb, f"{names[0]} memory", len(names))
        return Budget(None, f"the memory of {names[0]} is not in the hardware data; set `budget:` in "
                            f"{paths.display(config_path())}", len(names))
    ram = machine.host_memory_gb()
    if ram is None:
        return Budget(None, f"no GPU, and /proc/meminfo unreadable; set `budget:` in {paths.display(config_path())}")
    kept = os_headroom_gb(ram)
    return Budget(max(ram - kept, 0.0), f"{ram:.1f} GB host RAM − {kept:.1f} GB kept for the OS")


def recipe_footprint(catalog: Catalog, recipe: Recipe) -> Footprint:
    """The recipe's fit estimate on this machine, as `metralectl fit`/`list` compute it (per GPU), with the GPUs it
    takes on this box."""
    from metralectl.core.fit import estimate
    from metralectl.errors import MetralError
    from metralectl.seams import machine

    names = machine.gpu_names()
    gpus = gpus_needed(catalog, recipe, len(names))
    own = own_devices(recipe, len(names)) if gpus and len(names) > 1 else None
    try:
        hardware = catalog.hardware[recipe.hardware]
        ram = machine.host_memory_gb() if hardware.host_memory else None
        meaning = catalog.engines[recipe.engine].memory_meaning
        est = estimate(recipe, catalog.model_of(recipe), hardware, names[0] if names else None, meaning,
                       host_ram_gb=ram, roles=catalog.engines[recipe.engine].fit_roles)
    except (KeyError, MetralError) as exc:
        return Footprint(recipe.name, None, f"unknown: {exc}", own, gpus)
    return replace(footprint_of_estimate(recipe.name, est, meaning), devices=own, gpus=gpus)


def own_devices(recipe: Recipe, box: int) -> tuple[int, ...] | None:
    """The GPUs a host process whose recipe sets CUDA_VISIBLE_DEVICES itself is on (its env wins over placement):
    indices only, read strictly (a UUID or anything else: None, placed as any other)."""
    from metralectl.core.placement import parse_ids

    if recipe.runtime != "process" or "CUDA_VISIBLE_DEVICES" not in recipe.env:
        return None
    return parse_ids(recipe.env["CUDA_VISIBLE_DEVICES"], box)


def served_recipe(catalog: Catalog, container: ContainerInfo) -> Recipe | None:
    """The recipe a running engine was started from, with its --set overrides (None: no longer in the catalog)."""
    from metralectl.core.labels import LABEL_RECIPE, LABEL_SETS
    from metralectl.core.overrides import apply_sets
    from metralectl.errors import MetralError

    name = container.labels.get(LABEL_RECIPE)
    if not name:
        return None
    sets = [s for s in container.labels.get(LABEL_SETS, "").split("\x1f") if s]
    try:
        return apply_sets(catalog, catalog.recipe(name), sets)
    except MetralError:
        return None


def rss_bytes(pids: set[int]) -> int | None:
    """The resident memory of these processes (VmRSS), None when none could be read."""
    total, seen = 0, False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
                for line in handle:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        seen = True
                        break
        except (OSError, ValueError, IndexError):
            continue
    return total if seen else None


def running_footprints(catalog: Catalog, runtime: ContainerRuntime,
                       running: Sequence[ContainerInfo], box_gpus: int = 0) -> list[Footprint]:
    """Each running engine's footprint: the larger of its recipe's estimate and its measured memory. On a box of
    several GPUs (`box_gpus`), also the GPUs it holds: those its gpu-ids label names (else the first ones, as an
    engine started before placement holds) and every one NVML sees it on."""
    from metralectl.core.labels import LABEL_RECIPE
    from metralectl.errors import MetralError
    from metralectl.lifecycle.ps_memory import measured_bytes, measured_per_gpu

    per_gpu: dict[str, dict[int, int]] = {}
    try:
        if box_gpus > 1 and running:
            per_gpu = measured_per_gpu([c.name for c in running], runtime.container_pids)
            gpu = {name: max(held.values()) for name, held in per_gpu.items() if held}
        else:
            gpu = measured_bytes([c.name for c in running], runtime.container_pids, busiest_gpu=True) if running else {}
    except (MetralError, OSError):
        gpu = {}
    out = []
    for c in running:
        recipe = served_recipe(catalog, c)
        name = c.labels.get(LABEL_RECIPE, c.name)
        est = recipe_footprint(catalog, recipe) if recipe is not None else Footprint(name, None, "unknown recipe")
        if box_gpus > 1:
            est = replace(est, devices=_devices(catalog, recipe, c, box_gpus, per_gpu.get(c.name, {})))
        if c.name in gpu:
            out.append(with_measured(est, gpu[c.name] / 1e9, "NVML"))
            continue
        try:
            rss = rss_bytes(runtime.container_pids(c.id))
        except (MetralError, OSError):
            rss = None
        out.append(with_measured(est, rss / 1e9 if rss is not None else None, "RSS"))
    return out


def _devices(catalog: Catalog, recipe: Recipe | None, container: ContainerInfo, box_gpus: int,
             seen: dict[int, int]) -> tuple[int, ...] | None:
    """The GPUs a running engine holds (None: unknown, counted on every GPU): its label's (core/placement.py reads
    it strictly), with every GPU NVML sees it on. One whose recipe is unknown and that has no label: every GPU."""
    from metralectl.core.labels import LABEL_GPU_IDS
    from metralectl.core.placement import devices_held, parse_ids

    label = container.labels.get(LABEL_GPU_IDS)
    if recipe is None:
        labelled = parse_ids(label, box_gpus)
        return None if labelled is None else tuple(sorted(set(labelled) | {i for i in seen if 0 <= i < box_gpus}))
    hardware = catalog.hardware.get(recipe.hardware)
    own = own_devices(recipe, box_gpus)
    held = own if own is not None else devices_held(recipe.resources.gpus, box_gpus, label,
                                                   accelerator=hardware is None or hardware.has_accelerator)
    return tuple(sorted(set(held) | {i for i in seen if 0 <= i < box_gpus}))


def box_gpus() -> int:
    """This box's GPUs, as the driver lists them (0: none, or no driver)."""
    from metralectl.seams import machine

    return len(machine.gpu_names())


def gpus_needed(catalog: Catalog, recipe: Recipe, box: int) -> int:
    """The GPUs `recipe` takes on a box of `box`: `all` every one, `none` (or a class without an accelerator) none."""
    hardware = catalog.hardware.get(recipe.hardware)
    setting = recipe.resources.gpus
    if setting == "none" or (hardware is not None and not hardware.has_accelerator):
        return 0
    return box if setting == "all" or not isinstance(setting, int) else setting


def room_for(catalog: Catalog, recipe: Recipe, runtime: ContainerRuntime, running: Sequence[ContainerInfo],
             budget_gb: float | None = None) -> Room:
    """Whether `recipe` fits beside `running`: per GPU, on the GPUs that hold least, on a box of several."""
    budget = box_budget(catalog, budget_gb)
    return Room(budget, recipe_footprint(catalog, recipe),
                tuple(running_footprints(catalog, runtime, running, budget.gpus)))


def free_port(bind: str, taken: set[int], start: int) -> int:
    """The first port from `start` up that no engine of ours claims and nothing listens on."""
    from metralectl.seams.ports import port_free

    port = start
    while port < 65535:
        if port not in taken and port_free(bind, port):
            return port
        port += 1
    raise MetralError(f"no free port above {start} on {bind}", "stop a model, or `--set resources.port=N`")

