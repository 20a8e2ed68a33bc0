"""What an action will do, worked out before anything happens (for the confirmation modal).

The refusals come from the launch's own preflight (lifecycle/preflight.py: the same facts, the same
order, the dashboard's own launch options), and a stop's choice from app/serving.select_stop, so the
confirmation says what the action would refuse or do, and offers the right key instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from metralectl.errors import MetralError
from metralectl.tui.services import Action, Plan

if TYPE_CHECKING:
    from metralectl.core.catalog import Catalog
    from metralectl.core.recipe import Recipe
    from metralectl.lifecycle.preflight import Facts, Refusal

# The keys are the Library's, not this confirmation's: each hint says to close it first.
HINTS = {"pull-image": "Esc, then p in the Library pulls it", "pull-weights": "Esc, then p in the Library pulls them",
         "run": "Esc, then r in the Library runs this recipe",
         "swap": "Esc, then w in the Library swaps to this recipe (with rollback), or x stops the served one first"}
# The same, said under the Library's table (no dialog to close) when r and w are disabled for the chosen recipe.
LIBRARY_HINTS = {"pull-image": "p pulls it", "pull-weights": "p pulls them"}


def dashboard_change(action: Action, name: str | None) -> Any:
    """The Change an action of the dashboard makes: run/swap never pull (the plan offers `p` for that, so a
    plan and its launch refuse alike), stop names what the plan chose (None: the one served)."""
    from metralectl.app.serving import Change
    from metralectl.lifecycle.launch import LaunchOptions

    if action == "stop":
        return Change.stop(name)
    assert name is not None
    if action == "run":
        return Change.run(name, options=LaunchOptions(pull=False))
    return Change.swap(name, options=LaunchOptions(pull=False))


def make_plan(action: Action, recipe: Recipe | None, catalog: Catalog, runtime_factory: Callable[[], Any]) -> Plan:
    if action == "stop":
        return _stop_plan(recipe, runtime_factory)
    assert recipe is not None
    from metralectl.lifecycle.preflight import observe
    from metralectl.lifecycle.specs import spec_here

    try:
        spec = spec_here(catalog, recipe)
    except MetralError as exc:  # a host process whose program is not on this machine
        return Plan(action, recipe.name, f"{action.capitalize()} {recipe.name}", (), blocked=exc.message, hint=exc.hint)
    facts: Facts | None = None
    docker_note: str | None = None
    try:
        with runtime_factory() as runtime:
            facts = observe(recipe, catalog, runtime, spec, probe_port=action == "run")
    except MetralError as exc:
        docker_note = exc.message
    if action == "pull":
        return _pull_plan(recipe, catalog, facts, docker_note)
    return _change_plan(action, recipe, catalog, spec, facts, docker_note)


def _image_line(facts: Facts | None, docker_note: str | None) -> str:
    if facts is None or facts.image is None:
        return f"unknown ({docker_note})"
    return "present" if facts.image.present else "absent"


def _pull_plan(recipe: Recipe, catalog: Catalog, facts: Facts | None, docker_note: str | None) -> Plan:
    from metralectl.seams.hf import state as hfstate

    info = catalog.image_for(recipe)
    present = facts is not None and facts.image is not None and facts.image.present
    fetch = "" if present else (f" → build it locally: {info.build}" if info.build
                                else f" → docker pull --platform {info.platform}")
    cache = hfstate.checkpoint_state(recipe.checkpoint)
    steps = (f"image {info.ref}: {_image_line(facts, docker_note)}{fetch}",
             (f"weights {recipe.checkpoint.repo}@{recipe.checkpoint.revision or 'main'}"
              f"{':' + recipe.checkpoint.quant if recipe.checkpoint.format == 'gguf' else ''}: {cache.status} → "
              "download what is missing into the HF cache, then verify every file"
              f"{' of the quant' if recipe.checkpoint.format == 'gguf' else ''}"))
    return Plan("pull", recipe.name, f"Pull {recipe.name}", steps)


def _refusal(action: Action, recipe: Recipe, spec: Any, facts: Facts) -> Refusal | None:
    """What the launch (run) or the swap would refuse, with the dashboard's options (app: dashboard_change)."""
    from metralectl.lifecycle.preflight import launch_refusal, swap_refusal
    from metralectl.lifecycle.swap import served_sets
    options = dashboard_change(action, recipe.name).options
    if action == "run":
        return launch_refusal(recipe, spec, options, facts)
    served = facts.running[0] if len(facts.running) == 1 else None
    return (swap_refusal(recipe, (), facts.running, served_sets(served) if served else ())
            or launch_refusal(recipe, spec, replace(options, replace=True), facts,
                              ignore_running=(served.name,) if served else ()))


def _change_plan(action: Action, recipe: Recipe, catalog: Catalog, spec: Any, facts: Facts | None,
                 docker_note: str | None) -> Plan:
    from metralectl.core.render import LABEL_RECIPE
    from metralectl.lifecycle.specs import command_text

    info = catalog.image_for(recipe)
    warnings = [f"deviation: {k}: {old} -> {new}" for k, old, new in recipe.deviations]
    weights = facts.weights_status if facts is not None else "unknown"
    if weights == "present":
        warnings.append("weights present but not verified (pull verifies them)")
    blocked: str | None = f"Docker: {docker_note}" if facts is None else None
    hint: str | None = None
    if facts is not None:
        refused = _refusal(action, recipe, spec, facts)
        if refused is not None:
            blocked, hint = refused.error.message, HINTS.get(refused.fix or "", refused.error.hint)
    running = facts.running if facts is not None else ()
    served = [f"{c.labels.get(LABEL_RECIPE, '?')} ({c.name})" for c in running]
    command = command_text(spec)
    image_line = _image_line(facts, docker_note)
    kind, what = ("program", "host process") if spec.is_process else ("image", "container")
    if action == "run":
        checked = spec.command[0] if spec.is_process else info.ref
        steps = (f"check {kind} {checked} ({image_line}), weights ({weights}), port {spec.bind}:{spec.port}",
                 f"start {what} {spec.name}",
                 "follow the engine log for its boot phases (kernel target, weights, KV cache)",
                 (f"ready = GET /health on {spec.bind}:{spec.port} answers 200, polled from the start "
                  f"(boot timeout {catalog.hardware[recipe.hardware].boot_timeout_s:g} s)"),
                 f"on failure: say why, keep the log, remove the {what}")
        return Plan("run", recipe.name, f"Run {recipe.name}", steps, command, tuple(warnings), blocked, hint)
    old = served[0] if served else "?"
    steps = (f"stage {recipe.name} (image, weights) while {old} keeps serving",
             "drain in-flight requests (≤ 60 s)",
             f"stop {old} and wait for its GPU memory to come back",
             f"start {recipe.name} on the same address and wait until ready",
             f"if it does not become ready: restore {old} (rollback)")
    return Plan("swap", recipe.name, f"Swap to {recipe.name}", steps, command, tuple(warnings), blocked, hint)


def _stop_plan(recipe: Recipe | None, runtime_factory: Callable[[], Any]) -> Plan:
    """The selected recipe's container when it runs, else the one served: chosen as `metralectl stop` chooses."""
    from metralectl.app.serving import select_stop
    from metralectl.core.render import LABEL_RECIPE

    name = recipe.name if recipe else None
    try:
        runtime = runtime_factory()
    except MetralError as exc:
        return Plan("stop", name, "Stop", (), blocked=f"Docker: {exc.message}")
    with runtime:
        try:
            running = [c for c in runtime.containers() if c.running]
            if name is not None and not any(c.labels.get(LABEL_RECIPE) == name for c in running):
                name = None  # the selected recipe is not served: stop the one that is
            deployments, containers = select_stop(runtime, dashboard_change("stop", name))
        except MetralError as exc:  # several served and none selected, or Docker gone meanwhile
            return Plan("stop", name, "Stop", (), blocked=exc.message,
                        hint="select the recipe of the one to stop in the Library" if name is None else exc.hint)
    if not deployments and not containers:
        from metralectl.errors import NOTHING_SERVED

        return Plan("stop", name, "Stop", (), blocked=NOTHING_SERVED)
    steps: list[str] = []
    for dep in deployments:
        steps.append(f"stop every rank of {dep.recipe}, the head first, each on its node "
                     f"({', '.join(r.container for r in dep.ranks)})")
    for c in containers:
        steps.append(f"SIGTERM container {c.name}; SIGKILL after 30 s if it has not exited")
    steps += ["verify the containers are gone and removed",
              "wait (≤ 20 s) until their processes no longer hold GPU memory"]
    names = sorted({d.recipe for d in deployments} | {c.labels.get(LABEL_RECIPE, c.name) for c in containers})
    chosen = names[0] if len(names) == 1 else name
    return Plan("stop", chosen, f"Stop {', '.join(names)}", tuple(steps), cancellable=False)
