"""`run`: preflight, start the container, wait until the engine is really ready, or clean up.

Ready means `GET /health` = 200, polled from the moment the container starts, and what the engine's
readiness style still needs (lifecycle/readiness.py); the engine's log lines are hints for phases,
progress and failure causes. The start, the wait and the clean-up are lifecycle/ranks.py's, the same
for one rank as for an EP=2 launch's two. A start that fails is classified in one line, its logs are
kept, and its container removed (unless keep_failed). Ctrl-C at any point removes the half-started
container.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from metralectl import cancel
from metralectl.seams import machine, store
from metralectl.seams.hf import state as hfstate
from metralectl.core.catalog import Catalog
from metralectl.seams.endpoint import EngineClient, base_url
from metralectl.seams.ports import port_free
from metralectl.errors import ExitCode, MetralError
from metralectl.lifecycle.boot import LaunchFailed  # noqa: F401  (re-exported: a launch's failure)
from metralectl.lifecycle.engine_token import engine_headers
from metralectl.lifecycle.preflight import (containers_refusal, launch_refusal, multi_rank_refusal, observe,
                                            port_refusal, same_launch)
from metralectl.lifecycle.events import Listener, Step, Transfer, Warning_, ignore
from metralectl.lifecycle.ranks import Rank, boot, new_run_id
from metralectl.core.overrides import apply_sets
from metralectl.core.recipe import Recipe
from metralectl.core.labels import LABEL_ENDPOINT, LABEL_RUN_ID, LABEL_SETS
from metralectl.core.render import ContainerSpec, owner
from metralectl.lifecycle.specs import program_of, spec_here
from metralectl.seams.docker.containers import ContainerInfo
from metralectl.seams.docker.protocol import ContainerRuntime


@dataclass(frozen=True)
class LaunchOptions:
    replace: bool = False
    keep_failed: bool = False
    stall_timeout_s: float = 300.0  # no new log line and no change in the /health answer for this long = stalled
    boot_timeout_s: float | None = None  # default: the hardware class's (900 s on GB10)
    check_weights: bool = True
    pull: bool = True  # pull a missing image / download missing weights before starting (else refuse)
    sets: tuple[str, ...] = ()  # the --set overrides, recorded so a swap can restore this exact recipe
    budget_gb: float | None = None  # --budget: the box's memory budget (else box.yaml's, else the GPU's memory)


@dataclass(frozen=True)
class Launched:
    run_id: str
    recipe: str
    container: str
    container_id: str
    url: str
    model: str | None
    ready_s: float
    phases: dict[str, float] = field(default_factory=dict)
    log_path: str = ""
    ready_at: float = 0.0  # wall-clock time (epoch s) the first /health 200 arrived
    already_serving: bool = False  # this very recipe, with these settings, was served already: nothing started
    runtime: str = "docker"  # docker (a container) | process (a host process: `container` is its name)


def stage(recipe: Recipe, catalog: Catalog, runtime: ContainerRuntime, options: LaunchOptions, on_event: Listener) -> None:
    """The image (a host process: its program) and the weights, present and right for this machine — pulled when
    missing unless told not to."""
    from metralectl.seams.docker import images
    from metralectl.seams.hf import weights
    if recipe.runtime == "process":  # no image: the engine's program on this host (ProgramMissing says where)
        program = program_of(catalog, recipe)
        on_event(Step("program", f"{program.path} (from {program.how})"))
    else:
        info = catalog.image_for(recipe)
        arch = machine.cpu_arch()
        on_event(Step("image", info.ref))
        state = runtime.image_state(info.ref, info.revision_label)
        if not state.present and options.pull:
            images.pull(info, runtime, arch, transfer_events("image", on_event))
        images.image_preflight(info, runtime, arch, recipe.name)
    if not options.check_weights:
        return
    on_event(Step("weights", recipe.checkpoint.repo))
    cache = hfstate.checkpoint_state(recipe.checkpoint)
    if cache.status in ("absent", "partial") and options.pull:
        weights.pull(recipe, transfer_events("weights", on_event))
    elif cache.status == "present":
        on_event(Warning_(f"weights of {recipe.checkpoint.repo} are present but not verified "
                          f"(`metralectl pull {recipe.name}` verifies them)"))
        weights.serving_preflight(recipe, cache)  # a GGUF quant: llama-server must load these very files
        return
    weights.weights_preflight(recipe)


def transfer_events(kind: str, on_event: Listener) -> Callable[[object], None]:
    """A pull's progress as Transfer events; each report is also a place a cancel stops the pull."""
    def progress(value: object) -> None:
        cancel.checkpoint()
        on_event(Transfer(kind, value))
    return progress


def check_containers(recipe: Recipe, runtime: ContainerRuntime, spec: ContainerSpec, options: LaunchOptions, *,
                     ignore_running: tuple[str, ...] = (), where: str = "",
                     catalog: Catalog | None = None) -> list[ContainerInfo]:
    """Refuse a foreign container holding spec's name, another user's model, or (without --replace) one of
    ours serving that this recipe does not fit beside (lifecycle/preflight.py says which; without `catalog`, as on
    another node, one model per box); return ours that are running (what --replace stops). `where` names the node."""
    existing = runtime.inspect(spec.name)
    others = [c for c in runtime.containers(mine=False) if c.running and c.owner != owner()]
    running = [c for c in runtime.containers() if c.running and c.name not in ignore_running]
    room = None
    if catalog is not None and running and not options.replace and not recipe.multi_rank:
        from metralectl.lifecycle.budget import room_for

        room = room_for(catalog, recipe, runtime, running, options.budget_gb)
    refused = containers_refusal(recipe, spec, options, existing, others, running, where=where, room=room)
    if refused is not None:
        raise refused.error
    return running


def preflight(recipe: Recipe, catalog: Catalog, runtime: ContainerRuntime, spec: ContainerSpec, options: LaunchOptions,
              on_event: Listener, *, ignore_running: tuple[str, ...] = (), check_port: bool = True) -> None:
    """Everything that can refuse a launch before anything starts: first what is known now
    (lifecycle/preflight.py, the answer the dashboard's plan shows too), then staging (which pulls what
    is missing unless told not to), then the containers and the port again (staging can take minutes)."""
    refused = multi_rank_refusal(recipe) or launch_refusal(recipe, spec, options,
                                                           observe(recipe, catalog, runtime, spec,
                                                                   budget_gb=options.budget_gb),
                                                           ignore_running=ignore_running)
    if refused is not None:
        raise refused.error
    cancel.checkpoint()
    stage(recipe, catalog, runtime, options, on_event)
    cancel.checkpoint()
    running = check_containers(recipe, runtime, spec, options, ignore_running=ignore_running, catalog=catalog)
    if not check_port:
        return
    on_event(Step("port", f"{spec.bind}:{spec.port}"))
    refused = port_refusal(spec, None if running else port_free(spec.bind, spec.port), running)
    if refused is not None:
        raise refused.error


def launch(recipe: Recipe, catalog: Catalog, runtime: ContainerRuntime, *, options: LaunchOptions = LaunchOptions(),
           on_event: Listener = ignore, gpus_override: str | int | None = "recipe") -> Launched:
    spec = spec_here(catalog, recipe, gpus_override=gpus_override)
    if not options.replace:
        served = already_serving(recipe, catalog, runtime, spec, on_event, options.sets)
        if served is not None:
            return served
    preflight(recipe, catalog, runtime, spec, options, on_event)
    if not options.replace:  # beside what serves (it fits: preflight said so): on a port of its own
        recipe, spec, options = own_port(recipe, catalog, runtime, spec, options, on_event, gpus_override)
    replaced: list[str] = []
    if options.replace:
        from metralectl.lifecycle.stop import stop_containers, stop_deployments_on

        stop_deployments_on(runtime, on_event)  # a multi-rank deployment with a rank here goes as a whole
        for result in stop_containers(runtime, [c for c in runtime.containers() if c.running], on_event=on_event):
            on_event(Step("replaced", result.name))
            replaced.append(result.recipe or result.name)
    stale = runtime.inspect(spec.name)
    if stale is not None:  # ours, not running: a leftover of an earlier failed run
        runtime.remove(stale.id, force=True)
    try:
        return start_and_wait(recipe, catalog, runtime, spec, options, on_event)
    except KeyboardInterrupt:
        if not replaced:
            raise
        # --replace already stopped what served: the user must hear that nothing serves now, and how to undo it
        raise LaunchInterrupted(
            f"interrupted while {recipe.name} was starting: nothing serves now ({', '.join(replaced)} was stopped "
            f"by --replace, {recipe.name}'s {'process' if spec.is_process else 'container'} was removed)",
            f"`metralectl run {replaced[0]}` serves it again") from None


def already_serving(recipe: Recipe, catalog: Catalog, runtime: ContainerRuntime, spec: ContainerSpec,
                    on_event: Listener, sets: tuple[str, ...] = ()) -> Launched | None:
    """`run` of exactly what serves (preflight.same_launch) is done already: its endpoint, as a launch would
    give it, once its engine answers ready; running but not ready is refused (its logs say why). None: not served."""
    from metralectl.lifecycle.readiness import health_now

    running = [c for c in runtime.containers() if c.running]
    same = same_launch(spec, running)
    for c in running:  # started beside another model on a port of its own (own_port): the same launch there
        if same is None and c.name == spec.name and c.labels.get(LABEL_ENDPOINT):
            port = urlsplit(c.labels[LABEL_ENDPOINT]).port
            moved_sets = "\x1f".join((*sets, f"resources.port={port}"))
            if port and port != spec.port and c.labels.get(LABEL_SETS, "") == moved_sets:
                moved = apply_sets(catalog, recipe, [f"resources.port={port}"])
                same = same_launch(spec_here(catalog, moved), [c])  # the gpus as the recipe says
    if same is None:
        return None
    url = same.labels.get(LABEL_ENDPOINT) or base_url(spec.bind, spec.port)
    readiness = catalog.engines[recipe.engine].readiness
    headers = engine_headers(same.labels)  # the engine token, when the engine asks it
    health = health_now(url, readiness, 5.0, headers)
    if health.kind != "ready":
        raise MetralError(f"{recipe.name} is already running with these settings ({same.name}), but its engine is "
                          f"not ready: GET {readiness.health_path}: {health.describe()}",
                          f"`metralectl logs {recipe.name}` shows why; `metralectl run {recipe.name} --replace` restarts it")
    on_event(Step("serving", f"{recipe.name} is already served with these settings ({same.name}): nothing to start"))
    with EngineClient(url, headers=headers) as client:
        model = client.served_model()
    return Launched(same.labels.get(LABEL_RUN_ID, ""), recipe.name, same.name, same.id, url, model, 0.0,
                    already_serving=True, runtime="process" if spec.is_process else "docker")


def own_port(recipe: Recipe, catalog: Catalog, runtime: ContainerRuntime, spec: ContainerSpec,
             options: LaunchOptions, on_event: Listener,
             gpus_override: str | int | None = "recipe") -> tuple[Recipe, ContainerSpec, LaunchOptions]:
    """A recipe starting beside other models keeps its port when free; else the next port no engine of ours
    claims and nothing listens on (recorded in its --set, so `ps`, a swap and the gateway see it)."""
    from metralectl.lifecycle.budget import free_port

    running = [c for c in runtime.containers() if c.running]
    if not running:
        return recipe, spec, options
    taken = {p for p in (urlsplit(c.labels.get(LABEL_ENDPOINT, "")).port for c in running) if p}
    if spec.port not in taken and port_free(spec.bind, spec.port):
        return recipe, spec, options
    port = free_port(spec.bind, taken, spec.port + 1)
    on_event(Step("port", f"{spec.bind}:{port} ({spec.port} is held by what serves)"))
    moved = apply_sets(catalog, recipe, [f"resources.port={port}"])
    options = replace(options, sets=options.sets + (f"resources.port={port}",))
    return moved, spec_here(catalog, moved, gpus_override=gpus_override), options


class LaunchInterrupted(MetralError):
    """Ctrl-C after `run --replace` stopped what served: nothing serves, and the message says so."""

    exit_code = ExitCode.INTERRUPTED


def start_and_wait(recipe: Recipe, catalog: Catalog, runtime: ContainerRuntime, spec: ContainerSpec,
                   options: LaunchOptions, on_event: Listener) -> Launched:
    """Start the one container and wait until it serves (lifecycle/ranks.py: a single-rank launch), or fail
    it: classified, logs kept, the container removed unless keep_failed; Ctrl-C removes it too. On a box of several
    GPUs it goes on those that hold least (lifecycle/placing.py)."""
    from metralectl.lifecycle.placing import place

    spec = place(catalog, recipe, runtime, spec, options.budget_gb)  # on a box of several GPUs: the least held
    run_id = new_run_id()
    rank = Rank(0, runtime, spec, store.logs_dir() / f"{run_id}-{recipe.name}.log")
    booted = boot(recipe, catalog, [rank], run_id, base_url(spec.bind, spec.port), options, on_event)
    assert rank.container is not None
    return Launched(run_id, recipe.name, spec.name, rank.container.id, booted.url, booted.model, booted.ready_s,
                    booted.phases, str(rank.log_path), booted.ready_at,
                    runtime="process" if spec.is_process else "docker")
