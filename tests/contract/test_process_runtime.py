"""What only the host-process runtime has to get right, with real processes: a recorded pid that another process
holds now is never signalled nor reported as ours (nor is another user's process, whose identity matches in all
but its owner); a killed supervisor leaves `ps` truthful and `stop` working; the engine gets exactly its spec's
environment plus the allow-list, and no secret value lands in the state file; an interrupted start leaves no process
and no state; the endpoint's dispatch, and the Docker-only calls' answers for host processes. (Logs:
test_process_logs.py.)

Written to hold on a busy machine beside other tests (docs/development.md, "Tests that hold on a busy box"): every
launch has a name of its own, which stands in the argv of its supervisor, of its workload and of the workload's
child, so a test looks only at its own processes; what a test waits for is a state it can see, never a time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metralectl.core.labels import LABEL_MANAGED, LABEL_OWNER, LABEL_RECIPE, owner
from metralectl.core.render import ContainerSpec
from metralectl.errors import MetralError
from metralectl.seams.docker.endpoints import Endpoint
from metralectl.seams.docker.errors import RuntimeFailure
from metralectl.seams.docker.runtime import open_runtime
from metralectl.seams.process import PROCESS_ENDPOINT_URL, group, launch, state
from metralectl.seams.process.runtime import ProcessRuntime
from tests.contract.conftest import WORKLOAD, proc_alive

LABELS = {LABEL_MANAGED: "true", LABEL_OWNER: owner(), LABEL_RECIPE: "proc"}


def unique(tag: str) -> str:
    """A launch name no other test (nor another worker running this one) uses."""
    return f"metralectl-pr-{tag}-{uuid.uuid4().hex[:8]}"


def _spec(*args: str, name: str, env: dict[str, str] | None = None) -> ContainerSpec:
    """The workload under `name`, which it carries in its argv (and its child's) as --mark."""
    exe = sys.executable
    return ContainerSpec(name=name, image=f"process:{exe}", command=(exe, "-u", str(WORKLOAD), "--mark", name, *args),
                         env=env or {}, labels=LABELS, gpus=None)


def _until(condition: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s")


def _pids_running(name: str) -> list[int]:
    """The running processes of this launch: those with `name` as an argument of their own (its supervisor and log
    writer, the workload and its child; never another launch's, whoever runs it)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if name.encode() in argv and proc_alive(int(entry)):
                found.append(int(entry))
    return found


@pytest.fixture()
def signals_sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int]]]:
    """Every signal this process sends while the test runs, as (pid, signal): the ways group.py signals (os.kill,
    os.killpg, signal.pidfd_send_signal, whose pid is read from the pidfd's fdinfo), each passed on."""
    sent: list[tuple[int, int]] = []
    kill, killpg, pidfd_send = os.kill, os.killpg, signal.pidfd_send_signal

    def by_pidfd(fd: int, sig: int, *rest: Any) -> None:
        pid = next(int(line.split()[1]) for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines()
                   if line.startswith("Pid:"))
        sent.append((pid, sig))
        pidfd_send(fd, sig, *rest)

    monkeypatch.setattr(os, "kill", lambda pid, sig: (sent.append((pid, sig)), kill(pid, sig))[1])
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: (sent.append((-pgid, sig)), killpg(pgid, sig))[1])
    monkeypatch.setattr(signal, "pidfd_send_signal", by_pidfd)
    yield sent


def _signalled(sent: list[tuple[int, int]], pid: int) -> list[int]:
    """The signals (other than 0, which only asks) sent to pid or to a group it leads."""
    return [sig for target, sig in sent if abs(target) == pid and sig != 0]


@pytest.fixture()
def rt() -> Any:
    runtime = ProcessRuntime()
    yield runtime
    for info in runtime.containers(managed_only=False):
        runtime.remove(info.id, force=True)


# --- a recycled pid is never ours -------------------------------------------------------------------------------
def _stale_state(name: str, engine: dict[str, Any]) -> None:
    record = {"schema": state.SCHEMA, "name": name, "launch": "20200101T000000-deadbeef", "image": "process:/bin/x",
              "argv": ["/bin/x"], "labels": LABELS, "owner_uid": os.geteuid(), "engine": engine,
              "supervisor": None, "started_at": "2020-01-01T00:00:00.000000000Z", "exit": None, "log": f"{name}/x.log"}
    with state.locked() as owned:
        state.write(record, owned)


@pytest.mark.parametrize("differs", ["start_ticks", "exe", "boot_id"])
def test_a_state_whose_pid_another_process_holds_now_is_gone_and_that_process_is_never_signalled(
        rt: ProcessRuntime, differs: str, signals_sent: list[tuple[int, int]]) -> None:
    other = subprocess.Popen(["sleep", "300"])  # ours, alive: as a recycled pid would be
    try:
        engine = group.identity_of(other.pid)
        assert engine is not None
        engine[differs] = {"start_ticks": engine["start_ticks"] + 1, "exe": "/usr/bin/not-sleep",
                           "boot_id": "another-boot"}[differs]
        name = unique("stale")
        _stale_state(name, engine)
        info = rt.inspect(name)
        assert info is not None and info.status == "exited" and not info.running and info.exit_code is None
        assert rt.containers(all_states=False) == [] and rt.container_pids(name) == set()
        rt.stop(name, timeout_s=0.5)
        rt.kill(name)
        rt.remove(name)  # not running: removed without force
        assert rt.inspect(name) is None
        assert _signalled(signals_sent, other.pid) == [], "a process that merely reuses a recorded pid was signalled"
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_another_users_process_is_never_touched_even_when_all_else_matches(
        rt: ProcessRuntime, signals_sent: list[tuple[int, int]]) -> None:
    if os.geteuid() != 0:
        pytest.skip("starting a process as another user needs root")
    other = subprocess.Popen(["sleep", "300"], user=65534, group=65534, cwd="/")
    try:
        _until(lambda: os.readlink(f"/proc/{other.pid}/exe").endswith("sleep"))
        ticks = group.start_ticks(other.pid)
        engine = {"pid": other.pid, "start_ticks": ticks, "boot_id": group._boot_id(),
                  "exe": os.readlink(f"/proc/{other.pid}/exe")}
        name = unique("foreign")
        _stale_state(name, engine)
        assert rt.inspect(name).status == "exited"  # type: ignore[union-attr]
        assert rt.container_pids(name) == set()
        rt.stop(name, timeout_s=0.5)
        rt.kill(name)
        rt.remove(name, force=True)
        assert _signalled(signals_sent, other.pid) == [], "another user's process was signalled"
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


# --- the supervisor ---------------------------------------------------------------------------------------------
def test_with_its_supervisor_killed_ps_tells_the_truth_and_stop_still_works(rt: ProcessRuntime) -> None:
    name = unique("orphan")
    started = rt.create_and_start(_spec("--child", name=name))
    recorded = state.read(name)
    assert recorded is not None
    supervisor, engine = recorded["supervisor"], recorded["engine"]
    assert group.is_running(supervisor) and group.is_running(engine)
    assert os.getsid(engine["pid"]) == engine["pid"] == os.getpgid(engine["pid"])  # its own session and group
    assert os.getsid(supervisor["pid"]) != os.getsid(0) and os.getsid(engine["pid"]) != os.getsid(0)
    child = int(_until(lambda: [ln for ln in rt.log_tail(started.id) if ln.startswith("child ")])[0].split()[1])
    child_ticks = group.start_ticks(child)

    os.kill(supervisor["pid"], signal.SIGKILL)
    _until(lambda: not group.is_running(supervisor))
    info = rt.inspect(started.id)
    assert info is not None and info.running  # the engine still runs, and says so
    assert rt.container_pids(started.id) == {engine["pid"], child}

    rt.stop(started.id, timeout_s=10)
    # no process of the group is left (judged by start time too: a pid freed may be another process's already)
    assert not proc_alive(engine["pid"], engine["start_ticks"]) and not proc_alive(child, child_ticks)
    after = rt.inspect(started.id)
    assert after is not None and after.status == "exited"
    assert after.exit_code is None  # nobody recorded how it ended: unknown, not made up
    assert rt.wait_exit(started.id, 1) == -1
    assert "SIGTERM seen, draining" in rt.log_tail(started.id)


def test_the_supervisor_shrugs_off_sigint_and_sighup_meant_for_a_terminal(rt: ProcessRuntime) -> None:
    """Order, not time: the signals are pending for the supervisor before the engine is killed, so it has handled
    them by the time it can see that exit; that it records the exit (137, not "unknown") shows it outlived them."""
    name = unique("hup")
    started = rt.create_and_start(_spec(name=name))
    recorded = state.read(name)
    assert recorded is not None
    for sig in (signal.SIGINT, signal.SIGHUP):
        os.kill(recorded["supervisor"]["pid"], sig)
        os.kill(recorded["logger"]["pid"], sig)
    os.kill(recorded["engine"]["pid"], signal.SIGKILL)
    assert rt.wait_exit(started.id, 60) == 137
    assert "metralectl: the log writer" not in "\n".join(rt.log_tail(started.id, 20))  # the writer shrugged too


def test_after_stop_no_process_of_the_group_is_left(rt: ProcessRuntime) -> None:
    name = unique("group")
    started = rt.create_and_start(_spec("--child", "--ignore-sigterm", name=name))
    child = int(_until(lambda: [ln for ln in rt.log_tail(started.id) if ln.startswith("child ")])[0].split()[1])
    pids = rt.container_pids(started.id)
    assert child in pids and len(pids) == 2
    identities = [group.identity_of(pid) for pid in pids]
    recorded = state.read(name)
    assert recorded is not None
    assert sorted(_pids_running(name)) == sorted(pids | {recorded["supervisor"]["pid"], recorded["logger"]["pid"]})
    rt.stop(started.id, timeout_s=1)
    assert rt.inspect(started.id).exit_code == 137  # type: ignore[union-attr]
    assert not any(group.is_running(identity) for identity in identities)
    assert _until(lambda: _pids_running(name) == [])  # the supervisor and its writer end as well


def test_a_leader_that_is_exiting_still_leads_its_group(rt: ProcessRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a process exits its executable cannot be read (/proc/PID/exe), so it is no longer "running" as recorded,
    yet it is no other process either (same pid, same start time) and its group may still have members: stop must
    wait for them. Here the moment is made to last: the leader's executable reads as gone."""
    name = unique("exiting")
    started = rt.create_and_start(_spec("--child", name=name))
    child = int(_until(lambda: [ln for ln in rt.log_tail(started.id) if ln.startswith("child ")])[0].split()[1])
    engine = state.read(name)["engine"]  # type: ignore[index]
    real = group.executable
    monkeypatch.setattr(group, "executable", lambda pid: None if pid == engine["pid"] else real(pid))
    assert not group.is_running(engine)
    assert group.members(engine) == {engine["pid"], child}
    assert rt.inspect(name).running and rt.container_pids(name) == {engine["pid"], child}  # type: ignore[union-attr]


def test_a_leader_that_exits_takes_its_group_down_as_a_containers_init_does(rt: ProcessRuntime) -> None:
    script = "import subprocess,sys; p=subprocess.Popen(['sleep','300']); print('child', p.pid, flush=True); sys.exit(4)"
    exe = sys.executable
    name = unique("init")
    spec = ContainerSpec(name=name, image=f"process:{exe}", command=(exe, "-c", script), labels=LABELS)
    rt.create_and_start(spec)
    assert rt.wait_exit(name, 60) == 4
    child = int(rt.log_tail(name)[0].split()[1])
    assert not proc_alive(child)


# --- the kernel's OOM killer ---------------------------------------------------------------------------------------
def _memory_cgroup() -> tuple[Path, str, str] | None:
    """This process's memory cgroup, if a child with a limit can be made in it: (dir, limit file, swap file)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, where = (line.split(":", 2) + ["", ""])[:3]
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / where.lstrip("/"), "memory.limit_in_bytes", \
                "memory.memsw.limit_in_bytes"
        if number == "0" and controllers == "" and (Path("/sys/fs/cgroup") / where.lstrip("/") / "memory.max").exists():
            return Path("/sys/fs/cgroup") / where.lstrip("/"), "memory.max", "memory.swap.max"
    return None


def test_an_engine_the_oom_killer_ends_is_reported_oom_killed(rt: ProcessRuntime) -> None:
    """The launch runs in a memory cgroup of its own with a 160 MiB limit; the engine asks for 512 MiB."""
    found = _memory_cgroup()
    if found is None or not os.access(found[0], os.W_OK):
        pytest.skip("no memory cgroup this user may make a child in")
    parent, limit_file, swap_file = found
    cage = parent / f"metralectl-oom-{os.getpid()}"
    try:
        cage.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup here: {exc}")
    try:
        (cage / limit_file).write_text(str(160 << 20))
        if (cage / swap_file).exists():
            (cage / swap_file).write_text(str(160 << 20) if swap_file.startswith("memory.memsw") else "0")
        hog = "import time; x = b'x' * (512 << 20); time.sleep(60)"
        launcher = (f"import os, sys\nopen({str(cage / 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
                    "from metralectl.core.render import ContainerSpec\n"
                    "from metralectl.seams.process.runtime import ProcessRuntime\n"
                    f"ProcessRuntime().create_and_start(ContainerSpec(name='metralectl-pr-oom', image='process:'"
                    f" + sys.executable, command=(sys.executable, '-c', {hog!r}), labels={LABELS!r}))\n")
        subprocess.run([sys.executable, "-c", launcher], check=True, timeout=60)
        assert rt.wait_exit("metralectl-pr-oom", 60) == 137
        info = rt.inspect("metralectl-pr-oom")
        assert info is not None and info.oom_killed and info.exit_code == 137, info
        rt.remove("metralectl-pr-oom")
        _until(lambda: not (cage / "cgroup.procs").read_text().strip())  # the supervisor and its log writer too
    finally:
        try:
            cage.rmdir()
        except OSError:
            pass


def test_a_sigkill_that_is_no_oom_kill_is_not_reported_as_one(rt: ProcessRuntime) -> None:
    started = rt.create_and_start(_spec(name=unique("kill9")))
    os.kill(int(started.id.split("-")[0]), signal.SIGKILL)
    assert rt.wait_exit(started.id, 60) == 137
    assert rt.inspect(started.id).oom_killed is False  # type: ignore[union-attr]


# --- environment --------------------------------------------------------------------------------------------------
def test_the_engine_gets_its_spec_environment_and_the_allow_list_only(rt: ProcessRuntime,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"LANG": "C.UTF-8", "LC_TIME": "C", "TZ": "UTC", "TMPDIR": "/tmp", "USER": "u", "LOGNAME": "u",
                        "HF_TOKEN": "hf_callers_secret", "AWS_SECRET_ACCESS_KEY": "x", "PYTHONPATH": "/elsewhere",
                        "DOCKER_HOST": "unix:///x", "LD_PRELOAD": "/x.so"}.items():
        monkeypatch.setenv(name, value)
    name = unique("env")
    spec = ContainerSpec(name=name, image="process:/usr/bin/env", command=("/usr/bin/env",),
                         env={"HF_HUB_CACHE": "/data/hub", "TZ": "Europe/Paris", "ENGINE_TOKEN": "s3cret-value"},
                         labels=LABELS)
    rt.create_and_start(spec)
    assert rt.wait_exit(name, 60) == 0
    got = dict(line.split("=", 1) for line in rt.log_tail(name, 100))
    expected = {k: os.environ[k] for k in ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_TIME", "TMPDIR")
                if k in os.environ}
    expected.update(spec.env)
    expected.update({k: v for k, v in os.environ.items() if k.startswith("LC_")})
    assert got == expected
    kept = state.state_path(name).read_text()
    assert "s3cret-value" not in kept and "hf_callers_secret" not in kept  # names only, never values
    assert "ENGINE_TOKEN" in json.loads(kept)["env_names"]


def test_a_placed_engine_sees_its_gpus_and_its_label_reads_back(rt: ProcessRuntime) -> None:
    """Placement on a box of several GPUs (core/render.placed): the engine's CUDA_VISIBLE_DEVICES is the chosen ids,
    the gpu-ids label is recorded with the launch and read back as a container's labels are."""
    from dataclasses import replace

    from metralectl.core.labels import LABEL_GPU_IDS

    name = unique("gpus")
    spec = ContainerSpec(name=name, image="process:/usr/bin/env", command=("/usr/bin/env",),
                         env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1"},
                         labels=LABELS)
    rt.create_and_start(replace(spec, gpu_ids=(2, 5), labels={**LABELS, LABEL_GPU_IDS: "2,5"}))
    assert rt.wait_exit(name, 60) == 0
    got = dict(line.split("=", 1) for line in rt.log_tail(name, 100))
    assert got["CUDA_VISIBLE_DEVICES"] == "2,5" and got["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    info = rt.inspect(name)
    assert info is not None and info.labels[LABEL_GPU_IDS] == "2,5"
    assert json.loads(state.state_path(name).read_text())["spec_hash"] == spec.spec_hash()


def test_an_engine_kept_off_the_gateways_cpus_runs_on_the_others_only(rt: ProcessRuntime) -> None:
    """spec.cpu_ids (lifecycle/placing.off_gateway_cpus): the supervisor is set to them before it starts the engine,
    which inherits them: the kernel's own account of the engine's CPUs says so."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("one CPU: no other to keep an engine on")
    name = unique("cpus")
    spec = ContainerSpec(name=name, image="process:/usr/bin/grep",
                         command=("/usr/bin/grep", "Cpus_allowed_list", "/proc/self/status"), labels=LABELS,
                         cpu_ids=(allowed[-1],))
    rt.create_and_start(spec)
    assert rt.wait_exit(name, 60) == 0
    assert rt.log_tail(name, 10)[-1].split(":")[1].strip() == str(allowed[-1])
    assert sorted(os.sched_getaffinity(0)) == allowed  # this process (the CLI, the gateway) is left as it was


# --- interrupted or failed starts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("when", ["before-the-request", "after-the-answer"])
def test_ctrl_c_during_create_and_start_leaves_no_process_and_no_state(rt: ProcessRuntime,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        when: str) -> None:
    real = launch._converse

    def interrupted(supervisor: subprocess.Popen[bytes], request: dict[str, Any]) -> str:
        if when == "before-the-request":
            raise KeyboardInterrupt
        answer = real(supervisor, request)
        assert answer.startswith("started"), answer
        raise KeyboardInterrupt

    monkeypatch.setattr(launch, "_converse", interrupted)
    name = unique("intr")
    with pytest.raises(KeyboardInterrupt):
        rt.create_and_start(_spec(name=name))
    assert rt.inspect(name) is None and state.names() == []
    _until(lambda: _pids_running(name) == [])  # no workload, supervisor nor log writer of this launch


def test_a_start_that_cannot_exec_is_refused_and_leaves_nothing(rt: ProcessRuntime, tmp_path: Path) -> None:
    missing = ContainerSpec(name="metralectl-pr-none", image="process:/nonexistent/llama-server",
                            command=("/nonexistent/llama-server",), labels=LABELS)
    with pytest.raises(RuntimeFailure, match="no such file") as refused:
        rt.create_and_start(missing)
    assert "install the engine" in (refused.value.hint or "")
    broken = tmp_path / "engine"
    broken.write_bytes(b"\x7fELF not really")
    broken.chmod(0o755)
    bad = ContainerSpec(name="metralectl-pr-bad", image=f"process:{broken}", command=(str(broken),), labels=LABELS)
    with pytest.raises(RuntimeFailure, match="starting metralectl-pr-bad failed: .*[Ee]xec format"):
        rt.create_and_start(bad)
    assert state.names() == [] and rt.containers(managed_only=False) == []


# --- the endpoint, and the Docker-only calls ------------------------------------------------------------------------
def test_open_runtime_hands_the_process_endpoint_to_the_process_runtime(tmp_path: Path) -> None:
    endpoint = Endpoint(PROCESS_ENDPOINT_URL, "recipe")
    assert endpoint.is_local and endpoint.is_process and endpoint.host == ""
    with open_runtime(endpoint) as runtime:
        assert isinstance(runtime, ProcessRuntime) and runtime.endpoint is endpoint
        identity, host, arch = runtime.daemon_identity()
        assert host == os.uname().nodename and arch == os.uname().machine and identity.count("|") == 2
        assert runtime.server_version().startswith("host processes (Linux ")
        assert runtime.info()["Driver"] == "process"
        here = runtime.image_state(f"process:{sys.executable}")
        assert here.present and here.platform is not None and here.platform.startswith("linux/")
        gone = runtime.image_state("process:/nonexistent/vllm")
        assert not gone.present and gone.reason == "/nonexistent/vllm: no such file"  # type: ignore[attr-defined]
        text = tmp_path / "notes.txt"
        text.write_text("x")
        assert "execute" in runtime.image_state(f"process:{text}").reason  # type: ignore[attr-defined]
        with pytest.raises(MetralError, match="nothing to pull") as refused:
            runtime.pull_image("process:/nonexistent/vllm")
        assert "install the engine" in (refused.value.hint or "")
        assert runtime.run_probe("process:/bin/sh", "echo probed; exit 5") == (5, "probed\n")
        assert runtime.run_probe("process:/bin/sh", "sleep 5", timeout_s=0.3)[0] is None
        with pytest.raises(RuntimeFailure, match="no probe container"):
            runtime.run_probe("process:/bin/sh", "true", read_only={"/x": "/metralectl-hub"})
    assert not Endpoint("unix:///var/run/docker.sock", "default").is_process
