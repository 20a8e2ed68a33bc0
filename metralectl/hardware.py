"""Hardware classes, per-model kernel facts and images (kernels/, images/). Pure.

A hardware class may inherit another (hopper and b200 inherit gb10): values it does not state, and
the models/kernel targets it does not list, come from its parent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from metralectl.schema import Checker
from metralectl.yamlsrc import Document

_HW_KEYS = ("schema", "id", "display-name", "inherits", "vendor", "arch", "cpu-arch", "gpu-names", "memory",
            "defaults", "boot-timeout-s", "thermal", "image", "multi-node")
_MODEL_KEYS = ("schema", "id", "display-name", "family", "model-type", "architecture", "params-b", "active-params-b",
               "hidden-size", "layers", "attention-layers", "kv-heads", "head-dim", "vision", "mtp", "tool-call-parser",
               "kv-advice", "checkpoints", "targets", "quant-targets", "provenance", "notes")
_IMAGE_KEYS = ("schema", "id", "ref", "engine", "hardware", "platform", "min-cuda", "min-driver", "revision-label",
               "tags", "build", "notes")
CPU_ARCHES = ("aarch64", "x86_64")
PLATFORM_OF_ARCH = {"aarch64": "linux/arm64", "x86_64": "linux/amd64"}


@dataclass(frozen=True)
class Sku:
    match: str  # substring of the NVML device name
    total_gb: float | None
    bandwidth_gb_s: float | None


@dataclass(frozen=True)
class HardwareClass:
    id: str
    display_name: str
    inherits: str | None
    vendor: str
    arch: str
    cpu_arch: str
    gpu_names: tuple[str, ...]
    unified_memory: bool
    skus: tuple[Sku, ...]
    boot_timeout_s: float
    park_c: float | None
    resume_c: float | None
    image: str | None
    defaults: dict[str, Any] = field(default_factory=dict)
    multi_node: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    def memory_gb(self, gpu_name: str | None = None) -> float | None:
        """Memory of the named SKU, else of the smallest SKU (the conservative answer for fit)."""
        if gpu_name:
            for sku in self.skus:
                if sku.match.lower() in gpu_name.lower():
                    return sku.total_gb
        sizes = [s.total_gb for s in self.skus if s.total_gb]
        return min(sizes) if sizes else None


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


@dataclass(frozen=True)
class ImageInfo:
    id: str
    ref: str
    engine: str
    hardware: tuple[str, ...]
    platform: str
    min_cuda: str | None
    min_driver: str | None
    revision_label: str
    build: str | None = None
    source: str = ""


def _num(check: Checker, data: dict[str, Any], where: tuple, key: str, integer: bool = False) -> Any:
    return check.number(data, where, key, required=False, nullable=True, minimum=0, integer=integer)


def parse_hardware(doc: Document, parent: HardwareClass | None) -> tuple[HardwareClass | None, Checker]:
    check = Checker(doc)
    top = check.mapping(doc.data, (), "a hardware class")
    check.known_keys(top, (), _HW_KEYS, "a hardware class")
    hw_id = check.string(top, (), "id")
    inherits = check.string(top, (), "inherits", required=False)
    base: dict[str, Any] = {}
    if parent is not None:
        base = {"vendor": parent.vendor, "arch": parent.arch, "cpu_arch": parent.cpu_arch,
                "boot": parent.boot_timeout_s, "park": parent.park_c, "resume": parent.resume_c}
    memory = check.mapping(top.get("memory", {}), ("memory",), "memory")
    skus = []
    for i, raw in enumerate(memory.get("skus") or []):
        body = check.mapping(raw, ("memory", "skus", i), "a memory SKU")
        check.known_keys(body, ("memory", "skus", i), ("match", "total-gb", "bandwidth-gb-s"), "a memory SKU")
        skus.append(Sku(str(body.get("match", "")), _num(check, body, ("memory", "skus", i), "total-gb"),
                        _num(check, body, ("memory", "skus", i), "bandwidth-gb-s")))
    if not skus and parent is not None:
        skus = list(parent.skus)
    thermal = check.mapping(top.get("thermal", {}), ("thermal",), "thermal")
    cpu_arch = top.get("cpu-arch", base.get("cpu_arch"))
    if cpu_arch not in CPU_ARCHES:
        check.error(("cpu-arch",), f"cpu-arch must be one of {', '.join(CPU_ARCHES)}, not {cpu_arch!r}")
    boot = top.get("boot-timeout-s", base.get("boot"))
    if not isinstance(boot, (int, float)) or isinstance(boot, bool) or boot <= 0:
        check.error(("boot-timeout-s",), "boot-timeout-s must be a positive number of seconds (or inherited)")
    if not check.ok or hw_id is None:
        return None, check
    return HardwareClass(
        id=hw_id, display_name=str(top.get("display-name", hw_id)), inherits=inherits,
        vendor=str(top.get("vendor", base.get("vendor", ""))), arch=str(top.get("arch", base.get("arch", ""))),
        cpu_arch=str(cpu_arch), gpu_names=tuple(check.string_list(top, (), "gpu-names")),
        unified_memory=bool(memory.get("unified", False)), skus=tuple(skus), boot_timeout_s=float(boot or 0),
        park_c=thermal.get("park-c", base.get("park")), resume_c=thermal.get("resume-c", base.get("resume")),
        image=top.get("image"), defaults=dict(top.get("defaults") or {}),
        multi_node=dict(top.get("multi-node") or {}), source=doc.path,
    ), check


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
    quant_targets = check.mapping(top.get("quant-targets") or {}, ("quant-targets",), "quant-targets")
    ints = {k: _num(check, top, (), k, integer=True)
            for k in ("hidden-size", "layers", "attention-layers", "kv-heads", "head-dim")}
    if not check.ok or model_id is None:
        return None, check
    return ModelInfo(
        id=model_id, display_name=str(top.get("display-name", model_id)), hardware=hardware,
        model_type=top.get("model-type"), params_b=_num(check, top, (), "params-b"),
        active_params_b=_num(check, top, (), "active-params-b"), hidden_size=ints["hidden-size"],
        layers=ints["layers"], attention_layers=ints["attention-layers"] or ints["layers"],
        kv_heads=ints["kv-heads"], head_dim=ints["head-dim"], vision=bool(top.get("vision", False)),
        mtp_supported=mtp.get("supported"), default_num_drafts=mtp.get("default-num-drafts"),
        tool_call_parser=top.get("tool-call-parser"), checkpoints=tuple(checkpoints), targets=targets,
        quant_targets={str(k): str(v) for k, v in quant_targets.items()}, kv_advice=top.get("kv-advice"),
        source=doc.path,
    ), check


def parse_image(doc: Document) -> tuple[ImageInfo | None, Checker]:
    check = Checker(doc)
    top = check.mapping(doc.data, (), "an image description")
    check.known_keys(top, (), _IMAGE_KEYS, "an image description")
    image_id = check.string(top, (), "id")
    ref = check.string(top, (), "ref")
    platform = check.string(top, (), "platform")
    if platform and platform not in PLATFORM_OF_ARCH.values():
        check.error(("platform",), f"unknown platform {platform!r}", f"use one of {', '.join(PLATFORM_OF_ARCH.values())}")
    hardware = check.string_list(top, (), "hardware", required=True)
    if not check.ok or image_id is None or ref is None or platform is None:
        return None, check
    return ImageInfo(
        id=image_id, ref=ref, engine=str(top.get("engine", "metrale")), hardware=tuple(hardware), platform=platform,
        min_cuda=_opt_str(top.get("min-cuda")), min_driver=_opt_str(top.get("min-driver")),
        revision_label=str(top.get("revision-label", "org.opencontainers.image.revision")),
        build=_opt_str(top.get("build")), source=doc.path,
    ), check


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)
