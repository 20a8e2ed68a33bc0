"""The recipe checker: a recipe document in, a validated Recipe (or located problems) out.

Run by `metralectl recipes check` and on every load. Every refusal names the file, line, column,
key, why, and a fix ("did you mean" where one fits). The sections live beside it: checker_serve
(`serve:`), checker_checkpoint (`checkpoint:`), checker_sections (`env:`, `validated:`, `source:`) and
checker_text (names, dates, control characters).
"""

from __future__ import annotations

import ipaddress
from typing import Any, TypeVar

from metralectl.core import checker_text as text
from metralectl.core.checker_checkpoint import World, check_checkpoint
from metralectl.core.checker_engine_config import check_engine_config
from metralectl.core.checker_sections import check_env, check_source, check_validated
from metralectl.core.checker_serve import Context, _add_hint, _is_set, check_serve
from metralectl.core.contract import EngineContract
from metralectl.core.engine_revisions import Revision
from metralectl.core.fit import parallel_sizes, parallel_words
from metralectl.errors import Problem
from metralectl.core.hardware import HardwareClass
from metralectl.core.image_info import ImageInfo
from metralectl.core.recipe import RUNTIMES, Rank, Recipe, RecipeOrigin, Resources
from metralectl.core.schema import Checker, did_you_mean, type_name
from metralectl.core.yamlsrc import Document, KeyPath
from metralectl.wording import count, noun

__all__ = ["World", "check_recipe", "_add_hint"]

TOP_KEYS = ("schema", "name", "description", "extends", "engine", "engine-revision", "source", "provenance",
            "checkpoint", "hardware", "image", "image-tag", "runtime", "serve", "engine-config", "resources", "env", "tags",
            "validated")
REQUIRED_TOP = ("schema", "name", "description", "engine", "checkpoint", "hardware", "image", "serve",
                "resources", "validated")
RESOURCE_KEYS = ("port", "bind", "memory-utilization", "gpus", "ranks", "master-port", "tp-size", "ep-size",
                 "nodes", "expose-acknowledged")
RANK_KEYS = ("role", "port", "serve")


def check_recipe(doc: Document, world: World, origin: RecipeOrigin) -> tuple[Recipe | None, list[Problem]]:
    check = Checker(doc)
    top = check.mapping(doc.data, (), "a recipe")
    if not top:
        if isinstance(doc.data, dict) or doc.data is None:
            check.error((), "the recipe is empty", "start from `metralectl show qwen3.5-35b-a3b --yaml`")
        return None, check.problems
    check.known_keys(top, (), TOP_KEYS, "a recipe")
    check.required(top, (), REQUIRED_TOP, "the recipe")
    text.check_text(check, top)
    if "schema" in top and (type(top["schema"]) is not int or top["schema"] != 1):  # not `true`, not 1.0
        check.error(("schema",), f"unsupported recipe schema {type_name(top['schema'])}", "this metralectl reads `schema: 1`")
    name = check.string(top, (), "name", required=False)
    if name is not None:
        name = text.recipe_name(check, ("name",), name)
    description = check.string(top, (), "description", required=False) or ""
    ctx = Context()
    ctx.contract = _engine(check, top, world)
    ctx.revision = _revision(check, top, ctx.contract)
    source, provenance = check_source(check, top)
    ctx.hardware = _hardware(check, top, world)
    image = _image(check, top, world, ctx)
    image_tag = _image_tag(check, top, image)
    checkpoint = check_checkpoint(check, top, world, ctx)
    serve = check_serve(check, check.mapping(top.get("serve", {}), ("serve",), "serve"), ("serve",), ctx, head=True)
    resources = _resources(check, top, ctx, serve)
    runtime = _runtime(check, top, ctx.contract, resources)
    env = check_env(check, top, ctx.contract, ctx.revision)
    engine_config = check_engine_config(check, top, ctx.contract)
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
        runtime=runtime, engine_config=engine_config,
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


def _image(check: Checker, top: dict[str, Any], world: World, ctx: Context) -> ImageInfo | None:
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


def _runtime(check: Checker, top: dict[str, Any], contract: EngineContract | None,
             resources: Resources | None) -> str:
    """`runtime:` docker (the default) or process: a host process needs the engine file to say how it starts, and
    runs one rank on this machine."""
    raw = top.get("runtime")
    if raw is None:
        return "docker"
    if not isinstance(raw, str) or raw not in RUNTIMES:
        guess = did_you_mean(str(raw), RUNTIMES) if isinstance(raw, str) else None
        check.error(("runtime",), f"unknown runtime {type_name(raw)}",
                    f"did you mean `{guess}`?" if guess else "write `runtime: docker` or `runtime: process`")
        return "docker"
    if raw == "process" and contract is not None and contract.process is None:
        check.error(("runtime",), f"the {contract.display_name} engine file does not say how to start it as a host "
                    "process", f"add a `process:` section to engine/{contract.name}.yaml (docs/engines.md), or write "
                    "`runtime: docker`")
    if raw == "process" and resources is not None and resources.world_size > 1:
        check.error(("runtime",), "runtime: process runs one engine process on this machine; a multi-rank recipe runs "
                    "its ranks in containers on their nodes", "write `runtime: docker` (or leave it out)")
    return raw


def _resources(check: Checker, top: dict[str, Any], ctx: Context, serve: dict[str, Any]) -> Resources | None:
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
    if isinstance(gpus, int) and not isinstance(gpus, bool) and ctx.contract is not None:
        _gpus_for_parallel(check, where, gpus, serve, ctx.contract)
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
            check.error(where + ("ranks",), f"{count(world, 'rank')} {noun(world, 'does', 'do')} not fit tp-size {tp} x ep-size {ep}",
                        "world size must equal tp x ep, or tp == ep == world size (overlapping groups)")
    if ranks is not None and master_port is not None and master_port in {r.port for r in ranks}:
        check.error(where + ("master-port",), f"master-port {master_port} is also a rank's HTTP port",
                    "the ranks' rendezvous needs a port of its own (e.g. 29500)")
    nodes = sizes["nodes"]
    if ranks is not None and nodes is not None:
        world = len(ranks)
        if nodes > world or world % int(nodes):
            check.error(where + ("nodes",), f"{count(int(nodes), 'node')} cannot hold {count(world, 'rank')} evenly",
                        f"write `nodes: {world}` (one rank per node)" if world > 1 else "write `nodes: 1`, or leave it out")
    acknowledged = body.get("expose-acknowledged")
    if acknowledged is not None and acknowledged is not True:  # identity: `1` == True in Python, not in YAML
        check.error(where + ("expose-acknowledged",), f"a boolean key is written `true` or left out, not "
                                                      f"{type_name(acknowledged)}",
                    "write `expose-acknowledged: true` (unquoted), or remove the line")
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


def _gpus_for_parallel(check: Checker, where: KeyPath, gpus: int, serve: dict[str, Any],
                       contract: EngineContract) -> None:
    """A count of GPUs below what the serve settings spread the model over: the engine would fail at start."""
    tp, pp = parallel_sizes(serve, contract.fit_roles)
    if gpus < tp * pp:
        roles = contract.fit_roles
        check.error(where + ("gpus",), f"gpus: {gpus} gives the engine {count(gpus, 'GPU')}, but "
                                       f"serve's {parallel_words(roles, tp, pp)} spreads the model over {tp * pp}",
                    f"write `gpus: {tp * pp}` (or `gpus: all`)")


def _ranks(check: Checker, body: dict[str, Any], where: KeyPath, ctx: Context, serve: dict[str, Any],
           port: int | None) -> list[Rank] | None:
    raw = body.get("ranks")
    if raw is None:
        check.error(where, "resources is missing the required key 'ranks'", "add `ranks: 1` for a single-node launch")
        return None
    if type(raw) is int and raw == 1:  # `ranks: true` and `ranks: 1.0` are not a count
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
        effective = check_serve(check, overrides, here + ("serve",), ctx, head=i == 0, base=serve) if overrides else serve
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
