"""The recipe checker's `checkpoint:` section: the repository, its quantization and revision, and the model
facts (kernels/) behind it, held to what kernels/ says each listed checkpoint is."""

from __future__ import annotations

from typing import Any, Protocol

from metralectl.core import checker_text as text
from metralectl.core.checker_serve import Context
from metralectl.core.contract import EngineContract
from metralectl.core.hardware import HardwareClass
from metralectl.core.image_info import ImageInfo
from metralectl.core.model_info import ModelInfo
from metralectl.core.recipe import CheckpointRef
from metralectl.core.schema import Checker, did_you_mean
from metralectl.core.yamlsrc import KeyPath

CHECKPOINT_KEYS = ("repo", "quant", "revision", "model")


class World(Protocol):
    """What the checker needs to know about the rest of the catalog."""

    engines: dict[str, EngineContract]
    hardware: dict[str, HardwareClass]
    images: dict[str, ImageInfo]
    models: dict[str, dict[str, ModelInfo]]  # hardware class -> model id -> facts (each class's own)

    def models_for(self, hardware: str) -> dict[str, ModelInfo]: ...


def check_checkpoint(check: Checker, top: dict[str, Any], world: World, ctx: Context) -> CheckpointRef | None:
    if "checkpoint" not in top:
        return None
    where: KeyPath = ("checkpoint",)
    body = check.mapping(top["checkpoint"], where, "checkpoint")
    check.known_keys(body, where, CHECKPOINT_KEYS, "checkpoint")
    repo = check.string(body, where, "repo")
    quant = check.string(body, where, "quant")
    revision = check.string(body, where, "revision", required=False, nullable=True)
    if repo:
        repo = text.checkpoint_repo(check, where + ("repo",), repo)
    quants = ctx.contract.quants if ctx.contract else ()
    if quant and ctx.contract and quant not in quants:
        guess = did_you_mean(quant, quants)
        check.error(where + ("quant",), f"unknown {ctx.contract.display_name} quantization {quant!r}",
                    f"did you mean `{guess}`?" if guess else f"use one of {', '.join(quants)}")
        quant = None
    if revision:
        text.commit(check, where + ("revision",), revision,
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
    explicit = check.string(body, ("checkpoint",), "model", required=False)
    kernels = contract.has_rule("kernel-targets")
    if "model" not in body and not kernels:
        check.error(("checkpoint",), f"a {contract.display_name} recipe names the model it serves: "
                                     "`checkpoint.model: <id>` (its architecture facts, for the memory estimate)",
                    f"known models on {hw.id}: {', '.join(sorted(models))}")
        return None
    if "model" in body and explicit is None:
        return None  # not a string: reported by check.string
    if explicit is not None:
        model = models.get(explicit)
        if model is None:
            guess = did_you_mean(explicit, models)
            check.error(("checkpoint", "model"), f"no kernel model {explicit!r} for hardware {hw.id}",
                        f"did you mean `{guess}`?" if guess else f"known models: {', '.join(sorted(models))}")
            return None
    else:
        model = next((m for m in models.values() if m.checkpoint(repo)), None)
        if model is None:
            check.error(("checkpoint", "repo"), f"no kernel model on {hw.id} is known to serve {repo}",
                        "name the model with `checkpoint.model: <id>` (see kernels/) or add the checkpoint to its model.yaml")
            return None
    if _contradicts_kernels(check, world, repo, quant, explicit, contract, kernels):
        return None
    if kernels and model.target_for(quant) is None:
        check.error(("checkpoint", "quant"),
                    f"no kernel target for ({hw.id}, {model.id}, {quant}): the image ships {', '.join(model.targets) or 'none'}",
                    "pick a checkpoint in a shipped quantization, or an image that has this target")
    return model


def _contradicts_kernels(check: Checker, world: World, repo: str, quant: str, explicit: str | None,
                         contract: EngineContract, kernels: bool) -> bool:
    """Whether the recipe says its checkpoint is something kernels/ says it is not: another model's, or (for
    a format whose repository is one quantization, safetensors) another quantization. A GGUF repository
    holds one file per quant, so a quant kernels/ does not list for it is no contradiction."""
    listed = [(hw_id, m) for hw_id, table in sorted(world.models.items()) for m in table.values() if m.checkpoint(repo)]
    if not listed:
        return False
    found = False
    owners = sorted({m.id for _, m in listed})
    if explicit is not None and explicit not in owners:
        check.error(("checkpoint", "model"),
                    f"checkpoint.model {explicit!r} contradicts the checkpoint: kernels/ lists {repo} as a "
                    f"checkpoint of {', '.join(owners)} ({_files(listed)}), so the memory estimate and the "
                    "MTP and kernel-target checks would use another model's facts",
                    "remove `model:` (kernels/ names the checkpoint's model)" if kernels else f"write `model: {owners[0]}`")
        found = True
    if contract.weights.format == "safetensors":
        stated = sorted({ckpt.quant for _, m in listed for ckpt in m.checkpoints if ckpt.repo.lower() == repo.lower()})
        if quant not in stated:
            check.error(("checkpoint", "quant"),
                        f"{repo} is listed with quant {' / '.join(stated)} ({_files(listed)}), not {quant}: the "
                        "MTP head's quantization and the kernel target would follow the wrong one",
                        f"write `quant: {stated[0]}`, or pick a {quant} checkpoint")
            found = True
    return found


def _files(listed: list[tuple[str, ModelInfo]]) -> str:
    return ", ".join(f"kernels/{hw_id}/{m.id}/model.yaml" for hw_id, m in listed)
