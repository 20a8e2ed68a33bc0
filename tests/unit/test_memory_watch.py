"""After a stop, GPU memory is watched by the container's host PIDs — including on GB10 (unified)."""

from __future__ import annotations

import itertools

from metralectl.seams.gpu import NvmlProbe
from metralectl.lifecycle.memory import NvmlMemoryWatch
from metralectl.seams.docker.containers import ContainerInfo
from tests.fakes.runtime import FakeRuntime
from tests.unit import fake_pynvml as fk

CONTAINER = ContainerInfo("c1", "metralectl-x", "img", "running", None, False, None, None, {})


def _runtime() -> FakeRuntime:
    """The container runs as host PIDs 4242 and 4243."""
    rt = FakeRuntime()
    rt.seed(CONTAINER, pids=(4242, 4243))
    return rt


def _watch(device: fk.FakeDevice, wait_s: float = 0.3) -> NvmlMemoryWatch:
    watch = NvmlMemoryWatch(_runtime(), wait_s=wait_s, poll_s=0.01,
                            probe_factory=lambda: NvmlProbe(nvml=fk.make_fake([device])))
    watch.before(CONTAINER)
    return watch


def test_memory_returns_once_the_containers_processes_leave_the_gpu_on_gb10() -> None:
    readings = itertools.chain([[(4242, 30 * fk.GiB), (999, fk.GiB)]] * 3, itertools.repeat([(999, fk.GiB)]))
    device = fk.gb10(compute_procs=lambda: next(readings))  # memory NotSupported: only per-process figures
    assert _watch(device).after(CONTAINER) == "returned"  # PID 999 is not ours: it does not count


def test_memory_still_held_is_reported_with_the_pids() -> None:
    device = fk.FakeDevice(compute_procs=[(4243, 2 * fk.GiB)])
    answer = _watch(device, wait_s=0.05).after(CONTAINER)
    assert answer.startswith("still held: 2.1 GB by PIDs [4243]")


def test_no_nvml_is_not_a_failure() -> None:
    watch = NvmlMemoryWatch(_runtime(), probe_factory=lambda: NvmlProbe(
        nvml=fk.make_fake([], init_error=fk.LibraryNotFound)))
    watch.before(CONTAINER)
    assert watch.after(CONTAINER).startswith("not checked: no GPU here (no NVIDIA driver")  # plainly: nothing passed


def test_the_docker_runtime_reads_the_pids_from_docker_top() -> None:
    from metralectl.seams.docker.runtime import DockerRuntime
    class Api:
        def top(self, _: str, ps_args: str = "") -> dict[str, object]:
            return {"Titles": ["UID", "PID"], "Processes": [["0", "4242"], ["0", "4243"], ["0", "?"]]}

    runtime = DockerRuntime.__new__(DockerRuntime)  # no daemon: only the answer of `docker top` is read
    runtime.api = Api()
    assert runtime.container_pids("c1") == {4242, 4243}


def test_a_stop_whose_processes_were_not_known_is_not_a_pass() -> None:
    """No PID noted before the stop (the runtime gave none): "none holds memory" would prove nothing."""
    rt = FakeRuntime()
    rt.seed(CONTAINER)  # no PIDs
    device = fk.FakeDevice(compute_procs=[(4243, 2 * fk.GiB)])
    watch = NvmlMemoryWatch(rt, wait_s=0.05, probe_factory=lambda: NvmlProbe(nvml=fk.make_fake([device])))
    watch.before(CONTAINER)
    assert watch.after(CONTAINER) == "not checked (its processes were not known before the stop)"


def test_a_host_process_s_gpu_memory_is_watched_by_its_engine_s_pids() -> None:
    """A real host process (the process runtime, its supervisor, a stand-in engine): its pids are what the watch
    notes before the stop, and NVML listing them while they live is "still held", gone after the stop "returned"."""
    import os
    import shutil

    from metralectl.core.render import ContainerSpec
    from metralectl.lifecycle.local_runtime import LocalRuntime
    from metralectl.seams.process.runtime import ProcessRuntime

    sleep = shutil.which("sleep")
    assert sleep is not None
    spec = ContainerSpec("metralectl-gpu-watch", f"process:{sleep}", (sleep, "120"),
                         labels={"ai.metrale.metralectl.managed": "true"})
    local = LocalRuntime(None, ProcessRuntime())
    info = local.create_and_start(spec)
    try:
        pids = local.container_pids(info.id)
        assert pids and all(os.path.exists(f"/proc/{pid}") for pid in pids)
        alive = lambda: [(pid, fk.GiB) for pid in pids if os.path.exists(f"/proc/{pid}")]  # noqa: E731
        probe = lambda: NvmlProbe(nvml=fk.make_fake([fk.FakeDevice(compute_procs=alive)]))  # noqa: E731
        held = NvmlMemoryWatch(local, wait_s=0.05, poll_s=0.01, probe_factory=probe)
        held.before(info)
        assert held.after(info).startswith(f"still held: 1.1 GB by PIDs {sorted(pids)}")  # not stopped yet
        watch = NvmlMemoryWatch(local, wait_s=10, poll_s=0.05, probe_factory=probe)
        watch.before(info)
        local.stop(info.id, timeout_s=5)
        assert watch.after(info) == "returned"
    finally:
        local.remove(info.id, force=True)
