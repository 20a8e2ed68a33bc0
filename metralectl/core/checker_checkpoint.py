"""The recipe checker's `checkpoint:` section: the repository, its quantization and revision, and the model
facts (kernels/) behind it."""

from __future__ import annotations

import re
from typing import Any, Protocol

from metralectl.core.checker_serve import Context
from metralectl.core.contract import EngineContract
from metralectl.core.hardware import HardwareClass, ImageInfo, ModelInfo
from metralectl.core.recipe import CheckpointRef
from metralectl.core.schema import Checker, did_you_mean
from metralectl.core.yamlsrc import KeyPath

CHECKPOINT_KEYS = ("repo", "quant", "revision", "model")
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


class World(Protocol):
    """What the checker needs to know about the rest of the catalog."""

    engines: dict[str, EngineContract]
    hardware: dict[str, HardwareClass]
    images: dict[str, ImageInfo]

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
