"""Hardware classes (kernels/<class>/hardware.yaml): memory SKUs, thermal lines, the CPU architecture, and
what each rank's container gets in a multi-rank launch. Pure. The models on a class are core.model_info's,
the images core.image_info's.

A hardware class may inherit another (hopper and b200 inherit gb10): values it does not state, and
the models/kernel targets it does not list, come from its parent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from metralectl.core.schema import Checker
from metralectl.core.yamlsrc import Document

_HW_KEYS = ("schema", "id", "display-name", "inherits", "vendor", "accelerator", "arch", "cpu-arch", "gpu-names",
            "memory", "defaults", "boot-timeout-s", "thermal", "image", "multi-node")
ACCELERATORS = ("gpu", "none")  # none: the engine runs on the host's CPUs, in its RAM (docs/recipes.md)
CPU_ARCHES = ("aarch64", "x86_64")


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
        where: tuple = ("memory", "skus", i)
        body = check.mapping(raw, where, "a memory SKU")
        check.known_keys(body, where, ("match", "total-gb", "bandwidth-gb-s"), "a memory SKU")
        total, bandwidth = (check.number(body, where, key, required=False, nullable=True, minimum=0)
                            for key in ("total-gb", "bandwidth-gb-s"))
        skus.append(Sku(str(body.get("match", "")), total, bandwidth))
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


_MULTI_KEYS = ("interconnect", "roce-interfaces", "link-mbps", "mtu", "container", "nccl-env", "no-rdma-env")
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
    for key, low, high in (("link-mbps", 1, 10_000_000), ("mtu", 1280, 65535)):  # doctor --peer's expectations
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high):
            check.error(where + (key,), f"{key} is a whole number from {low} to {high}, not {value!r}")
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
