"""Hardware classes, per-model kernel facts and images (kernels/, images/). Pure, but for the one look on disk for
a build file metralectl ships (shipped_build_file).

A hardware class may inherit another (hopper and b200 inherit gb10): values it does not state, and
the models/kernel targets it does not list, come from its parent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from metralectl.core.schema import Checker
from metralectl.core.yamlsrc import Document

_HW_KEYS = ("schema", "id", "display-name", "inherits", "vendor", "accelerator", "arch", "cpu-arch", "gpu-names",
            "memory", "defaults", "boot-timeout-s", "thermal", "image", "multi-node")
ACCELERATORS = ("gpu", "none")  # none: the engine runs on the host's CPUs, in its RAM (docs/recipes.md)
_MODEL_KEYS = ("schema", "id", "display-name", "family", "model-type", "architecture", "params-b", "active-params-b",
               "hidden-size", "layers", "attention-layers", "kv-heads", "head-dim", "vision", "mtp", "tool-call-parser",
               "kv-advice", "checkpoints", "targets", "quant-targets", "provenance", "notes")
_IMAGE_KEYS = ("schema", "id", "ref", "engine", "hardware", "platform", "min-cuda", "min-driver", "revision-label",
               "tags", "tag-pattern", "build", "certified", "notes")
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")  # Docker's rule for a tag
CPU_ARCHES = ("aarch64", "x86_64")
PLATFORM_OF_ARCH = {"aarch64": "linux/arm64", "x86_64": "linux/amd64"}


@dataclass(frozen=True)
class Sku:
    match: str  # substring of the NVML device name
    total_gb: float | None
    bandwidth_gb_s: float | None


@dataclass(frozen=True)
class ContainerExtras:
    """Devices, capabilities and ulimits a container gets on top of a single-node launch."""

    devices: tuple[str, ...] = ()  # host device paths passed through (`--device`), e.g. /dev/infiniband
    cap_add: tuple[str, ...] = ()  # Linux capabilities (`--cap-add`), e.g. IPC_LOCK
    ulimits: tuple[tuple[str, int, int], ...] = ()  # (name, soft, hard); -1 = unlimited (`--ulimit memlock=-1:-1`)


@dataclass(frozen=True)
class RankProfile:
    """What each rank's container gets in a multi-rank launch on this class (single-node launches: none of it)."""

    base: ContainerExtras = ContainerExtras()  # every rank
    rdma: ContainerExtras = ContainerExtras()  # for NCCL over RDMA; left out under `--no-rdma`
    shm_size: str | None = None  # `--shm-size`, e.g. 32gb
    nccl_env: tuple[tuple[str, str], ...] = ()  # identical on every rank (interface / HCA are added when detected)
    no_rdma_env: tuple[tuple[str, str], ...] = ()  # replaces nccl_env entries under `--no-rdma`

    def extras(self, rdma: bool) -> ContainerExtras:
        if not rdma:
            return self.base
        return ContainerExtras(tuple(dict.fromkeys(self.base.devices + self.rdma.devices)),
                               tuple(dict.fromkeys(self.base.cap_add + self.rdma.cap_add)),
                               self.base.ulimits + tuple(u for u in self.rdma.ulimits
                                                         if u[0] not in {b[0] for b in self.base.ulimits}))


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
    rank_profile: RankProfile | None = None  # from multi-node: container / nccl-env
    accelerator: str = "gpu"  # "none": no GPU is requested, detected or checked; any machine of cpu_arch serves it
    host_memory: bool = False  # memory.host-ram: the engine's memory is this machine's RAM, read when judged

    @property
    def has_accelerator(self) -> bool:
        return self.accelerator != "none"

    def memory_gb(self, gpu_name: str | None = None, host_ram_gb: float | None = None) -> float | None:
        """Memory of the named SKU, else of the smallest SKU (the conservative answer for fit); for a class whose
        memory is the host's RAM, `host_ram_gb` (None: not known)."""
        if self.host_memory:
            return host_ram_gb
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
    build: str | None = None  # a Dockerfile (the engine repository's, or ours in images/) or our build script: built,
    # never pulled
    source: str = ""
    tags: dict[str, str] = field(default_factory=dict)  # tags a recipe may pick (`image-tag:`) -> what each is
    tag_pattern: str | None = None  # other tags a recipe may pick (commit / version tags), as a regex
    certified: bool | None = None  # the engine's own recipes run this image (None: not stated, e.g. your own)
    notes: str = ""

    @property
    def tag(self) -> str:
        last = self.ref.rsplit("/", 1)[-1]
        return last.rsplit(":", 1)[1] if ":" in last and "@" not in self.ref else "latest"

    @property
    def pullable(self) -> bool:
        return self.build is None

    def with_tag(self, tag: str | None) -> ImageInfo:
        """This image under another tag (a recipe's `image-tag:`); itself when tag is None or already its own."""
        if not tag or tag == self.tag or "@" in self.ref:
            return self
        last = self.ref.rsplit("/", 1)[-1]
        repository = self.ref.rsplit(":", 1)[0] if ":" in last else self.ref
        return replace(self, ref=f"{repository}:{tag}")

    def tag_problem(self, tag: str) -> str | None:
        """Why `tag` cannot be picked for this image (None: it can)."""
        if not TAG_RE.fullmatch(tag):
            return f"{tag!r} is not a Docker tag (letters, digits, '_', '.', '-'; at most 128)"
        if tag in self.tags or tag == self.tag:
            return None
        if self.tag_pattern and re.fullmatch(self.tag_pattern, tag):
            return None
        listed = ", ".join(self.tags) or self.tag
        other = " (or a commit / version tag)" if self.tag_pattern else ""
        return f"image {self.id} has no tag {tag!r}; its tags are {listed}{other}"

    def availability(self) -> str:
        """How to get it, in a line: pulled, or built from source (and whether the engine certifies it)."""
        if self.build is not None:
            return ("build from source; not certified by the engine" if self.certified is False
                    else "build from source") + f" ({build_command(self)})"
        return "pulled from its registry" + ("; the engine's own image" if self.certified else "")


def build_command(info: ImageInfo) -> str:
    """The command that builds a from-source image under its ref. Its `build:` names metralectl's own build file,
    shipped beside the description in images/ and run from wherever it is installed: a script (`.sh`, which tags
    the image itself) or a Dockerfile (built with that directory as the context); else a Dockerfile in the engine
    repository (built from a checkout of it)."""
    build = info.build or ""
    if build and " " not in build.strip():
        ours = shipped_build_file(info)
        if ours is not None and ours.suffix == ".sh":
            return f"bash {ours}"
        if ours is not None:
            return f"docker build -f {ours} -t {info.ref} {ours.parent}"
        return f"in a checkout of the engine repository: docker build -f {build} -t {info.ref} ."
    return f"{build} (tag it {info.ref})"


def shipped_build_file(info: ImageInfo) -> Path | None:
    """The file `build:` names when it is metralectl's own: a path relative to the data directory that holds the
    image's description (images/x.yaml -> images/x.Dockerfile, images/build-x.sh), present there. None for an
    engine's."""
    if not info.build or not info.source:
        return None
    from metralectl import paths  # a path lookup, not an import cost: the catalog already imported it

    described = Path(info.source)
    if not described.is_absolute():  # a shipped description is named relative to the data root
        described = paths.data_root() / described
    candidate = described.parent.parent / info.build
    return candidate if candidate.is_file() else None


def _num(check: Checker, data: dict[str, Any], where: tuple, key: str) -> float | None:
    return check.number(data, where, key, required=False, nullable=True, minimum=0)


def _whole(check: Checker, data: dict[str, Any], where: tuple, key: str) -> int | None:
    value = check.number(data, where, key, required=False, nullable=True, minimum=0, integer=True)
    return None if value is None else int(value)  # checked to be an int already


def parse_hardware(doc: Document, parent: HardwareClass | None) -> tuple[HardwareClass | None, Checker]:
    check = Checker(doc)
    top = check.mapping(doc.data, (), "a hardware class")
    check.known_keys(top, (), _HW_KEYS, "a hardware class")
    hw_id = check.string(top, (), "id")
    inherits = check.string(top, (), "inherits", required=False)
    base: dict[str, Any] = {}
    if parent is not None:
        base = {"vendor": parent.vendor, "arch": parent.arch, "cpu_arch": parent.cpu_arch,
                "boot": parent.boot_timeout_s, "park": parent.park_c, "resume": parent.resume_c,
                "accelerator": parent.accelerator}
    accelerator = top.get("accelerator", base.get("accelerator", "gpu"))
    if accelerator not in ACCELERATORS:
        check.error(("accelerator",), f"accelerator must be one of {', '.join(ACCELERATORS)}, not {accelerator!r}")
    memory = check.mapping(top.get("memory", {}), ("memory",), "memory")
    check.known_keys(memory, ("memory",), ("unified", "host-ram", "skus"), "memory")
    host_memory = check.boolean(memory, ("memory",), "host-ram", default=False)  # not `1`: 1 == True in Python
    unified = check.boolean(memory, ("memory",), "unified", default=False)
    if accelerator == "none":
        if top.get("gpu-names"):
            check.error(("gpu-names",), "a class without an accelerator has no GPU names", "remove `gpu-names`")
        if host_memory is not True:
            check.error(("memory",), "a class without an accelerator serves from the host's RAM",
                        "write `memory: {host-ram: true}`")
        if top.get("multi-node"):
            check.error(("multi-node",), "a class without an accelerator has no multi-node launch",
                        "remove `multi-node`")
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
    profile = _rank_profile(check, top.get("multi-node"))
    if not check.ok or hw_id is None:
        return None, check
    return HardwareClass(
        id=hw_id, display_name=str(top.get("display-name", hw_id)), inherits=inherits,
        vendor=str(top.get("vendor", base.get("vendor", ""))), arch=str(top.get("arch", base.get("arch", ""))),
        cpu_arch=str(cpu_arch), gpu_names=tuple(check.string_list(top, (), "gpu-names")),
        unified_memory=unified is True, skus=tuple(skus), boot_timeout_s=float(boot or 0),
        park_c=thermal.get("park-c", base.get("park")), resume_c=thermal.get("resume-c", base.get("resume")),
        image=top.get("image"), defaults=dict(top.get("defaults") or {}),
        multi_node=dict(top.get("multi-node") or {}), source=doc.path, rank_profile=profile,
        accelerator=str(accelerator), host_memory=host_memory is True,
    ), check


_MULTI_KEYS = ("interconnect", "roce-interfaces", "container", "nccl-env", "no-rdma-env")
_EXTRAS_KEYS = ("devices", "cap-add", "ulimits")
_SHM_SIZE = re.compile(r"^\d+(\.\d+)?[bkmg]b?$", re.IGNORECASE)
_CAP = re.compile(r"^[A-Z][A-Z_]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _extras(check: Checker, body: dict[str, Any], where: tuple) -> ContainerExtras:
    devices = tuple(check.string_list(body, where, "devices"))
    for i, device in enumerate(devices):
        if not device.startswith("/dev/"):
            check.error(where + ("devices", i), f"a device is a host path under /dev/, not {device!r}")
    caps = tuple(check.string_list(body, where, "cap-add"))
    for i, cap in enumerate(caps):
        if not _CAP.match(cap):
            check.error(where + ("cap-add", i), f"a capability is written like IPC_LOCK, not {cap!r}")
    ulimits = []
    for name, value in check.mapping(body.get("ulimits") or {}, where + ("ulimits",), "ulimits").items():
        parts = str(value).split(":")
        try:
            soft, hard = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (None, None)
        except ValueError:
            soft, hard = None, None
        if soft is None or hard is None:
            check.error(where + ("ulimits", name), f"a ulimit is SOFT:HARD (-1 = unlimited), not {value!r}")
            continue
        ulimits.append((str(name), soft, hard))
    return ContainerExtras(devices, caps, tuple(ulimits))


def _rank_profile(check: Checker, raw: Any) -> RankProfile | None:
    """multi-node: the container profile and NCCL environment of a multi-rank launch, checked."""
    if raw is None:
        return None
    where: tuple = ("multi-node",)
    body = check.mapping(raw, where, "multi-node")
    check.known_keys(body, where, _MULTI_KEYS, "multi-node")
    box_where = where + ("container",)
    box = check.mapping(body.get("container") or {}, box_where, "multi-node.container")
    check.known_keys(box, box_where, _EXTRAS_KEYS + ("rdma", "shm-size"), "multi-node.container")
    rdma_body = check.mapping(box.get("rdma") or {}, box_where + ("rdma",), "multi-node.container.rdma")
    check.known_keys(rdma_body, box_where + ("rdma",), _EXTRAS_KEYS, "multi-node.container.rdma")
    base, rdma = _extras(check, box, box_where), _extras(check, rdma_body, box_where + ("rdma",))
    shm = box.get("shm-size")
    if shm is not None and not _SHM_SIZE.match(str(shm)):
        check.error(box_where + ("shm-size",), f"shm-size is a size like 32gb, not {shm!r}")
    envs = []
    for key in ("nccl-env", "no-rdma-env"):
        table = check.mapping(body.get(key) or {}, where + (key,), key)
        for name in table:
            if not _ENV_NAME.match(str(name)) or str(name) in ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA"):
                check.error(where + (key, name), f"{name!r} cannot be set here",
                            "NCCL_SOCKET_IFNAME and NCCL_IB_HCA come from the detected link, never from data")
        envs.append(tuple((str(k), "" if v is None else str(v)) for k, v in table.items()))
    return RankProfile(base, rdma, None if shm is None else str(shm), envs[0], envs[1])


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
    tags = _image_tags(check, top.get("tags"))
    pattern = _opt_str(top.get("tag-pattern"))
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            check.error(("tag-pattern",), f"not a valid regular expression: {exc}")
    certified = top.get("certified")
    if certified is not None and not isinstance(certified, bool):
        check.error(("certified",), f"certified is true or false, not {certified!r}")
    if not check.ok or image_id is None or ref is None or platform is None:
        return None, check
    return ImageInfo(
        id=image_id, ref=ref, engine=str(top.get("engine", "metrale")), hardware=tuple(hardware), platform=platform,
        min_cuda=_opt_str(top.get("min-cuda")), min_driver=_opt_str(top.get("min-driver")),
        revision_label=str(top.get("revision-label", "org.opencontainers.image.revision")),
        build=_opt_str(top.get("build")), source=doc.path, tags=tags, tag_pattern=pattern,
        certified=certified if isinstance(certified, bool) else None, notes=str(top.get("notes") or ""),
    ), check


def _image_tags(check: Checker, raw: Any) -> dict[str, str]:
    """`tags:` as a list of names, or a mapping of name -> what the tag is."""
    if raw is None:
        return {}
    items = list(raw.items()) if isinstance(raw, dict) else [(t, "") for t in raw] if isinstance(raw, list) else None
    if items is None:
        check.error(("tags",), "tags is a list of tag names or a mapping of tag -> what it is")
        return {}
    out = {}
    for name, meaning in items:
        if not TAG_RE.fullmatch(str(name)):
            check.error(("tags", str(name)), f"{name!r} is not a Docker tag")
        out[str(name)] = "" if meaning is None else str(meaning)
    return out


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)
