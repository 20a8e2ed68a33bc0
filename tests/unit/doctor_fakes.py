"""Fakes at doctor's seams: the shared fake runtime set up as doctor's daemon, the fake pynvml under a
real NvmlProbe, a fake /proc, and an all-ok Context builder that each test bends into its failure."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metralectl.core.catalog import Catalog
from metralectl.doctor.context import Context
from metralectl.doctor.identity import Identity
from metralectl.seams.gpu import NvmlProbe
from metralectl.core.labels import LABEL_MANAGED, LABEL_OWNER
from metralectl.core.render import owner
from metralectl.seams.docker.containers import ContainerInfo
from metralectl.seams.docker.endpoints import Endpoint
from metralectl.seams.docker.errors import DockerUnavailable
from metralectl.seams.docker.images import ImageState
from tests.fakes.runtime import Boot, Exit, Log
from tests.fakes.runtime import FakeRuntime as SharedFakeRuntime
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


class FakeRuntime(SharedFakeRuntime):
    """The shared fake runtime (tests/fakes/runtime.py) set up as doctor's daemon: by default Docker 27.3.1 with
    the nvidia runtime, where the GPU probe container (`IMAGE --version`) prints `output` and exits `exit_code`
    (None: it never exits), or the daemon refuses to start it with `start_error`."""

    def __init__(self, *, endpoint: Endpoint | None = None, version: str = "27.3.1",
                 runtimes: tuple[str, ...] = ("nvidia", "runc"), cdi_dirs: tuple[str, ...] = (),
                 images: dict[str, ImageState] | None = None, running: list[ContainerInfo] | tuple[()] = (),
                 pids: dict[str, set[int]] | None = None, start_error: str | None = None, exit_code: int | None = 0,
                 output: tuple[str, ...] = ("met 1.0.0-beta-preview",)) -> None:
        info: dict[str, Any] = {"ServerVersion": version, "Runtimes": {r: {"path": r} for r in runtimes},
                                "DefaultRuntime": "runc"}
        if cdi_dirs:
            info["CDISpecDirs"] = list(cdi_dirs)
        probe = Boot(tuple(Log(line) for line in output) + ((Exit(exit_code),) if exit_code is not None else ()),
                     start_error=start_error)
        super().__init__(images=images or {}, endpoint=endpoint, version=version, info=info, default_boot=probe)
        for c in running:
            self.seed(c, pids=(pids or {}).get(c.id, ()))


def container(name: str, cid: str = "a" * 64, labels: dict[str, str] | None = None) -> ContainerInfo:
    """One of this user's running metralectl containers (unless other labels are given)."""
    return ContainerInfo(cid, name, HOPPER_IMAGE, "running", None, False, None, None,
                         labels if labels is not None else {LABEL_MANAGED: "true", LABEL_OWNER: owner()})


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


def fake_proc(root: Path, pid: int, comm: str, container_id: str | None = None, cmdline: str | None = None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "comm").write_text(comm + "\n")
    if cmdline is not None:
        (d / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")
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
        container_pids=lambda rt, cid: rt.container_pids(cid),
        which=fake_which({"docker": "/usr/bin/docker", "metralectl": os.path.join(bin_dir, "metralectl")}),
        cpu_arch=lambda: "x86_64",
        proc_gpu_names=lambda: [],
        port_probe=lambda host, port: None,
        port_holder=lambda port: {},
        endpoint=lambda: ("unix:///var/run/docker.sock", "default"),
        disk_usage=disk(500),
        agent_view=lambda: {"pid": 4321, "port": 8897, "status": {"can_run": True, "summary": "ready: Docker, GPU runtime and GPU answer"}},
        agent_unit=lambda: False,  # no systemd user unit: `metralectl agent start` is the remedy
        proc_root=proc,
    )
    defaults.update(kw)
    return Context(**defaults)
