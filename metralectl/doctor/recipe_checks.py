"""With `--recipe R`: what R itself needs — its image present (a host process: its program found), its weights
cached, its memory fitting."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from metralectl.seams.hf import cache as hfcache, state as hfstate
from metralectl.doctor.context import Context
from metralectl.doctor.model import Finding, ok, problem, skipped, warn

if TYPE_CHECKING:
    from metralectl.core.recipe import Recipe
    from metralectl.core.catalog import Catalog

GB = 1e9


def _recipe(ctx: Context) -> Recipe:
    recipe = ctx.recipe()
    assert recipe is not None, "recipe checks run only with --recipe"
    return recipe


def check_image(ctx: Context) -> Finding:
    from metralectl.core.image_info import PLATFORM_OF_ARCH, build_command

    recipe = _recipe(ctx)
    catalog = ctx.catalog()
    image = catalog.image_for(recipe)
    data: dict[str, Any] = {"image": image.ref, "recipe": recipe.name}
    try:
        state = ctx.image_state(image.ref, image.revision_label)
    except Exception:  # noqa: BLE001 - the daemon check says why
        return skipped(f"cannot look for {image.ref}: no Docker daemon (see the daemon check)", **data)
    if not state.present:
        if image.build is not None:  # nothing to pull: say so, and how to build it
            return problem(f"{image.ref} is not present locally, and it cannot be pulled: {image.availability()}",
                           f"build it {build_command(image)}", **data)
        return problem(f"{image.ref} is not present locally", f"metralectl pull {recipe.name}   (or: docker pull "
                       f"{image.ref})", **data)
    data.update(image_id=state.image_id, revision=state.revision, platform=state.platform)
    want = PLATFORM_OF_ARCH.get(ctx.cpu_arch())
    if state.platform and want and state.platform != want:
        return problem(f"{image.ref} is present but built for {state.platform}; this machine is {want}",
                       f"build it again {build_command(image)}" if image.build is not None
                       else f"docker pull --platform {want} {image.ref}", **data)
    validated = recipe.validated.engine_revision
    revision = state.revision or "no revision label"
    if validated and state.revision and state.revision != validated:
        return warn(f"{image.ref} is present at revision {state.revision}; {recipe.name} was validated on {validated}",
                    (f"build it again from the engine at {validated} {build_command(image)}" if image.build is not None
                     else f"metralectl pull {recipe.name} fetches what it was validated on"), **data)
    built = f"; {image.availability().split(' (')[0]}" if image.build is not None else ""
    return ok(f"{image.ref} is present ({revision}, {state.platform or 'platform ?'}{built})", **data)


def check_program(ctx: Context) -> Finding:
    """A host process's "image": its engine's program, where `run` would find it (engines.yaml, else PATH), and
    built for this CPU."""
    from metralectl.core.images import machine_platform
    from metralectl.core.render import PROCESS_IMAGE_PREFIX
    from metralectl.errors import MetralError
    from metralectl.lifecycle.specs import program_of
    from metralectl.seams.process.images import image_state

    recipe = _recipe(ctx)
    data: dict[str, Any] = {"recipe": recipe.name, "runtime": recipe.runtime}
    if recipe.runtime != "process":
        return skipped(f"not needed: {recipe.name} runs in a container (runtime: docker)", **data)
    try:
        program = program_of(ctx.catalog(), recipe)
    except MetralError as exc:  # not found: where it looked, and the fix
        return problem(exc.message, exc.hint, **data)
    want = machine_platform(ctx.cpu_arch())
    state = image_state(PROCESS_IMAGE_PREFIX + program.path, want)
    data.update(program=program.path, found_in=program.how, platform=state.platform)
    if not state.present:
        return problem(f"{program.path} (from {program.how}) cannot be started: {state.reason}",
                       "install the engine, or name its program in engines.yaml in the config dir", **data)
    if state.platform and state.platform != want:
        return problem(f"{program.path} is built for {state.platform}; this machine is {want}",
                       "install the engine's build for this machine", **data)
    start = ctx.catalog().engines[recipe.engine].process
    if start is not None and start.module:  # a Python engine: the interpreter must have it (vLLM in its venv)
        from metralectl.seams.process.modules import missing_module

        why = missing_module(program.path, start.module)
        if why is not None:
            return problem(f"{program.path} (from {program.how}) cannot start {start.module}: {why}",
                           f"name the Python the engine is installed in: `{recipe.engine}: {{interpreter: "
                           "/path/to/venv/bin/python}` in engines.yaml in the config dir", **data)
        data["module"] = start.module
    return ok(f"{program.path} (from {program.how}; {state.platform or 'platform ?'})", **data)


def check_weights(ctx: Context) -> Finding:
    recipe = _recipe(ctx)
    ck = recipe.checkpoint
    repo, revision = ck.repo, ck.revision
    state = hfstate.checkpoint_state(ck)
    data: dict[str, Any] = {"repo": repo, "revision": revision, "status": state.status,
                            "snapshot": str(state.snapshot) if state.snapshot else None}
    if ck.format == "gguf":
        return _gguf_weights(recipe.name, f"{repo}:{ck.quant}", state, data | {"quant": ck.quant,
                                                                              "files": list(state.paths)})
    download = f"hf download {repo}" + (f" --revision {revision}" if revision else "")
    if state.status == "complete":
        return ok(f"{repo} cached and verified ({state.detail})", **data)
    if state.status == "present":
        return ok(f"{repo} cached ({state.detail})", **data)
    if state.status == "partial":
        return warn(f"{repo} is partly downloaded ({state.detail}); the engine would fetch the rest on first start",
                    f"metralectl pull {recipe.name}   (or: {download})", **data)
    return warn(f"{repo} is not in the HF cache ({state.detail}); the engine downloads it on first start, "
                "which takes a while", f"metralectl pull {recipe.name}   (or: {download})", **data)


def _gguf_weights(name: str, what: str, state: hfcache.CacheState, data: dict[str, Any]) -> Finding:
    """A GGUF quant: only its files count, and llama-server runs --offline (it never downloads; `run` refuses)."""
    if state.status == "complete":
        return ok(f"{what} cached and verified ({state.detail})", **data)
    if state.status == "present":
        return warn(f"{what} cached but not verified ({state.detail}); `metralectl run` refuses unverified GGUF files",
                    f"metralectl pull {name}", **data)
    how = "partly downloaded" if state.status == "partial" else "not in the HF cache"
    return warn(f"{what} is {how} ({state.detail}); llama-server runs offline, so `metralectl run` pulls it first "
                "(or refuses with --no-pull)", f"metralectl pull {name}", **data)


OVER_WEIGHTS_FIX = ("a leaner quant (`--set checkpoint.quant=…`), or spread the model over more GPUs (the engine's "
                    "tensor-parallel size and resources.gpus)")


def _spread_refusal(recipe: Recipe, catalog: Catalog, gpus: int, data: dict[str, Any]) -> Finding | None:
    """More GPUs than this machine has, for the engine's tensor × pipeline parallel sizes: `run` refuses it."""
    from metralectl.core.fit import parallel_sizes, parallel_words

    roles = catalog.engines[recipe.engine].fit_roles
    tp, pp = parallel_sizes(recipe.serve, roles)
    if not 0 < gpus < tp * pp:
        return None
    return problem(f"{recipe.name} spreads the model over {tp * pp} GPUs (serve's {parallel_words(roles, tp, pp)}); "
                   f"this machine has {gpus}",
                   f"`--set serve.{roles.tensor_parallel}={gpus}` (the pipeline size 1), or a machine with {tp * pp} "
                   "GPUs", **data, gpus=gpus, spread=tp * pp)


def check_fit(ctx: Context) -> Finding:
    from metralectl.core.fit import estimate

    recipe = _recipe(ctx)
    catalog = ctx.catalog()
    detected, gpu_name, _ = ctx.detected_gpu()
    data: dict[str, Any] = {"recipe": recipe.name, "recipe_hardware": recipe.hardware, "detected_hardware": detected}
    hw = catalog.hardware[recipe.hardware]
    if hw.has_accelerator and detected is not None and detected != recipe.hardware:
        return problem(f"{recipe.name} is built for {recipe.hardware}; this machine is {detected} ({gpu_name})",
                       "pick a recipe for this machine (`metralectl list` judges fit on the detected class)", **data)
    if hw.has_accelerator and detected == recipe.hardware:
        spread = _spread_refusal(recipe, catalog, ctx.gpu_count(), data)
        if spread is not None:
            return spread
    ram = None
    if hw.host_memory:  # the budget is this machine's RAM
        from metralectl.seams.machine import host_memory_gb
        ram = host_memory_gb()
    est = estimate(recipe, catalog.model_of(recipe), hw, gpu_name if detected == recipe.hardware else None,
                   catalog.engines[recipe.engine].memory_meaning, host_ram_gb=ram,
                   roles=catalog.engines[recipe.engine].fit_roles)
    total, budget = est.total_gb, est.budget.gb
    data.update(estimate_gb=total, budget_gb=budget, weights_gb=est.weights.gb, kv_pool_gb=est.kv_pool.gb,
                reserve_gb=est.reserve.gb)
    where = f"on {hw.display_name}" + ("" if detected or not hw.has_accelerator
                                       else " (no GPU detected: judged on the recipe's class)")
    if est.fits is None:
        unknown = "; ".join(p.basis for p in (est.weights, est.kv_pool, est.budget) if p.gb is None)
        return warn(f"memory estimate unknown {where}: {unknown}", **data)
    assert budget is not None
    if total is None:  # the KV part unknown, but the rest alone is more than the budget
        return problem(f"the weights {est.weights.gb or 0:.1f} GB + reserve {est.reserve.gb or 0:.1f} GB alone exceed "
                       f"a {budget:.1f} GB budget ({est.budget.basis}) {where}: does not fit", OVER_WEIGHTS_FIX, **data)
    summary = (f"needs ≈ {total:.1f} GB (weights {est.weights.gb:.1f} + KV {est.kv_pool.gb:.1f} + reserve "
               f"{est.reserve.gb:.1f}) of a {budget:.1f} GB budget ({est.budget.basis}) {where}")
    if not est.fits:
        return problem(summary + ": does not fit",
                       "lower serve.max-seq-len or serve.max-batch-size, or a leaner kv-cache-dtype (`--set`)", **data)
    free = _available_now(ctx) if hw.has_accelerator else None  # GPU memory free now: not this class's
    if free is not None:
        data["available_now_gb"] = free
        if free < total:
            return problem(summary + f", but only {free:.1f} GB is free now (other processes hold the rest)",
                           "free the GPU memory first (see the gpu.in-use check)", **data)
        if free < budget:
            return warn(summary + f"; {free:.1f} GB is free now, less than the budget the engine reserves",
                        "free the GPU memory first, or lower resources.memory-utilization", **data)
    return ok(summary, **data)


def _available_now(ctx: Context) -> float | None:
    try:
        samples = ctx.gpus().samples
    except Exception:  # noqa: BLE001 - no GPU facts: the class-level answer stands
        return None
    values = [s.memory.available_bytes for s in samples if s.memory.available_bytes is not None]
    return min(values) / GB if values else None
