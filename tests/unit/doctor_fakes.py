"""Fakes at doctor's seams: a fake runtime (the DockerRuntime surface doctor uses), the fake pynvml under a
real NvmlProbe, a fake /proc, and an all-ok Context builder that each test bends into its failure."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metralectl.core.catalog import Catalog
from metralectl.doctor.context import Context, Identity
from metralectl.seams.gpu import NvmlProbe
from metralectl.seams.docker_runtime import (ContainerInfo, DockerUnavailable, Endpoint, ImageState, RuntimeFailure,
                                             refusal_cause)
from tests.unit import fake_pynvml as fk
from tests.unit.recipe_helpers import catalog as shipped_catalog

GiB = 1024**3
TEST_UID = os.getuid() or 1000  # as root, test files are chowned to 1000 so "alice" owns them
DOCKER_GID = 999
HOPPER_IMAGE = "metrale/metrale-inference-hopper:latest"
MEMINFO = "MemTotal:       131000000 kB\nMemFree:         2000000 kB\nMemAvailable:   100000000 kB\n"


def identity(home: Path, **kw: Any) -> Identity:
    base: dict[str, Any] = dict(uid=TEST_UID, euid=TEST_UID, gid=TEST_UID, user="alice", group="alice", home=home,
                                groups=(TEST_UID, DOCKER_GID), docker_gid=DOCKER_GID, docker_listed=True)
    base.update(kw)
    return Identity(**base)


@dataclass
class FakeRuntime:
    """What doctor calls on a DockerRuntime, answering from fields."""

    endpoint: Endpoint = field(default_factory=lambda: Endpoint("unix:///var/run/docker.sock", "default"))
    version: str = "27.3.1"
    runtimes: tuple[str, ...] = ("nvidia", "runc")
    cdi_dirs: tuple[str, ...] = ()
    images: dict[str, ImageState] = field(default_factory=dict)
    running: list[ContainerInfo] = field(default_factory=list)
    pids: dict[str, set[int]] = field(default_factory=dict)  # container id -> host pids
    start_error: str | None = None
    exit_code: int | None = 0
    output: tuple[str, ...] = ("met 1.0.0-beta-preview",)
    created: list[Any] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    closed: int = 0

    def server_version(self) -> str:
        return self.version

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ServerVersion": self.version, "Runtimes": {r: {"path": r} for r in self.runtimes},
                               "DefaultRuntime": "runc"}
        if self.cdi_dirs:
            out["CDISpecDirs"] = list(self.cdi_dirs)
        return out

    def image_state(self, ref: str, revision_label: str = "") -> ImageState:
        return self.images.get(ref, ImageState(ref, False))

    def containers(self, *, managed_only: bool = True, all_states: bool = True) -> list[ContainerInfo]:
        return list(self.running)

    def create_and_start(self, spec: Any, extra_labels: Any = None) -> ContainerInfo:
        self.created.append(spec)
        if self.start_error:
            # classified as the seam classifies the daemon's words: doctor reads only the cause
            raise RuntimeFailure(refusal_cause(500, self.start_error), self.start_error,
                                 "install the NVIDIA container toolkit")
        return container(spec.name, cid="c" * 64, labels=dict(spec.labels))

    def wait_exit(self, name_or_id: str, timeout_s: float) -> int | None:
        return self.exit_code

    def log_tail(self, name_or_id: str, lines: int = 50) -> list[str]:
        return list(self.output)

    def remove(self, name_or_id: str, *, force: bool = False) -> None:
        self.removed.append(name_or_id)

    def close(self) -> None:
        self.closed += 1


def container(name: str, cid: str = "a" * 64, labels: dict[str, str] | None = None) -> ContainerInfo:
    return ContainerInfo(cid, name, HOPPER_IMAGE, "running", None, False, None, None,
                         labels if labels is not None else {"ai.metrale.metralectl.managed": "true"})


def image(ref: str = HOPPER_IMAGE, platform: str = "linux/amd64", revision: str | None = "abc123") -> ImageState:
    return ImageState(ref, True, "sha256:" + "1" * 64, revision, platform)


def unavailable(cause: str, message: str = "", hint: str = "a hint") -> DockerUnavailable:
    return DockerUnavailable(cause, message or f"docker is {cause}", hint)


def raising(exc: BaseException) -> Any:
    def factory() -> Any:
        raise exc

    return factory


def probe_factory(devices: list[fk.FakeDevice], meminfo: Path, **kw: Any) -> Any:
    def factory(classes: tuple[tuple[str, str], ...], unified: frozenset[str]) -> NvmlProbe:
        return NvmlProbe(nvml=fk.make_fake(devices, **kw), gpu_classes=classes, unified_classes=unified,
                         meminfo_path=meminfo)

    return factory


def no_gpu(meminfo: Path) -> Any:
    return probe_factory([], meminfo, init_error=fk.LibraryNotFound)


def fake_proc(root: Path, pid: int, comm: str, container_id: str | None = None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "comm").write_text(comm + "\n")
    cgroup = f"0::/system.slice/docker-{container_id}.scope\n" if container_id else "0::/user.slice/user-1000.slice\n"
    (d / "cgroup").write_text(cgroup)


def chown_tree(path: Path, uid: int = TEST_UID) -> None:
    if os.geteuid() != 0:
        return
    for dirpath, dirnames, filenames in os.walk(path):
        os.lchown(dirpath, uid, uid)
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, uid)


@dataclass(frozen=True)
class Usage:
    total: int
    used: int
    free: int


def disk(free_gb: float) -> Any:
    return lambda path: Usage(2000 * 10**9, 0, int(free_gb * 10**9))


def in_use(host: str, port: int) -> OSError:
    return OSError(errno.EADDRINUSE, "Address already in use")


def fake_which(found: dict[str, str]) -> Any:
    """shutil.which over a fixed table; with path=, only a program whose directory is that PATH entry."""
    def which(name: str, mode: int = 0, path: str | None = None) -> str | None:
        hit = found.get(name)
        if hit is None or (path is not None and os.path.dirname(hit) != path.rstrip("/")):
            return None
        return hit

    return which


def make_ctx(tmp_path: Path, **kw: Any) -> Context:
    """A machine where everything is fine: alice in the docker group, a daemon with the nvidia runtime and the
    Hopper image, one H200 on a CUDA 13 driver, x86_64, a writable HF cache, metralectl on PATH, port free."""
    home = tmp_path / "home" / "alice"
    (home / ".local" / "bin").mkdir(parents=True, exist_ok=True)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    proc = tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    runtime = kw.pop("runtime", None) or FakeRuntime(images={HOPPER_IMAGE: image()})
    catalog: Catalog = kw.pop("catalog", None) or shipped_catalog()
    bin_dir = str(home / ".local" / "bin")
    defaults: dict[str, Any] = dict(
        environ={"PATH": f"/usr/bin:{bin_dir}", "HOME": str(home), "SHELL": "/bin/bash"},
        identity=identity(home),
        runtime_factory=lambda: runtime,
        gpu_probe_factory=probe_factory([fk.FakeDevice()], meminfo),
        catalog_loader=lambda: catalog,
        container_pids=lambda rt, cid: set(rt.pids.get(cid, set())),
        which=fake_which({"docker": "/usr/bin/docker", "metralectl": os.path.join(bin_dir, "metralectl")}),
        cpu_arch=lambda: "x86_64",
        proc_gpu_names=lambda: [],
        port_probe=lambda host, port: None,
        port_holder=lambda port: {},
        endpoint=lambda: ("unix:///var/run/docker.sock", "default"),
        disk_usage=disk(500),
        agent_view=lambda: {"pid": 4321, "port": 8897, "status": {"can_run": True, "summary": "ready: Docker, GPU runtime and GPU answer"}},
        proc_root=proc,
    )
    defaults.update(kw)
    return Context(**defaults)
