"""What only the host-process runtime has to get right, with real processes: a recorded pid that another process
holds now is never signalled nor reported as ours (nor is another user's process, whose identity matches in all
but its owner); a killed supervisor leaves `ps` truthful and `stop` working; the engine gets exactly its spec's
environment plus the allow-list, and no secret value lands in the state file; the log is bounded and rotated, a
name keeps its last launches' logs; an interrupted start leaves no process and no state; the endpoint's dispatch,
and the Docker-only calls' answers for host processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
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


def _spec(*args: str, name: str = "metralectl-pr-a", env: dict[str, str] | None = None) -> ContainerSpec:
    exe = sys.executable
    return ContainerSpec(name=name, image=f"process:{exe}", command=(exe, "-u", str(WORKLOAD), *args),
                         env=env or {}, labels=LABELS, gpus=None)


def _until(condition: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s")


def _pids_running(marker: str) -> list[int]:
    """Processes whose command line holds `marker` (a test's own name for its launch)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                line = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in line and proc_alive(int(entry)):
                found.append(int(entry))
    return found


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
        rt: ProcessRuntime, differs: str) -> None:
    other = subprocess.Popen(["sleep", "300"])  # ours, alive: as a recycled pid would be
    try:
        engine = group.identity_of(other.pid)
        assert engine is not None
        engine[differs] = {"start_ticks": engine["start_ticks"] + 1, "exe": "/usr/bin/not-sleep",
                           "boot_id": "another-boot"}[differs]
        _stale_state("metralectl-pr-stale", engine)
        info = rt.inspect("metralectl-pr-stale")
        assert info is not None and info.status == "exited" and not info.running and info.exit_code is None
        assert rt.containers(all_states=False) == [] and rt.container_pids("metralectl-pr-stale") == set()
        rt.stop("metralectl-pr-stale", timeout_s=0.5)
        rt.kill("metralectl-pr-stale")
        rt.remove("metralectl-pr-stale")  # not running: removed without force
        assert rt.inspect("metralectl-pr-stale") is None
        time.sleep(0.2)
        assert other.poll() is None, "a process that merely reuses a recorded pid was signalled"
    finally:
        other.kill()
        other.wait()


def test_another_users_process_is_never_touched_even_when_all_else_matches(rt: ProcessRuntime) -> None:
    if os.geteuid() != 0:
        pytest.skip("starting a process as another user needs root")
    other = subprocess.Popen(["sleep", "300"], user=65534, group=65534, cwd="/")
    try:
        _until(lambda: os.readlink(f"/proc/{other.pid}/exe").endswith("sleep"))
        ticks = group.start_ticks(other.pid)
        engine = {"pid": other.pid, "start_ticks": ticks, "boot_id": group._boot_id(),
                  "exe": os.readlink(f"/proc/{other.pid}/exe")}
        _stale_state("metralectl-pr-foreign", engine)
        assert rt.inspect("metralectl-pr-foreign").status == "exited"  # type: ignore[union-attr]
        assert rt.container_pids("metralectl-pr-foreign") == set()
        rt.stop("metralectl-pr-foreign", timeout_s=0.5)
        rt.kill("metralectl-pr-foreign")
        rt.remove("metralectl-pr-foreign", force=True)
        time.sleep(0.2)
        assert other.poll() is None, "another user's process was signalled"
    finally:
        other.kill()
        other.wait()


# --- the supervisor ---------------------------------------------------------------------------------------------
def test_with_its_supervisor_killed_ps_tells_the_truth_and_stop_still_works(rt: ProcessRuntime) -> None:
    started = rt.create_and_start(_spec("--child", name="metralectl-pr-orphan"))
    recorded = state.read("metralectl-pr-orphan")
    assert recorded is not None
    supervisor, engine = recorded["supervisor"], recorded["engine"]
    assert group.is_running(supervisor) and group.is_running(engine)
    assert os.getsid(engine["pid"]) == engine["pid"] == os.getpgid(engine["pid"])  # its own session and group
    assert os.getsid(supervisor["pid"]) != os.getsid(0) and os.getsid(engine["pid"]) != os.getsid(0)
    child = int(_until(lambda: [ln for ln in rt.log_tail(started.id) if ln.startswith("child ")])[0].split()[1])

    os.kill(supervisor["pid"], signal.SIGKILL)
    _until(lambda: not group.is_running(supervisor))
    info = rt.inspect(started.id)
    assert info is not None and info.running  # the engine still runs, and says so
    assert rt.container_pids(started.id) == {engine["pid"], child}

    rt.stop(started.id, timeout_s=10)
    assert not proc_alive(engine["pid"]) and not proc_alive(child)  # no process of the group is left
    after = rt.inspect(started.id)
    assert after is not None and after.status == "exited"
    assert after.exit_code is None  # nobody recorded how it ended: unknown, not made up
    assert rt.wait_exit(started.id, 1) == -1
    assert "SIGTERM seen, draining" in rt.log_tail(started.id)


def test_the_supervisor_shrugs_off_sigint_and_sighup_meant_for_a_terminal(rt: ProcessRuntime) -> None:
    started = rt.create_and_start(_spec(name="metralectl-pr-hup"))
    supervisor = state.read("metralectl-pr-hup")["supervisor"]  # type: ignore[index]
    for sig in (signal.SIGINT, signal.SIGHUP):
        os.kill(supervisor["pid"], sig)
    time.sleep(0.3)
    assert group.is_running(supervisor) and rt.inspect(started.id).running  # type: ignore[union-attr]


def test_after_stop_no_process_of_the_group_is_left(rt: ProcessRuntime) -> None:
    started = rt.create_and_start(_spec("--child", "--ignore-sigterm", name="metralectl-pr-group"))
    child = int(_until(lambda: [ln for ln in rt.log_tail(started.id) if ln.startswith("child ")])[0].split()[1])
    pids = rt.container_pids(started.id)
    assert child in pids and len(pids) == 2
    rt.stop(started.id, timeout_s=1)
    assert rt.inspect(started.id).exit_code == 137  # type: ignore[union-attr]
    assert not any(proc_alive(pid) for pid in pids)
    assert _pids_running(str(WORKLOAD)) == []


def test_a_leader_that_exits_takes_its_group_down_as_a_containers_init_does(rt: ProcessRuntime) -> None:
    script = "import subprocess,sys; p=subprocess.Popen(['sleep','300']); print('child', p.pid, flush=True); sys.exit(4)"
    exe = sys.executable
    spec = ContainerSpec(name="metralectl-pr-init", image=f"process:{exe}", command=(exe, "-c", script), labels=LABELS)
    rt.create_and_start(spec)
    assert rt.wait_exit("metralectl-pr-init", 20) == 4
    child = int(rt.log_tail("metralectl-pr-init")[0].split()[1])
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
        _until(lambda: not (cage / "cgroup.procs").read_text().strip(), 20)  # the supervisor has ended too
    finally:
        try:
            cage.rmdir()
        except OSError:
            pass


def test_a_sigkill_that_is_no_oom_kill_is_not_reported_as_one(rt: ProcessRuntime) -> None:
    started = rt.create_and_start(_spec(name="metralectl-pr-kill9"))
    os.kill(int(started.id.split("-")[0]), signal.SIGKILL)
    assert rt.wait_exit(started.id, 10) == 137
    assert rt.inspect(started.id).oom_killed is False  # type: ignore[union-attr]


# --- environment --------------------------------------------------------------------------------------------------
def test_the_engine_gets_its_spec_environment_and_the_allow_list_only(rt: ProcessRuntime,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"LANG": "C.UTF-8", "LC_TIME": "C", "TZ": "UTC", "TMPDIR": "/tmp", "USER": "u", "LOGNAME": "u",
                        "HF_TOKEN": "hf_callers_secret", "AWS_SECRET_ACCESS_KEY": "x", "PYTHONPATH": "/elsewhere",
                        "DOCKER_HOST": "unix:///x", "LD_PRELOAD": "/x.so"}.items():
        monkeypatch.setenv(name, value)
    spec = ContainerSpec(name="metralectl-pr-env", image="process:/usr/bin/env", command=("/usr/bin/env",),
                         env={"HF_HUB_CACHE": "/data/hub", "TZ": "Europe/Paris", "ENGINE_TOKEN": "s3cret-value"},
                         labels=LABELS)
    rt.create_and_start(spec)
    assert rt.wait_exit("metralectl-pr-env", 20) == 0
    got = dict(line.split("=", 1) for line in rt.log_tail("metralectl-pr-env", 100))
    expected = {k: os.environ[k] for k in ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_TIME", "TMPDIR")
                if k in os.environ}
    expected.update(spec.env)
    expected.update({k: v for k, v in os.environ.items() if k.startswith("LC_")})
    assert got == expected
    kept = state.state_path("metralectl-pr-env").read_text()
    assert "s3cret-value" not in kept and "hf_callers_secret" not in kept  # names only, never values
    assert "ENGINE_TOKEN" in json.loads(kept)["env_names"]


# --- logs ---------------------------------------------------------------------------------------------------------
def test_the_log_is_bounded_rotated_and_the_last_launches_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    rt = ProcessRuntime(log_limit=8192, keep_logs=2)
    name = "metralectl-pr-logs"
    try:
        rt.create_and_start(_spec("--chatter", "2000,0.1", name=name))
        followed: list[str] = []
        follower = threading.Thread(target=lambda: followed.extend(rt.follow_logs(name)), daemon=True)
        follower.start()
        time.sleep(3.5)  # about 70 KB written, the bound looked at every second
        folder = Path(os.environ["METRALE_HOME"]) / "logs" / "processes" / name
        files = sorted(p.name for p in folder.iterdir())
        assert len(files) == 2 and files[1] == files[0] + ".1", files
        sizes = {p.name: p.stat().st_size for p in folder.iterdir()}
        assert all(size <= 8192 + 25_000 for size in sizes.values()), sizes  # the bound, plus a second's writing
        assert sizes[files[1]] > 8192  # a rotated piece holds what was cut off
        last = rt.log_tail(name, 1)[0]
        assert last.startswith("chatter ")
        assert len(rt.log_tail(name, 300)) == 300  # across the piece and the file
        rt.stop(name, timeout_s=5)
        follower.join(10)
        numbers = [int(line.split()[1]) for line in followed if line.startswith("chatter ")]
        assert numbers == list(range(len(numbers))) and len(numbers) > 800  # followed across every rotation
        assert followed[0] == "workload up" and followed[-1] == "drained"
        rt.remove(name)
        for _ in range(3):
            rt.create_and_start(_spec("--exit", "0", name=name))
            rt.wait_exit(name, 20)
            rt.remove(name)
        launches = {p.name.split(".log")[0] for p in folder.iterdir()}
        assert len(launches) == 2, launches  # the last two launches' logs, kept after removal
    finally:
        for info in rt.containers(managed_only=False):
            rt.remove(info.id, force=True)


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
    with pytest.raises(KeyboardInterrupt):
        rt.create_and_start(_spec(name="metralectl-pr-intr"))
    assert rt.inspect("metralectl-pr-intr") is None and state.names() == []
    _until(lambda: _pids_running(str(WORKLOAD)) == [] and _pids_running("metralectl.seams.process.supervise") == [],
           10)


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
