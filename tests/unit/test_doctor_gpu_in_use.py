"""doctor's `gpu.in-use`: who holds GPU memory, named as what it is. A live program that is not metralectl's is
"in use by" (pid, command, memory, container), with what it leaves for a start, never "leaked"; "leaked" is
only for metralectl's own left-overs: a container of ours that exited, a helper container no state knows, a
process whose recorded container is gone. Fakes at doctor's seams (fake pynvml, fake /proc, fake daemon)."""

from __future__ import annotations

from pathlib import Path

from metralectl.core.labels import LABEL_DOCTOR, LABEL_MANAGED, LABEL_OWNER, LABEL_PROBE
from metralectl.core.render import owner
from metralectl.doctor import CheckResult, run_checks
from metralectl.doctor.context import Context
from metralectl.doctor.registry import CHECKS
from metralectl.seams.docker.containers import ContainerInfo
from tests.unit import doctor_fakes as df
from tests.unit import fake_pynvml as fk

GiB = 1024**3


def one(ctx: Context) -> CheckResult:
    [result] = run_checks(ctx, tuple(c for c in CHECKS if c.id == "gpu.in-use"))
    ctx.close()
    return result


def gpu_ctx(tmp_path: Path, procs: list[tuple[int, int | None]], runtime: df.FakeRuntime | None = None,
            used: int | None = None) -> Context:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(df.MEMINFO)
    total = 143771 * 1024**2
    dev = fk.FakeDevice(memory=(total, used if used is not None else sum(b or 0 for _, b in procs)),
                        compute_procs=procs)
    return df.make_ctx(tmp_path, runtime=runtime, gpu_probe_factory=df.probe_factory([dev], meminfo))


def stopped(name: str, cid: str, labels: dict[str, str], status: str = "exited") -> ContainerInfo:
    return ContainerInfo(cid, name, df.HOPPER_IMAGE, status, 0, False, None, None, labels)


def test_a_program_started_by_hand_is_in_use_not_leaked(tmp_path: Path) -> None:
    """The H200 report: a llama-server a user started and was benchmarking."""
    ctx = gpu_ctx(tmp_path, [(5301, 3 * GiB)])
    df.fake_proc(ctx.proc_root, 5301, "llama-server", cmdline="llama-server -m /models/q.gguf --port 8080")
    r = one(ctx)
    assert r.status == "warn"
    assert "leak" not in r.detail.lower() and "leftover" not in (r.remedy or "").lower()
    assert "3.0 GiB in use by PID 5301 llama-server (`llama-server -m /models/q.gguf --port 8080`, 3.0 GiB)" in r.detail
    assert r.detail.endswith("3.0 GiB), not metralectl's: 137.4 of 140.4 GiB left for a start")
    assert "stop that program yourself" in (r.remedy or "") and "kill" not in (r.remedy or "")
    [entry] = r.data["processes"]
    assert entry["kind"] == "other" and entry["ours"] is False and r.data["leaked_bytes"] == 0


def test_another_program_in_a_container_is_named_by_its_container(tmp_path: Path) -> None:
    theirs = ContainerInfo("c" * 64, "jupyter", "jupyter/scipy", "running", None, False, None, None, {})
    ctx = gpu_ctx(tmp_path, [(4242, 60 * GiB)], df.FakeRuntime(running=[theirs]))
    df.fake_proc(ctx.proc_root, 4242, "python3", container_id="c" * 64, cmdline="python3 -m notebook")
    r = one(ctx)
    assert r.status == "warn" and "leak" not in r.detail
    assert "in use by PID 4242 python3 in container jupyter (`python3 -m notebook`, 60.0 GiB)" in r.detail


def test_another_users_metralectl_engine_is_in_use(tmp_path: Path) -> None:
    bobs = ContainerInfo("c" * 64, "metralectl-qwen", df.HOPPER_IMAGE, "running", None, False, None, None,
                         {LABEL_MANAGED: "true", LABEL_OWNER: "bob"})
    ctx = gpu_ctx(tmp_path, [(4242, 60 * GiB)], df.FakeRuntime(running=[bobs]))
    df.fake_proc(ctx.proc_root, 4242, "python3", container_id="c" * 64)
    r = one(ctx)
    assert r.status == "warn" and "leak" not in r.detail
    assert "PID 4242 python3 in container metralectl-qwen (metralectl's engine of user bob, 60.0 GiB)" in r.detail


def test_an_exited_container_of_ours_still_holding_memory_is_leaked(tmp_path: Path) -> None:
    ours = stopped("metralectl-old", "e" * 64, {LABEL_MANAGED: "true", LABEL_OWNER: owner()})
    ctx = gpu_ctx(tmp_path, [(4242, 60 * GiB)], df.FakeRuntime(running=[ours]))
    df.fake_proc(ctx.proc_root, 4242, "python3", container_id="e" * 64)
    r = one(ctx)
    assert r.status == "warn"
    assert ("60.0 GiB of GPU memory leaked by metralectl's own left-overs: PID 4242 python3 in container "
            "metralectl-old (60.0 GiB): its container exited") in r.detail
    assert "in use by" not in r.detail
    assert r.remedy == "docker rm -f metralectl-old"
    assert r.data["leaked_bytes"] == 60 * GiB and r.data["processes"][0]["kind"] == "leaked"


def test_a_helper_container_no_state_knows_is_leaked(tmp_path: Path) -> None:
    probe = ContainerInfo("f" * 64, "metralectl-probe-1", "busybox", "running", None, False, None, None,
                          {LABEL_PROBE: "true", LABEL_OWNER: owner()})
    ctx = gpu_ctx(tmp_path, [(4243, 2 * GiB)], df.FakeRuntime(running=[probe]))
    df.fake_proc(ctx.proc_root, 4243, "sh", container_id="f" * 64)
    r = one(ctx)
    assert r.status == "warn" and "a helper container no state knows" in r.detail
    assert r.remedy == "docker rm -f metralectl-probe-1"


def test_this_runs_own_gpu_probe_is_not_a_leak(tmp_path: Path) -> None:
    probe = ContainerInfo("f" * 64, "metralectl-doctor-gpu", df.HOPPER_IMAGE, "running", None, False, None, None,
                          {LABEL_DOCTOR: "gpu-probe"})
    ctx = gpu_ctx(tmp_path, [(4243, 1 * GiB)], df.FakeRuntime(running=[probe]))
    df.fake_proc(ctx.proc_root, 4243, "met", container_id="f" * 64)
    r = one(ctx)
    assert r.status == "ok" and "leak" not in r.detail


def test_a_process_whose_recorded_container_is_gone_is_leaked(tmp_path: Path) -> None:
    from metralectl.lifecycle.deployment import Deployment, RankRecord, save

    cid = "a1" * 32
    rank = RankRecord(1, "worker", "unix:///var/run/docker.sock", "default", "", "spark2", "metralectl-big-r1", cid)
    save(Deployment("r1", "big", "ready", "http://127.0.0.1:8888", "eth0", "10.0.0.1", 29500, (rank,), 0.0))
    ctx = gpu_ctx(tmp_path, [(4244, 40 * GiB)], df.FakeRuntime())  # the daemon no longer knows that container
    df.fake_proc(ctx.proc_root, 4244, "python3", container_id=cid)
    r = one(ctx)
    assert r.status == "warn"
    assert f"leaked by metralectl's own left-overs: PID 4244 python3 in container {cid[:12]} (40.0 GiB): its " \
           "container (big rank 1) is gone" in r.detail
    assert (r.remedy or "").startswith("kill 4244")


def test_an_unknown_container_is_in_use_not_leaked(tmp_path: Path) -> None:
    ctx = gpu_ctx(tmp_path, [(4242, 60 * GiB)], df.FakeRuntime())
    df.fake_proc(ctx.proc_root, 4242, "python3", container_id="d" * 64)
    r = one(ctx)
    assert r.status == "warn" and "leak" not in r.detail
    assert "in use by PID 4242 python3 in container dddddddddddd (a container the daemon does not know, 60.0 GiB)" \
        in r.detail


def test_both_at_once_and_our_engine_beside_them(tmp_path: Path) -> None:
    engine = df.container("metralectl-qwen3.5-35b-a3b-hopper", cid="b" * 64)
    old = stopped("metralectl-old", "e" * 64, {LABEL_MANAGED: "true", LABEL_OWNER: owner()}, status="dead")
    rt = df.FakeRuntime(running=[engine, old], pids={engine.id: {500}})
    ctx = gpu_ctx(tmp_path, [(500, 70 * GiB), (4242, 20 * GiB), (77, None)], rt, used=95 * GiB)
    df.fake_proc(ctx.proc_root, 4242, "python3", container_id="e" * 64)
    df.fake_proc(ctx.proc_root, 77, "Xorg", cmdline="/usr/lib/xorg/Xorg :0")
    r = one(ctx)
    assert r.status == "warn"
    assert "20.0 GiB of GPU memory leaked by metralectl's own left-overs: PID 4242 python3 in container " \
           "metralectl-old (20.0 GiB): its container is dead" in r.detail
    assert "in use by PID 77 Xorg (`/usr/lib/xorg/Xorg :0`, ? GiB)" in r.detail
    assert "metralectl's engine holds GPU memory (PID 500 in container metralectl-qwen3.5-35b-a3b-hopper" in r.detail
    assert (r.remedy or "").startswith("docker rm -f metralectl-old; if a recipe needs that memory")
    kinds = {p["pid"]: p["kind"] for p in r.data["processes"]}
    assert kinds == {77: "other", 500: "serving", 4242: "leaked"}


def test_a_command_line_is_shown_as_text(tmp_path: Path) -> None:
    ctx = gpu_ctx(tmp_path, [(5301, 3 * GiB)])
    df.fake_proc(ctx.proc_root, 5301, "evil", cmdline="evil \x1b[2J\x1b]0;title\x07")
    r = one(ctx)
    assert "\x1b" not in r.detail and "\\x1b[2J" in r.detail
