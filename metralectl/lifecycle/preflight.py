"""What can refuse a launch or a swap, decided in one place from what was observed.

`observe()` looks (the image, the weights cache, the containers, the port) and changes nothing;
`launch_refusal()` and `swap_refusal()` are pure: the facts and the options in, the first refusal
out. `launch.preflight()` and `swap.swap()` raise what they answer before staging anything; the
dashboard's confirmation (tui/plans.py) shows the same answer before the operator says yes, so a plan
never promises what the launch would refuse, nor refuses what it would do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from metralectl.seams.ports import port_free  # the one bind probe (doctor uses it too)
from metralectl.core.labels import LABEL_OWNER, LABEL_RANK, LABEL_RECIPE, LABEL_SPEC_HASH
from metralectl.core.render import ContainerSpec, owner
from metralectl.errors import MetralError, NotServed
from metralectl.core.budget import Room, short_words
from metralectl.wording import count

if TYPE_CHECKING:
    from metralectl.core.catalog import Catalog
    from metralectl.core.recipe import Recipe
    from metralectl.lifecycle.launch import LaunchOptions
    from metralectl.seams.docker.containers import ContainerInfo
    from metralectl.seams.docker.images import ImageState
    from metralectl.seams.docker.protocol import ContainerRuntime
@dataclass(frozen=True)
class Facts:
    """What a launch's refusals depend on, observed once."""

    image: ImageState | None  # None: not looked at (Docker unreachable)
    image_error: MetralError | None  # what images.image_preflight says of the image as it is now
    image_pullable: bool  # absent, and a pull would bring it (not built from source, the platform fits)
    weights_status: str  # cache_state: complete | present | partial | absent; or conflict (weights.ServingConflict)
    weights_error: MetralError | None  # what weights.weights_preflight says of the cache as it is now
    same_name: ContainerInfo | None  # a container holding the name the recipe renders to
    others: tuple[ContainerInfo, ...]  # another user's models that run
    running: tuple[ContainerInfo, ...]  # ours that run
    port_free: bool | None = None  # None: not probed
    room: Room | None = None  # whether the recipe fits beside what runs (lifecycle/budget.py); None: not judged
    spread: int = 1  # the GPUs the engine spreads the model over (tensor × pipeline parallel)
    spread_words: str = ""  # how the serve settings say it: "tensor-parallel-size 4 × pipeline-parallel-size 1"
    spread_flag: str = ""  # the tensor-parallel flag: the one to lower
    gpus_seen: int = 0  # this box's GPUs, looked at only when spread > 1 (0: none seen)


@dataclass(frozen=True)
class Refusal:
    error: MetralError
    fix: str | None = None  # "pull-image"/"pull-weights": staging would fix it; "swap": a model is served;
    # "run": nothing is served to swap (run it instead)


def observe(recipe: Recipe, catalog: Catalog, runtime: ContainerRuntime, spec: ContainerSpec, *,
            cpu_arch: str | None = None, probe_port: bool = False, budget_gb: float | None = None) -> Facts:
    """Look at everything the refusals need; change nothing."""
    staged = observe_staging(recipe, catalog, runtime, cpu_arch=cpu_arch)
    others = tuple(c for c in runtime.containers(mine=False) if c.running and c.owner != owner())
    running = tuple(c for c in runtime.containers() if c.running)
    free = port_free(spec.bind, spec.port) if probe_port and not running else None
    room = None
    if running and not recipe.multi_rank:
        from metralectl.lifecycle.budget import room_for

        room = room_for(catalog, recipe, runtime, running, budget_gb)
    return replace(staged, same_name=runtime.inspect(spec.name), others=others, running=running, port_free=free,
                   room=room)


def observe_staging(recipe: Recipe, catalog: Catalog, runtime: ContainerRuntime, *,
                    cpu_arch: str | None = None) -> Facts:
    """The image and the weights only (no container is looked at): what refuses this recipe on this box
    whatever serves (standing_refusal)."""
    from metralectl.core import images
    from metralectl.seams.docker import images as docker_images
    from metralectl.seams import machine
    from metralectl.seams.hf import state as hfstate, weights

    if recipe.runtime == "process":
        state, image_error, pullable = _program_state(recipe, catalog)
    else:
        info = catalog.image_for(recipe)
        state = runtime.image_state(info.ref, info.revision_label)
        arch = cpu_arch or machine.cpu_arch()
        image_error = images.check_platform(state, info, arch)
        pullable = image_error is None and not state.present and info.build is None
        if image_error is None:
            try:
                docker_images.image_preflight(info, runtime, arch, recipe.name)
            except MetralError as exc:
                image_error = exc
    cache = hfstate.checkpoint_state(recipe.checkpoint)
    weights_status = cache.status
    weights_error: MetralError | None = None
    if cache.status != "complete" or recipe.checkpoint.format == "gguf":  # GGUF: also what llama-server would load
        try:
            weights.weights_preflight(recipe)
        except weights.ServingConflict as exc:
            weights_status, weights_error = "conflict", exc
        except MetralError as exc:
            weights_error = exc
    spread, words, flag, seen = 1, "", "", 0
    hardware = catalog.hardware.get(recipe.hardware)
    if hardware is not None and hardware.has_accelerator:
        from metralectl.core.fit import parallel_sizes, parallel_words

        roles = catalog.engines[recipe.engine].fit_roles
        tp, pp = parallel_sizes(recipe.serve, roles)
        spread, words = tp * pp, parallel_words(roles, tp, pp)
        flag = roles.tensor_parallel or ""
        seen = len(machine.gpu_names()) if spread > 1 else 0
    return Facts(state, image_error, pullable, weights_status, weights_error, None, (), (), spread=spread,
                 spread_words=words, spread_flag=flag, gpus_seen=seen)


def _program_state(recipe: Recipe, catalog: Catalog) -> tuple[ImageState | None, MetralError | None, bool]:
    """A host process's "image" is its program: found here (present), or the refusal saying where it looked.
    Nothing pulls a program."""
    from metralectl.core.render import PROCESS_IMAGE_PREFIX
    from metralectl.lifecycle.specs import program_of
    from metralectl.seams.docker.images import ImageState

    try:
        program = program_of(catalog, recipe)
    except MetralError as exc:
        return None, exc, False
    return ImageState(PROCESS_IMAGE_PREFIX + program.path, True), None, False


def standing_refusal(recipe: Recipe, options: LaunchOptions, staged: Facts) -> Refusal | None:
    """What refuses a run of (or a swap to) this recipe on this box whatever serves, with these launch
    options: the ranks it needs, an image or weights staging cannot bring (or may not: options.pull).
    The dashboard's Library and the page disable their Run/Swap with it, in the words the launch says."""
    return multi_rank_refusal(recipe) or gpu_count_refusal(recipe, staged) or staging_refusal(options, staged)


def multi_rank_refusal(recipe: Recipe) -> Refusal | None:
    if not recipe.multi_rank:
        return None
    return Refusal(MetralError(
        f"{recipe.name} needs {count(recipe.resources.world_size, 'rank')} on {count(recipe.resources.nodes, 'node')}; "
        "name the worker node's Docker endpoint",
        f"`metralectl run {recipe.name} --worker CONTEXT|ssh://user@host` (docs/multinode.md); "
        f"`metralectl run {recipe.name} --print --rank N` shows each rank's command"))


def gpu_count_refusal(recipe: Recipe, facts: Facts) -> Refusal | None:
    """An engine told to spread the model over more GPUs than this box has would fail after its load began."""
    if not 0 < facts.gpus_seen < facts.spread:
        return None
    return Refusal(MetralError(
        f"{recipe.name} spreads the model over {facts.spread} GPUs (serve's {facts.spread_words}); this box has "
        f"{count(facts.gpus_seen, 'GPU')}",
        f"spread it over at most {facts.gpus_seen} (`--set serve.{facts.spread_flag}={facts.gpus_seen}`, the pipeline "
        f"size 1), or run it on a box with {facts.spread} GPUs"))


def staging_refusal(options: LaunchOptions, facts: Facts) -> Refusal | None:
    """The image and the weights: what staging cannot fix, or may not (options.pull False)."""
    if facts.image_error is not None and not (facts.image_pullable and options.pull):
        return Refusal(facts.image_error, "pull-image" if facts.image_pullable else None)
    if not options.check_weights or facts.weights_error is None or facts.weights_status == "present":
        return None  # present but not verified: a warning at staging, not a refusal
    downloadable = facts.weights_status in ("absent", "partial")
    if downloadable and options.pull:
        return None
    return Refusal(facts.weights_error, "pull-weights" if downloadable else None)


def containers_refusal(recipe: Recipe, spec: ContainerSpec, options: LaunchOptions, same_name: ContainerInfo | None,
                       others: Sequence[ContainerInfo], running: Sequence[ContainerInfo], *,
                       where: str = "", room: Room | None = None) -> Refusal | None:
    """A foreign container holding spec's name, another user's model, or (without --replace) one of ours serving
    when the recipe does not fit beside it within the box's budget (`room`, core/budget.py; None: not judged, as
    for a multi-rank recipe or another node: then one model per box). `running`: ours that run, less those the
    caller replaces anyway. `where` names the node."""
    if same_name is not None and (not same_name.managed or same_name.labels.get(LABEL_OWNER) != owner()):
        who = "is not metralectl's" if not same_name.managed else f"belongs to {same_name.labels.get(LABEL_OWNER)}"
        return Refusal(MetralError(
            f"a container named {spec.name} already exists{where} and {who}; metralectl will not touch it",
            f"remove or rename it yourself (`docker rm {spec.name}`), or serve under another recipe name"))
    if others:
        names = ", ".join(f"{c.name} (owner {c.owner})" for c in others)
        return Refusal(MetralError(f"another user's model is being served{where}: {names}; metralectl will not stop it",
                                   "ask its owner to stop it (`metralectl stop`) first"))
    if running and not options.replace:
        names = ", ".join(f"{c.name} ({c.labels.get(LABEL_RECIPE, '?')})" for c in running)
        if same_launch(spec, running) is not None:  # launch() answers this one itself: served, nothing to start
            return Refusal(MetralError(f"{recipe.name} is already being served{where} with these settings: {names}",
                                       f"nothing to start; `metralectl run {recipe.name} --replace` restarts it"))
        if any(c.labels.get(LABEL_RECIPE) == recipe.name for c in running):
            return Refusal(MetralError(
                f"{recipe.name} is already being served by metralectl{where} with other settings: {names}",
                f"`metralectl swap {recipe.name}` with these --set replaces it with rollback; `run --replace` "
                "restarts it with them"), None if recipe.multi_rank else "swap")
        ranked = any(LABEL_RANK in c.labels for c in running)
        if room is not None and not recipe.multi_rank and not ranked:
            if room.fits:
                return None  # it starts beside what serves, on its own port
            placement = room.placement  # on a box of several GPUs: only those on the GPUs it would go on
            on = set(placement.chosen) if placement is not None else None
            held = " ".join(f"`metralectl stop {h.name}`" for h in room.holdings
                            if on is None or on.intersection(h.devices))
            return Refusal(MetralError(
                f"{short_words(room)}{where}",
                f"`metralectl run {recipe.name} --replace` stops what serves first; `metralectl swap {recipe.name}` "
                f"replaces the one served model; or free room: {held} (`--budget GB` or `budget:` in box.yaml "
                f"sets the budget{' per GPU' if placement is not None else ''})"), "swap")
        hint = ("`run --replace` stops it first" if recipe.multi_rank or ranked else
                f"`metralectl swap {recipe.name}` replaces it with rollback; `run --replace` stops it first")
        what = (f"{recipe.name} is multi-rank: it runs alone on its nodes" if recipe.multi_rank else
                "a multi-rank model runs alone on its nodes" if ranked else "")
        return Refusal(MetralError(f"a model is already being served by metralectl{where}: {names}"
                                   + (f" ({what})" if what else ""), hint), "swap")
    return None


def same_launch(spec: ContainerSpec, running: Sequence[ContainerInfo]) -> ContainerInfo | None:
    """The container of ours that runs exactly what `spec` would start: its name, recipe and spec hash (the
    image, every flag, the environment, the mounts, the port) — `run` of it again is served already."""
    wanted = spec.labels.get(LABEL_SPEC_HASH)
    for c in running:
        if (wanted is not None and c.name == spec.name and c.labels.get(LABEL_SPEC_HASH) == wanted
                and c.labels.get(LABEL_RECIPE) == spec.labels.get(LABEL_RECIPE)):
            return c
    return None


def port_refusal(spec: ContainerSpec, free: bool | None, running: Sequence[ContainerInfo]) -> Refusal | None:
    """Only when none of ours runs: a --replace frees the port of the one it stops."""
    if running or free is not False:
        return None
    return Refusal(MetralError(
        f"port {spec.port} on {spec.bind} is already in use by another program",
        f"free it (`ss -ltnp 'sport = :{spec.port}'` shows who holds it) or `--set resources.port=N`"))


def launch_refusal(recipe: Recipe, spec: ContainerSpec, options: LaunchOptions, facts: Facts, *,
                   ignore_running: tuple[str, ...] = ()) -> Refusal | None:
    """The first reason this launch would be refused, in the order the launch meets them; None: it may go."""
    running = [c for c in facts.running if c.name not in ignore_running]
    return (multi_rank_refusal(recipe) or gpu_count_refusal(recipe, facts) or staging_refusal(options, facts)
            or containers_refusal(recipe, spec, options, facts.same_name, facts.others, running,
                                  room=_room(facts, running))
            or port_refusal(spec, facts.port_free, running))


def _room(facts: Facts, running: Sequence[ContainerInfo]) -> Room | None:
    """facts.room less the engines the caller ignores (replaced anyway)."""
    if facts.room is None or len(running) == len(facts.running):
        return facts.room
    kept = {c.labels.get(LABEL_RECIPE, c.name) for c in running}
    return replace(facts.room, held=tuple(h for h in facts.room.held if h.name in kept))


def swap_refusal(new: Recipe, new_sets: Sequence[str], running: Sequence[ContainerInfo],
                 served_sets: Sequence[str] = ()) -> Refusal | None:
    """Why a swap to `new` cannot start from what is served (ours that run; `served_sets`: the --set overrides
    the served one was started with); None: there is exactly one model to replace, and it is another."""
    if not running:
        return Refusal(NotServed(hint=f"`metralectl run {new.name}` serves it (a swap replaces a served model)"),
                       "run")
    if len(running) > 1:
        names = ", ".join(f"{c.labels.get(LABEL_RECIPE, '?')} ({c.name})" for c in running)
        return Refusal(MetralError(f"{len(running)} models are served ({names}); a swap replaces the one served model",
                                   f"`metralectl stop RECIPE` the others first; or `metralectl run {new.name}` beside "
                                   f"them (it says when it does not fit), or `metralectl run {new.name} --replace`"))
    if new.multi_rank:
        return Refusal(MetralError(f"{new.name} needs {new.resources.world_size} ranks; hot swap is single-node "
                                   "(the engine's rule)",
                                   "stop the current model and launch the multi-rank recipe directly"))
    old = running[0]
    served = old.labels.get(LABEL_RECIPE, old.name)
    if LABEL_RANK in old.labels:
        return Refusal(MetralError(f"{served} is served by several ranks on several nodes; hot swap is single-node "
                                   "(the engine's rule)",
                                   f"`metralectl stop {served}` (every rank), then `metralectl run {new.name}`"))
    if served == new.name and sorted(served_sets) == sorted(new_sets):
        return Refusal(MetralError(f"{new.name} is already the served model, with these settings",
                                   f"`--set KEY=VALUE` swaps to it with other settings; `metralectl stop` then "
                                   f"`metralectl run {new.name}` restarts it"))
    return None
