"""Per-model kernel facts (kernels/<class>/<model>/model.yaml): the model's shape for the memory estimate,
its checkpoints and the kernel targets shipped for it on that hardware class. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from metralectl.core.schema import Checker
from metralectl.core.yamlsrc import Document

_MODEL_KEYS = ("schema", "id", "display-name", "family", "model-type", "architecture", "params-b", "active-params-b",
               "hidden-size", "layers", "attention-layers", "kv-heads", "head-dim", "vision", "mtp", "tool-call-parser",
               "kv-advice", "checkpoints", "targets", "quant-targets", "provenance", "notes")


@dataclass(frozen=True)
class Checkpoint:
    repo: str
    quant: str
    size_gb: float | None = None


@dataclass(frozen=True)
class ModelInfo:
    id: str
    display_name: str
    hardware: str  # the class directory it was declared under
    model_type: str | None
    params_b: float | None
    active_params_b: float | None
    hidden_size: int | None
    layers: int | None
    attention_layers: int | None
    kv_heads: int | None
    head_dim: int | None
    vision: bool
    mtp_supported: bool | None
    default_num_drafts: int | None
    tool_call_parser: str | None
    checkpoints: tuple[Checkpoint, ...]
    targets: tuple[str, ...]
    quant_targets: dict[str, str] = field(default_factory=dict)
    kv_advice: str | None = None
    source: str = ""

    def target_for(self, quant: str) -> str | None:
        """The kernel target quant a checkpoint of this quant runs on (FP8 runs on nvfp4's), if shipped."""
        target = self.quant_targets.get(quant, quant)
        return target if target in self.targets else None

    def checkpoint(self, repo: str) -> Checkpoint | None:
        for ckpt in self.checkpoints:
            if ckpt.repo.lower() == repo.lower():
                return ckpt
        return None


def parse_model(doc: Document, hardware: str) -> tuple[ModelInfo | None, Checker]:
    check = Checker(doc)
    top = check.mapping(doc.data, (), "a model description")
    check.known_keys(top, (), _MODEL_KEYS, "a model description")
    model_id = check.string(top, (), "id")
    mtp = check.mapping(top.get("mtp") or {}, ("mtp",), "mtp")
    checkpoints = []
    for i, raw in enumerate(top.get("checkpoints") or []):
        body = check.mapping(raw, ("checkpoints", i), "a checkpoint")
        check.known_keys(body, ("checkpoints", i), ("repo", "quant", "size-gb", "revision"), "a checkpoint")
        repo = check.string(body, ("checkpoints", i), "repo")
        quant = check.string(body, ("checkpoints", i), "quant")
        if repo and quant:
            checkpoints.append(Checkpoint(repo, quant, _num(check, body, ("checkpoints", i), "size-gb")))
    targets = tuple(check.string_list(top, (), "targets", required=True))
    vision = check.boolean(top, (), "vision", default=False)  # bool("no") would be True
    mtp_supported = check.boolean(mtp, ("mtp",), "supported", nullable=True)  # null: unknown
    quant_targets = check.mapping(top.get("quant-targets") or {}, ("quant-targets",), "quant-targets")
    ints = {k: _whole(check, top, (), k)
            for k in ("hidden-size", "layers", "attention-layers", "kv-heads", "head-dim")}
    if not check.ok or model_id is None:
        return None, check
    return ModelInfo(
        id=model_id, display_name=str(top.get("display-name", model_id)), hardware=hardware,
        model_type=top.get("model-type"), params_b=_num(check, top, (), "params-b"),
        active_params_b=_num(check, top, (), "active-params-b"), hidden_size=ints["hidden-size"],
        layers=ints["layers"], attention_layers=ints["attention-layers"] or ints["layers"],
        kv_heads=ints["kv-heads"], head_dim=ints["head-dim"], vision=vision is True,
        mtp_supported=mtp_supported, default_num_drafts=mtp.get("default-num-drafts"),
        tool_call_parser=top.get("tool-call-parser"), checkpoints=tuple(checkpoints), targets=targets,
        quant_targets={str(k): str(v) for k, v in quant_targets.items()}, kv_advice=top.get("kv-advice"),
        source=doc.path,
    ), check


def _num(check: Checker, data: dict[str, Any], where: tuple, key: str) -> float | None:
    return check.number(data, where, key, required=False, nullable=True, minimum=0)


def _whole(check: Checker, data: dict[str, Any], where: tuple, key: str) -> int | None:
    value = check.number(data, where, key, required=False, nullable=True, minimum=0, integer=True)
    return None if value is None else int(value)  # checked to be an int already
