"""The recipe checker: a recipe document in, a validated Recipe (or located problems) out.

Run by `metralectl recipes check` and on every load. Every refusal names the file, line, column,
key, why, and a fix ("did you mean" where one fits).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from collections.abc import Collection
from typing import Any, Protocol, TypeVar

from metralectl.core.checker_sections import check_env, check_source, check_validated
from metralectl.core.contract import EngineContract, FlagSpec
from metralectl.core.engine_revisions import Revision
from metralectl.errors import Problem
from metralectl.core.hardware import HardwareClass, ImageInfo, ModelInfo
from metralectl.core.recipe import CheckpointRef, Rank, Recipe, RecipeOrigin, Resources
from metralectl.core.schema import Checker, did_you_mean, type_name
from metralectl.core.yamlsrc import Document, KeyPath

TOP_KEYS = ("schema", "name", "description", "extends", "engine", "engine-revision", "source", "provenance",
            "checkpoint", "hardware", "image", "image-tag", "serve", "resources", "env", "tags", "validated")
REQUIRED_TOP = ("schema", "name", "description", "engine", "checkpoint", "hardware", "image", "serve",
                "resources", "validated")
CHECKPOINT_KEYS = ("repo", "quant", "revision", "model")
RESOURCE_KEYS = ("port", "bind", "memory-utilization", "gpus", "ranks", "master-port", "tp-size", "ep-size",
                 "nodes", "expose-acknowledged")
RANK_KEYS = ("role", "port", "serve")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


class World(Protocol):
    """What the checker needs to know about the rest of the catalog."""

    engines: dict[str, EngineContract]
    hardware: dict[str, HardwareClass]
    images: dict[str, ImageInfo]

    def models_for(self, hardware: str) -> dict[str, ModelInfo]: ...


@dataclass
class _Context:
    contract: EngineContract | None = None
    revision: Revision | None = None
    hardware: HardwareClass | None = None
    model: ModelInfo | None = None
    quant: str | None = None


def check_recipe(doc: Document, world: World, origin: RecipeOrigin) -> tuple[Recipe | None, list[Problem]]:
    check = Checker(doc)
    top = check.mapping(doc.data, (), "a recipe")
    if not top:
        if isinstance(doc.data, dict) or doc.data is None:
            check.error((), "the recipe is empty", "start from `metralectl show qwen3.5-35b-a3b --yaml`")
        return None, check.problems
    check.known_keys(top, (), TOP_KEYS, "a recipe")
    check.required(top, (), REQUIRED_TOP, "the recipe")
    if "schema" in top and top["schema"] != 1:
        check.error(("schema",), f"unsupported recipe schema {top['schema']!r}", "this metralectl reads `schema: 1`")
    name = check.string(top, (), "name", required=False)
    if name is not None and not NAME_RE.match(name):
        check.error(("name",), f"recipe name {name!r} must be lower-case letters, digits, '.', '_' or '-'")
        name = None
    description = check.string(top, (), "description", required=False) or ""
    ctx = _Context()
    ctx.contract = _engine(check, top, world)
    ctx.revision = _revision(check, top, ctx.contract)
    source, provenance = check_source(check, top)
    ctx.hardware = _hardware(check, top, world)
    image = _image(check, top, world, ctx)
    image_tag = _image_tag(check, top, image)
    checkpoint = _checkpoint(check, top, world, ctx)
    serve = _serve(check, check.mapping(top.get("serve", {}), ("serve",), "serve"), ("serve",), ctx, head=True)
    resources = _resources(check, top, ctx, serve)
    env = check_env(check, top, ctx.contract, ctx.revision)
    tags = tuple(check.string_list(top, (), "tags"))
    validated = check_validated(check, top, world)
    if name and origin.path and origin.kind != "set":
        stem = origin.path.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        if stem != name and origin.kind != "file":
            check.warn(("name",), f"recipe name {name!r} differs from its file name {stem!r}",
                       "name the file after the recipe so `show NAME` and the file agree")
    if not check.ok or None in (name, checkpoint, resources, image, ctx.hardware, ctx.contract, ctx.model,
                                ctx.revision):
        return None, check.problems
    assert name and checkpoint and resources and image and ctx.hardware and ctx.contract and ctx.model
    assert ctx.revision is not None
    recipe = Recipe(
        name=name, description=description, engine=ctx.contract.name, checkpoint=checkpoint, model=ctx.model.id,
        hardware=ctx.hardware.id, image=image.id, serve=serve, resources=resources, env=env, tags=tags,
        validated=validated, origin=origin,
        warnings=tuple(p.render() for p in check.problems if p.severity == "warning"),
        engine_revision=ctx.revision.id, source=source, provenance=provenance, image_tag=image_tag,
    )
    return recipe, check.problems


T = TypeVar("T")


def _named(check: Checker, top: dict[str, Any], key: str, table: dict[str, T], what: str) -> T | None:
    """The catalog entry a top-level key names; an unknown name is a problem with a suggestion."""
    name = check.string(top, (), key, required=False)
    if name is None:
        return None
    if name not in table:
        guess = did_you_mean(name, table)
        check.error((key,), f"unknown {what} {name!r}",
                    f"did you mean `{guess}`?" if guess else f"known: {', '.join(table)}")
        return None
    return table[name]


def _engine(check: Checker, top: dict[str, Any], world: World) -> EngineContract | None:
    return _named(check, top, "engine", world.engines, "engine")


def _revision(check: Checker, top: dict[str, Any], contract: EngineContract | None) -> Revision | None:
    """The engine revision the recipe targets (its release or commit); the contract's default if unnamed."""
    if contract is None:
        return None
    raw = top.get("engine-revision")
    if raw is None:
        revision = contract.revision(None)
        if revision is None:
            check.error((), f"the {contract.display_name} contract names no default revision")
        return revision
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        check.error(("engine-revision",), f"must be a revision name, not {type_name(raw)}")
        return None
    revision = contract.revisions.get(str(raw))
    if revision is None:
        guess = did_you_mean(str(raw), contract.revisions)
        check.error(("engine-revision",), f"unknown {contract.display_name} revision {raw!r}",
                    f"did you mean `{guess}`?" if guess else f"known: {', '.join(contract.revisions)}")
    return revision


def _hardware(check: Checker, top: dict[str, Any], world: World) -> HardwareClass | None:
    return _named(check, top, "hardware", world.hardware, "hardware class")


def _image(check: Checker, top: dict[str, Any], world: World, ctx: _Context) -> ImageInfo | None:
    image = _named(check, top, "image", world.images, "image")
    if image is None:
        return None
    image_id = image.id
    if ctx.hardware and ctx.hardware.id not in image.hardware:
        check.error(("image",), f"image {image_id!r} is built for {', '.join(image.hardware)}, not {ctx.hardware.id}",
                    f"use the {ctx.hardware.id} image `{ctx.hardware.image}`" if ctx.hardware.image else None)
    if ctx.contract and image.engine != ctx.contract.name:
        check.error(("image",), f"image {image_id!r} carries the {image.engine} engine, not {ctx.contract.name}")
    return image


def _image_tag(check: Checker, top: dict[str, Any], image: ImageInfo | None) -> str | None:
    """`image-tag:` — one of the image's tags (images/*.yaml `tags:`), or a commit / version tag it allows."""
    if "image-tag" not in top or top["image-tag"] is None:
        return None
    tag = top["image-tag"]
    if not isinstance(tag, str):
        check.error(("image-tag",), f"image-tag is a tag name, not {type_name(tag)}")
        return None
    if image is None:
        return None
    problem = image.tag_problem(tag)
    if problem:
        check.error(("image-tag",), problem, f"`metralectl images` lists {image.id}'s tags")
        return None
    if not image.pullable and tag != image.tag:
        check.warn(("image-tag",), f"{image.id} is built from source: tag your build {image.with_tag(tag).ref}")
    return tag


def _checkpoint(check: Checker, top: dict[str, Any], world: World, ctx: _Context) -> CheckpointRef | None:
    if "checkpoint" not in top:
        return None
    where: KeyPath = ("checkpoint",)
    body = check.mapping(top["checkpoint"], where, "checkpoint")
    check.known_keys(body, where, CHECKPOINT_KEYS, "checkpoint")
    repo = check.string(body, where, "repo")
    quant = check.string(body, where, "quant")
    revision = check.string(body, where, "revision", required=False, nullable=True)
    if repo and not REPO_RE.match(repo):
        check.error(where + ("repo",), f"{repo!r} is not a Hugging Face repo id", "write it as ORG/NAME")
        repo = None
    quants = ctx.contract.quants if ctx.contract else ()
    if quant and ctx.contract and quant not in quants:
        guess = did_you_mean(quant, quants)
        check.error(where + ("quant",), f"unknown {ctx.contract.display_name} quantization {quant!r}",
                    f"did you mean `{guess}`?" if guess else f"use one of {', '.join(quants)}")
        quant = None
    if revision and not COMMIT_RE.match(revision):
        check.error(where + ("revision",), f"revision {revision!r} is not a commit id",
                    "pin the 40-character commit sha (branches and tags move), or write `revision: null`")
    ctx.quant = quant
    if repo and quant and ctx.hardware and ctx.contract:
        ctx.model = _resolve_model(check, body, world, ctx.hardware, repo, quant, ctx.contract)
    if repo is None or quant is None:
        return None
    fmt = ctx.contract.weights.format if ctx.contract else "safetensors"
    return CheckpointRef(repo=repo, quant=quant, revision=revision or None, format=fmt)


def _resolve_model(check: Checker, body: dict[str, Any], world: World, hw: HardwareClass, repo: str,
                   quant: str, contract: EngineContract) -> ModelInfo | None:
    """The model facts (kernels/) behind the checkpoint. An engine with kernel targets finds its model by the
    checkpoint it lists and must ship a target for the quant; any other engine names the model it serves
    (`checkpoint.model:`), since its checkpoints (a GGUF repository) are not the kernels' own."""
    models = world.models_for(hw.id)
    explicit = body.get("model")
    kernels = contract.has_rule("kernel-targets")
    if explicit is None and not kernels:
        check.error(("checkpoint",), f"a {contract.display_name} recipe names the model it serves: "
                                     "`checkpoint.model: <id>` (its architecture facts, for the memory estimate)",
                    f"known models on {hw.id}: {', '.join(sorted(models))}")
        return None
    if explicit is not None:
        model = models.get(str(explicit))
        if model is None:
            guess = did_you_mean(str(explicit), models)
            check.error(("checkpoint", "model"), f"no kernel model {explicit!r} for hardware {hw.id}",
                        f"did you mean `{guess}`?" if guess else f"known models: {', '.join(sorted(models))}")
            return None
    else:
        model = next((m for m in models.values() if m.checkpoint(repo)), None)
        if model is None:
            check.error(("checkpoint", "repo"), f"no kernel model on {hw.id} is known to serve {repo}",
                        "name the model with `checkpoint.model: <id>` (see kernels/) or add the checkpoint to its model.yaml")
            return None
    if kernels and model.target_for(quant) is None:
        check.error(("checkpoint", "quant"),
                    f"no kernel target for ({hw.id}, {model.id}, {quant}): the image ships {', '.join(model.targets) or 'none'}",
                    "pick a checkpoint in a shipped quantization, or an image that has this target")
    return model


def _serve(check: Checker, body: dict[str, Any], where: KeyPath, ctx: _Context, *, head: bool,
           base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check a serve mapping; with base, body holds per-rank overrides of base."""
    contract, revision = ctx.contract, ctx.revision
    if contract is None or revision is None:
        return {}
    values: dict[str, Any] = dict(base or {})
    written: dict[str, str] = {}  # flag -> the key it was written as (a flag may have several spellings)
    invalid: set[str] = set()  # written but refused: reported once, not also as "missing"
    for key, value in body.items():
        spec = contract.flag(str(key))
        if spec is None:
            _unknown_flag(check, where + (key,), str(key), contract)
            continue
        if spec.name in written:
            check.error(where + (key,), f"--{spec.name} is given twice, as `{written[spec.name]}` and as `{key}`",
                        f"keep one of them (`{spec.name}` is its name)")
            invalid.add(spec.name)
            continue
        written[spec.name] = str(key)
        if spec.name not in revision.specs:
            having = [r.label for r in contract.revisions.values() if spec.name in r.specs]
            check.error(where + (key,), f"--{spec.name} is not a flag of engine revision {revision.label}",
                        f"it is one of {', '.join(having)}: name that revision in `engine-revision:`"
                        if having else None)
            continue
        spec = revision.specs[spec.name]
        if spec.recipe == "resources":
            check.error(where + (key,), f"--{spec.name} is a resource, not a serve setting",
                        f"set it as `resources.{spec.resource}`")
            continue
        if spec.recipe in ("launcher", "forbidden"):
            why = spec.reason or "metralectl sets it itself when it launches the recipe"
            check.error(where + (key,), f"--{spec.name} cannot be set in a recipe: {why}")
            continue
        problem = spec.check_value(value, false_allowed=revision.policy.false_allowed)
        if problem:
            check.error(where + (key,), f"--{spec.name} {problem}", _value_hint(spec, revision))
            invalid.add(spec.name)
            continue
        values[spec.name] = value
    if base is None:
        _required(check, values, where, revision, invalid)
    _relations(check, values, where, contract, ctx)
    return {name: values[name] for name in revision.specs if name in values}


def _unknown_flag(check: Checker, keypath: KeyPath, key: str, contract: EngineContract) -> None:
    bare = key.removeprefix("--")
    if bare != key and contract.flag(bare):
        check.error(keypath, f"write the flag without its dashes: `{bare}:`")
        return
    negated = next((spec for spec in contract.flags.values() if spec.negation == bare), None)
    if negated is not None:
        check.error(keypath, f"--{bare} is written `{negated.name}: false`")
        return
    guess = did_you_mean(bare, list(contract.flags) + list(contract.aliases))
    help_command = " ".join([contract.binary, *contract.serve_command, "--help"])
    check.error(keypath, f"unknown engine flag --{bare} ({contract.display_name} has no such serve flag)",
                f"did you mean `{guess}`?" if guess else f"see `{help_command}` for the flag list")


def _value_hint(spec: FlagSpec, revision: Revision) -> str | None:
    if spec.type == "flag":
        if revision.policy.false_allowed:
            return f"write `{spec.name}: true` (on) or `{spec.name}: false` (off: the flag's absence)"
        return f"write `{spec.name}: true`, or remove the line to keep the default (off)"
    if spec.default is not None:
        return f"the engine default is {spec.default}"
    return spec.help or None


def _is_set(values: dict[str, Any], name: str | None) -> bool:
    """Set = stated with a value; a presence-only flag pinned `false` is the flag's absence."""
    return name is not None and values.get(name) is not None and values.get(name) is not False


def _add_hint(spec: FlagSpec, false_allowed: bool = True) -> str:
    """A line to add that the next check accepts (never `false` where the revision refuses it)."""
    if spec.type == "flag":
        return f"add `{spec.name}: false` (off) or `{spec.name}: true`" if false_allowed else f"add `{spec.name}: true`"
    if spec.default is not None:
        return f"add `{spec.name}: {_yaml_word(spec.default)}` (the engine default) or the value you validated"
    return f"add `{spec.name}: ...` (the value the engine resolves it to for this model)"


def _yaml_word(value: Any) -> str:
    return "true" if value is True else "false" if value is False else str(value)


def _required(check: Checker, values: dict[str, Any], where: KeyPath, revision: Revision,
              invalid: Collection[str] = ()) -> None:
    policy = revision.policy
    rule = {"all": "every settable flag pinned", "listed": f"{', '.join(policy.keys)} stated"}.get(
        policy.required, "every flag with an engine default pinned")
    for spec in revision.specs.values():
        if spec.name in values or spec.name in invalid:
            continue
        if policy.requires(spec):
            check.error(where, f"missing --{spec.name}: engine revision {revision.label} wants {rule} "
                               "(nothing inherited silently)", _add_hint(spec, policy.false_allowed))
        elif spec.trigger and _is_set(values, spec.trigger):
            check.error(where, f"missing --{spec.name}: it must be explicit when {spec.trigger} is set",
                        _add_hint(spec, policy.false_allowed))


def _relations(check: Checker, values: dict[str, Any], where: KeyPath, contract: EngineContract,
               ctx: _Context) -> None:
    for name, value in values.items():
        spec = contract.flags[name]
        key = where + (name,)
        if not _is_set(values, name):
            continue
        for needed in spec.requires:
            if not _is_set(values, needed):
                check.error(key, f"--{name} requires --{needed}", f"set `{needed}: true` or drop `{name}`")
        for other in spec.conflicts:
            if _is_set(values, other):
                check.error(key, f"--{name} conflicts with --{other}", f"keep one of `{name}` and `{other}`")
        if (spec.must_match == "checkpoint-quant" and contract.has_rule("mtp-quant") and ctx.quant
                and value != ctx.quant):
            check.error(key, f"--{name} {value} does not match the checkpoint's quantization {ctx.quant} "
                             "(mixing produces gibberish)", f"write `{name}: {ctx.quant}`")
        if spec.needs_model == "mtp" and value is True and ctx.model is not None:
            if ctx.model.mtp_supported is False:
                check.error(key, f"{ctx.model.display_name} has no MTP weights, so --{name} cannot work",
                            f"remove `{name}: true` (or use self-speculative / ngram-speculative)")
            elif ctx.model.mtp_supported is None:
                check.warn(key, f"whether {ctx.model.display_name} ships MTP weights is unknown")
    drafts = values.get("num-drafts")
    methods = ("speculative", "self-speculative", "ngram-speculative", "dflash")
    if isinstance(drafts, int) and drafts > 1 and not any(_is_set(values, m) for m in methods):
        # validate_serve_args refuses it (stated in the engine's recipes @61e6559)
        check.error(where + ("num-drafts",), f"--num-drafts {drafts} needs a speculative method",
                    "set `speculative: true` (MTP), or `num-drafts: 1`")
    if values.get("fp8-kv-calibration-tokens") and values.get("kv-cache-dtype") not in (None, "fp8"):
        check.error(where + ("fp8-kv-calibration-tokens",), "FP8 KV calibration only applies to kv-cache-dtype fp8",
                    "set it to 0, or use `kv-cache-dtype: fp8`")
    for members, reason in contract.exclusive_groups:
        chosen = [m for m in members if _is_set(values, m)]
        if len(chosen) > 1:
            check.error(where + (chosen[1],), f"only one of {', '.join('--' + m for m in members)} may be set; "
                                             f"this recipe sets {' and '.join(chosen)} ({reason})",
                        f"keep one of {', '.join(chosen)}")


def _resources(check: Checker, top: dict[str, Any], ctx: _Context, serve: dict[str, Any]) -> Resources | None:
    if "resources" not in top:
        return None
    where: KeyPath = ("resources",)
    body = check.mapping(top["resources"], where, "resources")
    check.known_keys(body, where, RESOURCE_KEYS, "resources")
    port = _port(check, body, where, "port")
    bind = check.string(body, where, "bind")
    if bind is not None:
        try:
            address = ipaddress.ip_address(bind)
        except ValueError:
            check.error(where + ("bind",), f"{bind!r} is not an IP address", "use 127.0.0.1 (loopback) or an address of this machine")
            address = None
        if address is not None and not address.is_loopback:
            auth = ctx.contract.auth_flags if ctx.contract else ()
            secured = bool(auth) and all(_is_set(serve, flag) for flag in auth)
            if not secured and body.get("expose-acknowledged") is not True:
                check.error(where + ("bind",), f"bind {bind} exposes the endpoint beyond this machine without auth",
                            f"set {_auth_words(auth)}, or acknowledge the exposure "
                            "with `resources.expose-acknowledged: true`")
    util = _memory_utilization(check, body, where, ctx.contract)
    if util is not None and not 0 <= util <= 1:
        check.error(where + ("memory-utilization",), f"memory-utilization must be in (0, 1], not {util}",
                    "a fraction of the GPU memory, e.g. 0.88")
        util = None
    gpus = body.get("gpus")
    if "gpus" not in body:
        check.error(where, "resources is missing the required key 'gpus'", "add `gpus: all`")
    elif not (gpus in ("all", "none") or (isinstance(gpus, int) and not isinstance(gpus, bool) and gpus >= 1)):
        check.error(where + ("gpus",), f"gpus must be all, none or a positive count, not {type_name(gpus)}")
        gpus = None
    elif gpus != "none" and ctx.hardware is not None and not ctx.hardware.has_accelerator:
        check.error(where + ("gpus",), f"hardware {ctx.hardware.id} has no accelerator: the engine runs on the CPU",
                    "write `gpus: none`")
        gpus = None
    ranks = _ranks(check, body, where, ctx, serve, port)
    multi = ranks is not None and len(ranks) > 1
    if multi and ctx.contract and ctx.contract.multi_rank == "none":
        check.error(where + ("ranks",), f"{ctx.contract.display_name} serves from one process: metralectl launches "
                                        "it on one node", "write `ranks: 1`")
    master_port = _port(check, body, where, "master-port", required=multi)
    sizes = {k: check.number(body, where, k, required=multi, integer=True, minimum=1) for k in ("tp-size", "ep-size", "nodes")}
    if multi and ranks is not None and all(sizes.values()):
        tp, ep, world = int(sizes["tp-size"] or 1), int(sizes["ep-size"] or 1), len(ranks)
        # The engine's rule: world = tp x ep (orthogonal mesh) or tp == ep == world (overlapping groups).
        if world != tp * ep and not (tp == ep == world):
            check.error(where + ("ranks",), f"{world} ranks do not fit tp-size {tp} x ep-size {ep}",
                        "world size must equal tp x ep, or tp == ep == world size (overlapping groups)")
    if ranks is not None and master_port is not None and master_port in {r.port for r in ranks}:
        check.error(where + ("master-port",), f"master-port {master_port} is also a rank's HTTP port",
                    "the ranks' rendezvous needs a port of its own (e.g. 29500)")
    nodes = sizes["nodes"]
    if ranks is not None and nodes is not None:
        world = len(ranks)
        if nodes > world or world % int(nodes):
            check.error(where + ("nodes",), f"{int(nodes)} nodes cannot hold {world} rank(s) evenly",
                        f"write `nodes: {world}` (one rank per node)" if world > 1 else "write `nodes: 1`, or leave it out")
    if body.get("expose-acknowledged") not in (None, True):
        check.error(where + ("expose-acknowledged",), "a boolean key is written `true` or left out")
    if None in (port, bind, util, ranks) or gpus is None or not check.ok:
        return None
    assert port is not None and bind is not None and util is not None and ranks is not None
    return Resources(port=port, bind=bind, memory_utilization=float(util), gpus=gpus, ranks=tuple(ranks),
                     master_port=master_port, tp_size=int(sizes["tp-size"] or 1), ep_size=int(sizes["ep-size"] or 1),
                     nodes=int(sizes["nodes"] or 1), expose_acknowledged=body.get("expose-acknowledged") is True)


def _auth_words(flags: tuple[str, ...]) -> str:
    if not flags:
        return "up authentication in front of it"
    return "serve " + " with ".join(f"`{f}: ...`" for f in flags)


def _memory_utilization(check: Checker, body: dict[str, Any], where: KeyPath,
                        contract: EngineContract | None) -> float | None:
    """The fraction of memory the engine may take; 0.0 stands for "the engine takes none" (llama.cpp), where
    writing one would mislead the fit estimate."""
    if contract is not None and contract.memory_meaning == "none":
        if "memory-utilization" in body:
            check.error(where + ("memory-utilization",), f"{contract.display_name} takes no memory fraction "
                        "(its memory is the weights plus a KV cache of ctx-size tokens, shared by the slots)",
                        "remove it; size memory with serve.ctx-size and serve.parallel")
            return None
        return 0.0
    util = check.number(body, where, "memory-utilization")
    if util == 0:
        check.error(where + ("memory-utilization",), "memory-utilization must be in (0, 1], not 0",
                    "a fraction of the GPU memory, e.g. 0.88")
        return None
    return util


def _port(check: Checker, body: dict[str, Any], where: KeyPath, key: str, required: bool = True) -> int | None:
    value = check.number(body, where, key, required=required, integer=True)
    if value is not None and not 1 <= value <= 65535:
        check.error(where + (key,), f"{key} must be between 1 and 65535, not {value}")
        return None
    return None if value is None else int(value)


def _ranks(check: Checker, body: dict[str, Any], where: KeyPath, ctx: _Context, serve: dict[str, Any],
           port: int | None) -> list[Rank] | None:
    raw = body.get("ranks")
    if raw is None:
        check.error(where, "resources is missing the required key 'ranks'", "add `ranks: 1` for a single-node launch")
        return None
    if raw == 1 and not isinstance(raw, bool):  # `ranks: true` is not a count
        return [Rank(0, "head", port or 0, serve)]
    if isinstance(raw, bool) or not isinstance(raw, list) or not raw:
        check.error(where + ("ranks",), f"ranks must be 1 or a list of ranks, not {type_name(raw)}",
                    "write `ranks: 1`, or `ranks: [{role: head, port: 8888}, {role: worker, port: 8889}]`")
        return None
    ranks: list[Rank] = []
    for i, item in enumerate(raw):
        here = where + ("ranks", i)
        rank_body = check.mapping(item, here, f"rank {i}")
        check.known_keys(rank_body, here, RANK_KEYS, f"rank {i}")
        role = rank_body.get("role")
        expected = "head" if i == 0 else "worker"
        if role != expected:
            check.error(here + ("role",), f"rank {i} must have role {expected}, not {type_name(role)}",
                        "rank 0 is the head (HTTP + scheduler); every later rank is a worker")
        rank_port = _port(check, rank_body, here, "port")
        if i == 0 and port is not None and rank_port is not None and rank_port != port:
            check.error(here + ("port",), f"the head's port {rank_port} differs from resources.port {port}")
        overrides = check.mapping(rank_body.get("serve", {}), here + ("serve",), "rank serve overrides")
        effective = _serve(check, overrides, here + ("serve",), ctx, head=i == 0, base=serve) if overrides else serve
        ranks.append(Rank(i, expected, rank_port or 0, effective))
    ports = [r.port for r in ranks]
    if len(set(ports)) != len(ports):
        check.error(where + ("ranks",), "each rank needs its own port", "e.g. head 8888, worker 8889")
    if ctx.contract:
        for key in ctx.contract.rank_symmetric + ("kv-cache-dtype", "max-seq-len", "max-batch-size"):
            seen = {repr(r.serve.get(key)) for r in ranks}
            if len(seen) > 1:
                check.error(where + ("ranks",), f"ranks differ in --{key} ({', '.join(sorted(seen))}); head and worker "
                                                "must match (else the worker crashes with an SSM intermediate-buffer error)",
                            f"remove the per-rank `{key}` override")
    return ranks
