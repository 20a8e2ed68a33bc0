"""What an action will do, worked out before anything happens (for the confirmation modal).

Refusals the lifecycle would raise anyway (multi-rank recipe, image missing, a model already
served) are found here first, so the confirmation can say so and offer the right key instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from metralectl.errors import MetralError
from metralectl.tui.services import Action, Plan

if TYPE_CHECKING:
    from metralectl.core.catalog import Catalog
    from metralectl.core.recipe import Recipe
    from metralectl.seams.container_runtime import ContainerRuntime


def make_plan(action: Action, recipe: Recipe | None, catalog: Catalog, runtime_factory: Callable[[], ContainerRuntime]) -> Plan:
    from metralectl.seams import hfcache
    from metralectl.core.labels import LABEL_RECIPE
    from metralectl.core.render import docker_run_command, spec_for

    running: list[Any] = []
    image_present: bool | None = None
    docker_note: str | None = None
    try:
        with runtime_factory() as runtime:
            running = [c for c in runtime.containers() if c.running]
            if recipe is not None:
                info = catalog.image_for(recipe)
                image_present = runtime.image_state(info.ref, info.revision_label).present
    except MetralError as exc:
        docker_note = exc.message
    served = [f"{c.labels.get(LABEL_RECIPE, '?')} ({c.name})" for c in running]

    if action == "stop":
        mine = [c for c in running if recipe is not None and c.labels.get(LABEL_RECIPE) == recipe.name]
        chosen = mine or running
        if docker_note:
            return Plan("stop", recipe.name if recipe else None, "Stop", (), blocked=f"Docker: {docker_note}")
        if not chosen:
            return Plan("stop", recipe.name if recipe else None, "Stop", (), blocked="metralectl is serving nothing")
        if len(chosen) > 1:
            return Plan("stop", None, "Stop", (), blocked=f"several models are served ({', '.join(served)})",
                        hint="select the recipe of the one to stop in the Library")
        c = chosen[0]
        name = c.labels.get(LABEL_RECIPE, c.name)
        return Plan("stop", name, f"Stop {name}", (
            f"SIGTERM container {c.name}; SIGKILL after 30 s if it has not exited",
            "verify the container is gone and removed",
            "wait (≤ 20 s) until its processes no longer hold GPU memory",
        ), cancellable=False)

    assert recipe is not None
    info = catalog.image_for(recipe)
    cache = hfcache.cache_state(recipe.checkpoint.repo, recipe.checkpoint.revision)
    image_line = {True: "present", False: "absent", None: f"unknown ({docker_note})"}[image_present]

    if action == "pull":
        fetch = "" if image_present else (f" → build it locally: {info.build}" if info.build
                                          else f" → docker pull --platform {info.platform}")
        pull_steps = (f"image {info.ref}: {image_line}{fetch}",
                      (f"weights {recipe.checkpoint.repo}@{recipe.checkpoint.revision or 'main'}: {cache.status} → "
                       "download what is missing into the HF cache, then verify every file"))
        return Plan("pull", recipe.name, f"Pull {recipe.name}", pull_steps)

    spec = spec_for(catalog, recipe)
    command = docker_run_command(spec)
    warnings = [f"deviation: {k}: {old} -> {new}" for k, old, new in recipe.deviations]
    if cache.status == "present":
        warnings.append("weights present but not verified (pull verifies them)")
    blocked, hint = None, None
    if docker_note:
        blocked = f"Docker: {docker_note}"
    elif recipe.multi_rank:
        blocked = f"{recipe.name} needs {recipe.resources.world_size} ranks; the dashboard serves single-node recipes"
        hint = f"`metralectl run {recipe.name} --print --rank N` shows each rank's command"
    elif not image_present:
        blocked, hint = f"image {info.ref} is not present locally", "press p to pull it"
    elif cache.status in ("absent", "partial"):
        blocked, hint = f"weights of {recipe.checkpoint.repo} are {cache.status} in the HF cache", "press p to pull them"

    if action == "run":
        if blocked is None and running:
            blocked = f"a model is already served: {', '.join(served)}"
            hint = "press w to swap to this recipe (with rollback), or x to stop the served one first"
        steps = (f"check image {info.ref} ({image_line}), weights ({cache.status}), port {spec.bind}:{spec.port}",
                 f"start container {spec.name}",
                 "follow the engine log for its boot phases (kernel target, weights, KV cache)",
                 (f"ready = GET /health on {spec.bind}:{spec.port} answers 200, polled from the start "
                  f"(boot timeout {catalog.hardware[recipe.hardware].boot_timeout_s:g} s)"),
                 "on failure: say why, keep the log, remove the container")
        return Plan("run", recipe.name, f"Run {recipe.name}", steps, command, tuple(warnings), blocked, hint)

    # swap: what is served decides first (nothing to swap is the more useful news than missing weights)
    if not docker_note:
        if not running:
            blocked, hint = "metralectl is serving nothing to swap", "press r to run this recipe"
        elif len(running) > 1:
            blocked, hint = f"more than one model is served ({', '.join(served)}); swap needs exactly one", None
        elif running[0].labels.get(LABEL_RECIPE) == recipe.name:
            blocked, hint = f"{recipe.name} is already the served model", None
    old = served[0] if served else "?"
    steps = (f"stage {recipe.name} (image, weights) while {old} keeps serving",
             "drain in-flight requests (≤ 60 s)",
             f"stop {old} and wait for its GPU memory to come back",
             f"start {recipe.name} on the same address and wait until ready",
             f"if it does not become ready: restore {old} (rollback)")
    return Plan("swap", recipe.name, f"Swap to {recipe.name}", steps, command, tuple(warnings), blocked, hint)
