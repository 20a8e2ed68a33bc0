"""The EP=2 profile against the real Docker daemon (no second node needed): the daemon takes the profile as
rendered (a 32 GB /dev/shm next to --ipc=host; IPC_LOCK and an unlimited memlock where the daemon may grant
them), and a node without /dev/infiniband, or a daemon that may not raise RLIMIT_MEMLOCK, gets metralectl's
explanation and fix, not the daemon's bare words."""

from __future__ import annotations

import os
import uuid
from dataclasses import replace

import pytest

from metralectl.core.render import LABEL_RUN_ID
from metralectl.seams.docker.errors import MEMLOCK_HINT, RDMA_HINT, RuntimeFailure
from metralectl.seams.docker.runtime import DockerRuntime
from tests.unit.recipe_helpers import catalog

pytestmark = [pytest.mark.docker, pytest.mark.integration]


@pytest.fixture()
def ep2_spec(engine_images: dict[str, str]):  # type: ignore[no-untyped-def]
    from metralectl.core.render import spec_for

    cat = catalog()
    catalog_spec = spec_for(cat, cat.recipes["qwen3.5-122b-a10b-ep2"], rank=1, master_addr="127.0.0.1",
                            roce_interface="lo", gpus_override=None)
    return replace(catalog_spec, name=f"metralectl-ep2profile-{uuid.uuid4().hex[:6]}", image=engine_images["ok"],
                   command=("--version",))


def _cleanup(runtime: DockerRuntime, name: str) -> None:
    info = runtime.inspect(name)
    if info is not None:
        runtime.remove(info.id, force=True)


def _daemon_may_raise_memlock() -> bool:
    """dockerd needs CAP_SYS_RESOURCE to give a container an unlimited memlock (not so in a nested daemon)."""
    import subprocess

    pid = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True).stdout.split()
    try:
        caps = next(line for line in open(f"/proc/{pid[0]}/status") if line.startswith("CapEff:"))
    except (IndexError, OSError, StopIteration):
        return True  # not visible from here: assume a host daemon
    return bool(int(caps.split()[1], 16) & (1 << 24))  # CAP_SYS_RESOURCE


def test_the_daemon_takes_the_no_rdma_profile_as_rendered(ep2_spec) -> None:  # type: ignore[no-untyped-def]
    from metralectl.core.render import spec_for

    cat = catalog()
    plain = spec_for(cat, cat.recipes["qwen3.5-122b-a10b-ep2"], rank=1, master_addr="127.0.0.1", roce_interface="lo",
                     gpus_override=None, rdma=False)
    spec = replace(ep2_spec, devices=plain.devices, cap_add=plain.cap_add, ulimits=plain.ulimits, env=plain.env)
    runtime = DockerRuntime()
    try:
        info = runtime.create_and_start(spec, {LABEL_RUN_ID: "ep2-profile-test"})
        host = runtime.api.inspect_container(info.id)["HostConfig"]
        assert host["IpcMode"] == "host" and host["ShmSize"] == 32 * 1024 ** 3
        assert not host.get("CapAdd") and not host.get("Ulimits") and not host.get("Devices")
    finally:
        _cleanup(runtime, spec.name)
        runtime.close()


def test_the_rdma_profile_without_the_device(ep2_spec) -> None:  # type: ignore[no-untyped-def]
    """IPC_LOCK and memlock=-1:-1 as rendered: taken by a host daemon, explained where the daemon may not."""
    runtime = DockerRuntime()
    spec = replace(ep2_spec, devices=())  # this machine has no /dev/infiniband (see the next test)
    try:
        if not _daemon_may_raise_memlock():
            with pytest.raises(RuntimeFailure) as refused:
                runtime.create_and_start(spec, {LABEL_RUN_ID: "ep2-profile-test"})
            assert refused.value.hint == MEMLOCK_HINT and runtime.inspect(spec.name) is None
            return
        info = runtime.create_and_start(spec, {LABEL_RUN_ID: "ep2-profile-test"})
        host = runtime.api.inspect_container(info.id)["HostConfig"]
        assert host["CapAdd"] == ["IPC_LOCK"] and host["Ulimits"] == [{"Name": "memlock", "Soft": -1, "Hard": -1}]
    finally:
        _cleanup(runtime, spec.name)
        runtime.close()


@pytest.mark.skipif(os.path.exists("/dev/infiniband"), reason="this machine has RDMA devices")
def test_a_missing_rdma_device_is_explained(ep2_spec) -> None:  # type: ignore[no-untyped-def]
    runtime = DockerRuntime()
    try:
        with pytest.raises(RuntimeFailure) as refused:
            runtime.create_and_start(ep2_spec, {LABEL_RUN_ID: "ep2-profile-test"})
        assert "/dev/infiniband" in refused.value.message and refused.value.hint == RDMA_HINT
        assert runtime.inspect(ep2_spec.name) is None  # nothing left behind
    finally:
        _cleanup(runtime, ep2_spec.name)
        runtime.close()
