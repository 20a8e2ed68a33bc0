"""The validated recipe value. Built only by the checker (metralectl.core.checker)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# How a recipe's engine is started (`runtime:`): in a Docker container (the default), or as a process on this
# machine's host (the engine file's `process:` section says how; docs/serving.md, "Running engines without Docker").
RUNTIMES = ("docker", "process")


@dataclass(frozen=True)
class CheckpointRef:
    repo: str
    quant: str
    revision: str | None  # a pinned commit, or None (pull records what it resolved to)
    format: str = "safetensors"  # the engine's weights format: safetensors (the snapshot) | gguf (quant's files)


@dataclass(frozen=True)
class Rank:
    index: int
    role: str  # "head" | "worker"
    port: int
    serve: dict[str, Any]  # the effective serve settings of this rank


@dataclass(frozen=True)
class Resources:
    port: int
    bind: str
    memory_utilization: float
    gpus: str | int  # "all", "none" or a count
    ranks: tuple[Rank, ...]
    master_port: int | None = None
    tp_size: int = 1
    ep_size: int = 1
    nodes: int = 1
    expose_acknowledged: bool = False

    @property
    def world_size(self) -> int:
        return len(self.ranks)


@dataclass(frozen=True)
class Validated:
    source: str | None = None
    engine_revision: str | None = None
    hardware: str | None = None
    date: str | None = None
    decode_tok_s: float | None = None
    image: str | None = None
    notes: str | None = None


@dataclass(frozen=True)
class Provenance:
    """Where an engine recipe came from: the upstream file this one re-expresses."""

    repo: str  # e.g. Metrale/metrale-inference
    path: str  # the upstream file, e.g. recipes/qwen3.5/qwen3.5-35b-a3b-nvfp4.yaml
    commit: str
    sha256: str  # of the upstream file's bytes
    taken: str | None = None  # YYYY-MM-DD
    release: str | None = None  # the engine release it shipped in, when known
    deviations: tuple[tuple[str, str, str, str], ...] = ()  # (key, upstream value, ours, why)


@dataclass(frozen=True)
class RecipeOrigin:
    kind: str  # "shipped" | "synced" | "user" | "file"
    path: str
    overrides: str | None = None  # path of the shipped (or synced) recipe this one replaces
    extends: str | None = None  # name of the recipe this one was built on
    release: str | None = None  # for a synced recipe: the engine release it came with


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    engine: str
    checkpoint: CheckpointRef
    model: str  # kernel model id the checkpoint resolves to
    hardware: str
    image: str  # image id
    serve: dict[str, Any]  # engine flag name -> value (head rank / single rank)
    resources: Resources
    env: dict[str, str]
    tags: tuple[str, ...]
    validated: Validated
    origin: RecipeOrigin
    deviations: tuple[tuple[str, Any, Any], ...] = ()  # (key, validated value, new value) from --set
    warnings: tuple[str, ...] = field(default=(), compare=False)
    engine_revision: str = ""  # the engine revision (release or commit) it targets and is checked against
    source: str | None = None  # "engine" (re-expressed from the engine's own recipe) | "book" | None
    provenance: Provenance | None = None
    image_tag: str | None = None  # `image-tag:`: run the image under this tag instead of its ref's
    runtime: str = "docker"  # RUNTIMES: a container, or a host process
    engine_config: dict[str, Any] = field(default_factory=dict)  # `engine-config:`, the engine's generated file

    @property
    def multi_rank(self) -> bool:
        return self.resources.world_size > 1

    @property
    def mtp(self) -> bool:
        return self.serve.get("speculative") is True
