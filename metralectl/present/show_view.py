"""How `show` presents a recipe (text and JSON)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from metralectl.core.catalog import Catalog
from metralectl.core.fit import MemoryEstimate, Part, estimate
from metralectl.core.recipe import Recipe
from metralectl.core.render import ContainerSpec
from metralectl.errors import MetralError
from metralectl.safetext import clean


def est_meaning(catalog: Catalog, recipe: Recipe) -> str:
    return catalog.engines[recipe.engine].memory_meaning


def _estimate(catalog: Catalog, recipe: Recipe) -> MemoryEstimate:
    hardware = catalog.hardware[recipe.hardware]
    ram = None
    if hardware.host_memory:  # the budget is this machine's RAM
        from metralectl.seams import machine
        ram = machine.host_memory_gb()
    return estimate(recipe, catalog.model_of(recipe), hardware,
                    memory_meaning=catalog.engines[recipe.engine].memory_meaning, host_ram_gb=ram,
                    roles=catalog.engines[recipe.engine].fit_roles)


def _yaml_word(value: object) -> str:
    """A serve value as the recipe writes it: `true`/`false`, not Python's `True`/`False`."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _gb(part: Part) -> str:
    return f"{part.gb:7.2f} GB" if part.gb is not None else "      ? GB"


def as_text(catalog: Catalog, recipe: Recipe) -> str:
    from metralectl.seams.hf import state as hfstate
    model = catalog.model_of(recipe)
    hw = catalog.hardware[recipe.hardware]
    image = catalog.image_for(recipe)
    v = recipe.validated
    engine = engine_of(catalog, recipe)
    lines = [f"{recipe.name} — {clean(recipe.description)}",
             f"  engine        {clean(engine['display_name'] or '')} ({clean(recipe.engine)}), revision "
             f"{clean(engine['revision'] or 'not named')}"
             + (f" (commit {engine['commit'][:12]})" if engine["commit"] and not engine["commit"].startswith(
                engine["revision"] or "-") else ""),
             ""]
    lines += ["Provenance"] + _provenance(catalog, recipe)
    lines.append(f"  validated     {v.decode_tok_s if v.decode_tok_s is not None else '-'} tok/s decode on "
                 f"{v.hardware or '?'}; engine revision {v.engine_revision or 'not recorded'}; date {v.date or 'not recorded'}")
    if v.source:
        lines.append(f"  source        {v.source}")
    for key, old, new in recipe.deviations:
        lines.append(f"  DEVIATION     {key}: {old} -> {new} (not what was validated)")
    cache = hfstate.checkpoint_state(recipe.checkpoint)
    lines += ["", "Checkpoint"]
    lines.append(f"  repo          {recipe.checkpoint.repo} @ {recipe.checkpoint.revision or 'unpinned'}")
    if catalog.engines[recipe.engine].has_rule("kernel-targets"):
        lines.append(f"  quant         {recipe.checkpoint.quant} (kernel target {model.target_for(recipe.checkpoint.quant)})")
    else:
        lines.append(f"  quant         {recipe.checkpoint.quant} (the {recipe.checkpoint.format} file or files of that quant)")
    lines.append(f"  model         {model.display_name} ({model.model_type or 'model_type unknown'}); "
                 f"MTP {'yes' if model.mtp_supported else 'no' if model.mtp_supported is False else 'unknown'}")
    lines.append(f"  local cache   {cache.status}: {cache.detail}")
    if cache.paths:  # a GGUF quant: the file(s) llama-server loads
        more = f" (+{len(cache.paths) - 1} more parts)" if len(cache.paths) > 1 else ""
        lines.append(f"  gguf file     {clean(cache.paths[0])}{more}")
    lines += ["", "Hardware and image"]
    lines.append(f"  hardware      {hw.display_name} ({hw.arch}, {hw.cpu_arch}, "
                 f"{'host RAM' if hw.host_memory else 'unified memory' if hw.unified_memory else 'GPU memory'}); "
                 f"boot timeout {hw.boot_timeout_s:g} s")
    needs = (f"; CUDA ≥ {image.min_cuda or '?'}, driver ≥ {image.min_driver or '?'}" if hw.has_accelerator
             else "; no GPU")
    lines.append(f"  image         {image.ref} ({image.platform}{needs})")
    lines.append(f"  obtained      {image.availability()}")
    tags = ", ".join(image.tags) + (" or a commit / version tag" if image.tag_pattern else "")
    if len(image.tags) > 1 or image.tag_pattern:
        lines.append(f"  tags          {tags}; pick one with `image-tag: TAG` or `--set image-tag=TAG`")
    lines += ["", "Serve settings"]
    width = max([26, *map(len, recipe.serve)]) + 2  # values in one column, at least two spaces after any key
    for key, value in recipe.serve.items():
        lines.append(f"  {key:<{width}}{_yaml_word(value)}")
    r = recipe.resources
    lines += ["", "Resources"]
    util = "none (the engine takes no fraction)" if est_meaning(catalog, recipe) == "none" else f"{r.memory_utilization:g}"
    lines.append(f"  port {r.port}, bind {r.bind}, memory-utilization {util}, gpus {r.gpus}, "
                 f"ranks {r.world_size}" + (f" (tp {r.tp_size} × ep {r.ep_size}, master-port {r.master_port})" if recipe.multi_rank else ""))
    if recipe.env:
        lines += ["", "Environment"] + [f"  {k}={val}" for k, val in recipe.env.items()]
    est = _estimate(catalog, recipe)
    lines += ["", f"Memory estimate (on {hw.id})"]
    for part in (est.weights, est.kv_pool, est.reserve):
        lines.append(f"  {part.label:<10}{_gb(part)}   {part.basis}")
    total = f"{est.total_gb:7.2f} GB" if est.total_gb is not None else "      ? GB"
    lines.append(f"  {'total':<10}{total}")
    lines.append(f"  {'budget':<10}{_gb(est.budget)}   {est.budget.basis}")
    verdict = {True: f"fits ({est.headroom_gb:.1f} GB headroom)" if est.headroom_gb is not None else "fits",
               False: f"does NOT fit (short by {'at least ' if est.total_gb is None else ''}"
                      f"{-(est.headroom_gb or 0):.1f} GB)", None: "unknown"}[est.fits]
    lines.append(f"  verdict   {verdict}")
    for rank in range(recipe.resources.world_size):
        title = "Command" if not recipe.multi_rank else f"Command (rank {rank}, {recipe.resources.ranks[rank].role})"
        if recipe.runtime == "process":
            title += " (a host process: runtime process)"
        try:
            lines += ["", title, _command(catalog, recipe, rank)]
        except MetralError as exc:  # a host process whose program is not on this machine: say so, show the rest
            lines += ["", title, f"  cannot be rendered here: {exc.message}" + (f" ({exc.hint})" if exc.hint else "")]
    return "\n".join(shown(line) for line in lines)


def _specs(catalog: Catalog, recipe: Recipe) -> list[ContainerSpec]:
    from metralectl.lifecycle.specs import spec_here

    return [spec_here(catalog, recipe, rank=rank) for rank in range(recipe.resources.world_size)]


def _command(catalog: Catalog, recipe: Recipe, rank: int) -> str:
    from metralectl.lifecycle.specs import command_text, spec_here

    return command_text(spec_here(catalog, recipe, rank=rank))


_CONTINUED = " \\\n  "  # docker_run_command's own line break between options
_FILE_END = "\nMETRALECTL_EOF\n"  # the end of the generated file's lines (core/engine_config.py files_text)


def shown(line: str) -> str:
    """One line of `show`, escaped as a whole (a user's or a synced recipe's strings: its description,
    validated.source, a serve value, an env value, the command that quotes them); the command keeps the
    line breaks docker_run_command put between its options, and a generated file's lines before it (its text is
    YAML that yaml.safe_dump wrote: a control character in a value is escaped there)."""
    files, marker, start = line.partition(_FILE_END) if line.startswith("mkdir -p ") else ("", "", line)
    head = "\n".join(clean(part) for part in (files + marker).split("\n")) if marker else ""
    return head + _CONTINUED.join(clean(part) for part in start.split(_CONTINUED))


def _provenance(catalog: Catalog, recipe: Recipe) -> list[str]:
    origin = recipe.origin
    kind = f"synced from engine release {origin.release}" if origin.kind == "synced" else origin.kind
    lines = [f"  file          {origin.path} ({kind})"]
    if origin.overrides:
        lines.append(f"  overrides     {origin.overrides}")
    if origin.extends:
        lines.append(f"  extends       {origin.extends}")
    if recipe.source == "book":
        lines.append("  source        the engine book (the engine has no recipe for this)")
    prov = recipe.provenance
    if prov is not None:
        lines.append(f"  engine recipe {clean(prov.repo)} {clean(prov.path)} @ {prov.commit[:7]}")
        lines.append(f"                sha256 {prov.sha256}, taken {prov.taken or 'date not recorded'}"
                     + (f", release {clean(prov.release)}" if prov.release else ""))
        for key, upstream, ours, why in prov.deviations:
            lines.append(f"  deviates      {clean(key)}: {clean(upstream)} -> {clean(ours)} ({clean(why)})")
    revision = catalog.engines[recipe.engine].revision(recipe.engine_revision)
    if revision is not None:
        rule = {"all": "every settable flag pinned",
                "listed": f"{', '.join(revision.policy.keys)} stated"}.get(revision.policy.required,
                                                                         "every flag with an engine default pinned")
        false = "`false` allowed" if revision.policy.false_allowed else "`false` refused"
        lines.append(f"  targets       engine revision {revision.label} (commit {revision.commit[:12]}; {rule}, {false})")
    return lines


def engine_of(catalog: Catalog, recipe: Recipe) -> dict[str, str | None]:
    """The engine the recipe runs on: its short name (engine/<name>.yaml), display name, and the revision it
    targets (the release label, else the recipe's `engine-revision:`, else the engine's default) and its commit."""
    contract = catalog.engines[recipe.engine]
    revision = contract.revision(recipe.engine_revision)
    return {"name": recipe.engine, "display_name": contract.display_name,
            "revision": revision.label if revision is not None else (recipe.engine_revision or None),
            "commit": revision.commit if revision is not None else None}


def to_json(catalog: Catalog, recipe: Recipe) -> dict[str, Any]:
    est = _estimate(catalog, recipe)
    from metralectl.lifecycle.specs import command_text

    try:
        specs, command_error = _specs(catalog, recipe), None
    except MetralError as exc:  # a host process whose program is not on this machine
        specs, command_error = [], exc.message
    image = catalog.image_for(recipe)
    return {
        "recipe": asdict(recipe),
        "engine": engine_of(catalog, recipe),
        "image": {"id": image.id, "ref": image.ref, "pullable": image.pullable, "certified": image.certified,
                  "availability": image.availability(), "tags": dict(image.tags), "tag_pattern": image.tag_pattern},
        "memory": {**asdict(est), "total_gb": est.total_gb, "fits": est.fits},
        "runtime": recipe.runtime,
        "commands": [command_text(s) for s in specs],
        "container_specs": [asdict(s) for s in specs],
        **({"command_error": command_error} if command_error else {}),
    }
