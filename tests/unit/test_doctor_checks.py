"""Every doctor check against fakes at the seams (fake runtime, fake pynvml under the real NvmlProbe)."""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Any

import pytest

from metralectl import paths
from metralectl.doctor import CHECKS, RECIPE_CHECKS, CheckResult, run_checks, select
from metralectl.doctor.context import Context
from metralectl.seams.docker.endpoints import Endpoint
from tests.unit import doctor_fakes as df
from tests.unit import fake_pynvml as fk

GiB = 1024**3
BY_ID = {c.id: c for c in CHECKS + RECIPE_CHECKS}


def run(ctx: Context, *ids: str) -> dict[str, CheckResult]:
    results = run_checks(ctx, [BY_ID[i] for i in ids])
    for r in results:
        json.dumps(r.to_json())  # every verdict is JSON-ready
    return {r.id: r for r in results}


def one(ctx: Context, check_id: str) -> CheckResult:
    return run(ctx, check_id)[check_id]


# -- root / sudo ----------------------------------------------------------------------------------

def test_root_ok_for_an_ordinary_user(tmp_path: Path) -> None:
    r = one(df.make_ctx(tmp_path), "user.root")
    assert r.status == "ok" and "alice" in r.detail


def test_sudo_is_a_problem_with_the_books_reasons(tmp_path: Path) -> None:
    me = df.identity(tmp_path, uid=0, euid=0, user="root", sudo_user="alice", sudo_uid=1000, sudo_gid=1000)
    r = one(df.make_ctx(tmp_path, identity=me), "user.root")
    assert r.status == "problem" and "SUDO_USER=alice" in r.detail
    for reason in ("run as root", "root-owned", "PATH"):
        assert reason in r.detail
    assert r.remedy and "without sudo" in r.remedy


def test_plain_root_is_a_problem(tmp_path: Path) -> None:
    r = one(df.make_ctx(tmp_path, identity=df.identity(tmp_path, uid=0, euid=0, user="root")), "user.root")
    assert r.status == "problem" and r.detail.startswith("running as root")


# -- docker ---------------------------------------------------------------------------------------

def test_docker_cli_is_information_either_way(tmp_path: Path) -> None:
    assert one(df.make_ctx(tmp_path), "docker.cli").status == "ok"
    r = one(df.make_ctx(tmp_path, which=df.fake_which({})), "docker.cli")
    assert r.status == "ok" and "not needed" in r.detail and "run --print" in r.detail


def test_daemon_reachable(tmp_path: Path) -> None:
    r = one(df.make_ctx(tmp_path), "docker.daemon")
    assert r.status == "ok" and r.data["endpoint"] == "unix:///var/run/docker.sock"


@pytest.mark.parametrize("cause,needle", [
    ("not-installed", "install Docker"),
    ("not-running", "systemctl start docker"),
    ("rootless-not-exported", "DOCKER_HOST=unix://"),
    ("unreachable", "docker info"),
])
def test_daemon_failures_keep_their_cause_and_remedy(tmp_path: Path, cause: str, needle: str) -> None:
    hints = {"not-installed": "install Docker Engine", "not-running": "sudo systemctl start docker",
             "rootless-not-exported": "export DOCKER_HOST=unix:///run/user/1000/docker.sock",
             "unreachable": "check `docker info`"}
    ctx = df.make_ctx(tmp_path, runtime_factory=df.raising(df.unavailable(cause, hint=hints[cause])))
    r = one(ctx, "docker.daemon")
    assert r.status == "problem" and r.data["cause"] == cause and needle in (r.remedy or "")


def test_permission_denied_not_in_group(tmp_path: Path) -> None:
    me = df.identity(tmp_path, groups=(df.TEST_UID,), docker_listed=False)
    ctx = df.make_ctx(tmp_path, identity=me, runtime_factory=df.raising(df.unavailable("permission-denied")))
    r = one(ctx, "docker.daemon")
    assert r.status == "problem" and "not in the docker group" in r.detail
    assert r.remedy and r.remedy.startswith("sudo usermod -aG docker $USER && newgrp docker")
    assert "docker info --format '{{.ServerVersion}}'" in r.remedy


def test_permission_denied_in_group_but_session_predates_it(tmp_path: Path) -> None:
    me = df.identity(tmp_path, groups=(df.TEST_UID,), docker_listed=True)  # /etc/group yes, getgroups() no
    ctx = df.make_ctx(tmp_path, identity=me, runtime_factory=df.raising(df.unavailable("permission-denied")))
    r = one(ctx, "docker.daemon")
    assert r.status == "problem" and "began before that change" in r.detail
    assert r.data["in_docker_group"] is True and r.data["docker_group_active"] is False
    assert r.remedy and "newgrp docker" in r.remedy and "user@" in r.remedy


def test_permission_denied_shows_the_socket(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "docker.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        os.chmod(path, 0o660)
        ctx = df.make_ctx(tmp_path, endpoint=lambda: (f"unix://{path}", "DOCKER_HOST"),
                          identity=df.identity(tmp_path, groups=(), docker_listed=False),
                          runtime_factory=df.raising(df.unavailable("permission-denied")))
        r = one(ctx, "docker.daemon")
    assert r.data["socket_mode"] == "0660" and "0660" in r.detail


def test_docker_host_pointing_at_nothing_says_so(tmp_path: Path) -> None:
    ctx = df.make_ctx(tmp_path, endpoint=lambda: ("unix:///nowhere.sock", "DOCKER_HOST"),
                      runtime_factory=df.raising(df.unavailable("not-running")))
    r = one(ctx, "docker.daemon")
    assert "unset DOCKER_HOST" in (r.remedy or "")


def test_missing_sdk(tmp_path: Path) -> None:
    r = one(df.make_ctx(tmp_path, runtime_factory=df.raising(ModuleNotFoundError("No module named 'docker'"))),
            "docker.daemon")
    assert r.status == "problem" and r.data["cause"] == "sdk-missing"


def test_hung_daemon_is_unreachable_within_the_budget(tmp_path: Path) -> None:
    import threading
    import time

    gate = threading.Event()

    def hang() -> Any:
        gate.wait(10)

    ctx = df.make_ctx(tmp_path, runtime_factory=hang, docker_budget_s=0.3)
    started = time.monotonic()
    got = run(ctx, "docker.daemon", "docker.version", "docker.nvidia-runtime", "docker.gpu-request")
    gate.set()
    assert time.monotonic() - started < 5.0  # the 0.3 s budget, not the 10 s hang
    assert got["docker.daemon"].status == "problem" and got["docker.daemon"].data["cause"] == "unreachable"
    assert "did not answer within 0.3 s" in got["docker.daemon"].detail
    assert {got[i].status for i in ("docker.version", "docker.nvidia-runtime", "docker.gpu-request")} == {"skipped"}


def test_server_version(tmp_path: Path) -> None:
    assert one(df.make_ctx(tmp_path), "docker.version").detail == "Docker Engine 27.3.1"
    old = df.make_ctx(tmp_path, runtime=df.FakeRuntime(version="18.09.7"))
    assert one(old, "docker.version").status == "problem"


def test_nvidia_runtime_known(tmp_path: Path) -> None:
    assert one(df.make_ctx(tmp_path), "docker.nvidia-runtime").status == "ok"


def test_nvidia_runtime_missing(tmp_path: Path) -> None:
    ctx = df.make_ctx(tmp_path, runtime=df.FakeRuntime(runtimes=("runc",)))
    r = one(ctx, "docker.nvidia-runtime")
    assert r.status == "problem" and "nvidia-ctk runtime configure" in (r.remedy or "")


def test_nvidia_through_cdi_or_hook(tmp_path: Path) -> None:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "nvidia.yaml").write_text("cdiVersion: 0.5.0\n")
    r = one(df.make_ctx(tmp_path, runtime=df.FakeRuntime(runtimes=("runc",), cdi_dirs=(str(cdi),))),
            "docker.nvidia-runtime")
    assert r.status == "ok" and "nvidia.yaml" in r.detail
    hook = df.fake_which({"nvidia-container-runtime-hook": "/usr/bin/nvidia-container-runtime-hook"})
    r = one(df.make_ctx(tmp_path, runtime=df.FakeRuntime(runtimes=("runc",)), which=hook), "docker.nvidia-runtime")
    assert r.status == "ok" and "hook" in r.detail


def test_gpu_request_ok_and_cleaned_up(tmp_path: Path) -> None:
    rt = df.FakeRuntime(images={df.HOPPER_IMAGE: df.image()})
    ctx = df.make_ctx(tmp_path, runtime=rt)
    r = one(ctx, "docker.gpu-request")
    ctx.close()
    assert r.status == "ok" and "met 1.0.0-beta-preview" in r.detail
    (spec,) = rt.created
    assert spec.image == df.HOPPER_IMAGE and spec.command == ("--version",) and spec.gpus == "all"
    assert "ai.metrale.metralectl.managed" not in spec.labels  # a probe is never mistaken for a served engine
    assert spec.name in rt.removed and rt.closed


def test_gpu_request_reports_a_probe_it_could_not_remove(tmp_path: Path) -> None:
    class Stuck(df.FakeRuntime):
        def remove(self, name_or_id: str, *, force: bool = False) -> None:
            raise RuntimeError("daemon said no")

    rt = Stuck(images={df.HOPPER_IMAGE: df.image()})
    ctx = df.make_ctx(tmp_path, runtime=rt)
    r = one(ctx, "docker.gpu-request")
    ctx.close(grace_s=1)
    assert r.status == "ok" and "could not be removed: daemon said no" in r.detail and "docker rm -f" in r.detail
    assert rt.closed


def test_gpu_request_refused_by_the_daemon(tmp_path: Path) -> None:
    rt = df.FakeRuntime(images={df.HOPPER_IMAGE: df.image()},
                        start_error='the daemon cannot give containers a GPU: could not select device driver "" '
                                    'with capabilities: [[gpu]]')
    ctx = df.make_ctx(tmp_path, runtime=rt)
    r = one(ctx, "docker.gpu-request")
    assert r.status == "problem" and "could not select device driver" in r.detail
    assert rt.created[0].name in rt.removed


def test_a_refusal_that_is_not_about_gpus_is_only_a_warning(tmp_path: Path) -> None:
    """The GPU check tells a GPU refusal from any other by the failure's cause, not by its words."""
    rt = df.FakeRuntime(images={df.HOPPER_IMAGE: df.image()},
                        start_error="Conflict. The container name is already in use by container GPU-box")
    r = one(df.make_ctx(tmp_path, runtime=rt), "docker.gpu-request")
    assert r.status == "warn" and "could not start a test container" in r.detail


def test_gpu_request_no_compatible_gpu(tmp_path: Path) -> None:
    rt = df.FakeRuntime(images={df.HOPPER_IMAGE: df.image()}, exit_code=1, output=("error: no compatible GPU",))
    r = one(df.make_ctx(tmp_path, runtime=rt), "docker.gpu-request")
    assert r.status == "problem" and "not exposing the device" in r.detail


def test_gpu_request_skipped_without_an_image(tmp_path: Path) -> None:
    rt = df.FakeRuntime()
    r = one(df.make_ctx(tmp_path, runtime=rt), "docker.gpu-request")
    assert r.status == "skipped" and df.HOPPER_IMAGE in r.detail and not rt.created


def test_gpu_request_uses_the_recipes_image_first(tmp_path: Path) -> None:
    gb10 = "metrale/metrale-inference-gb10:latest"
    rt = df.FakeRuntime(images={df.HOPPER_IMAGE: df.image(), gb10: df.image(gb10, "linux/arm64")})
    run(df.make_ctx(tmp_path, runtime=rt, recipe="qwen3.5-35b-a3b"), "docker.gpu-request")
    assert rt.created[0].image == gb10


# -- GPU ------------------------------------------------------------------------------------------

def meminfo(tmp_path: Path) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(df.MEMINFO)
    return path


def test_gpu_checks_on_an_h200(tmp_path: Path) -> None:
    got = run(df.make_ctx(tmp_path), "gpu.driver", "gpu.model", "gpu.memory", "gpu.in-use")
    assert got["gpu.driver"].status == "ok" and "CUDA 13.0" in got["gpu.driver"].detail
    assert got["gpu.model"].detail == "NVIDIA H200 → hardware class hopper"
    assert got["gpu.memory"].status == "ok" and "140.4 GiB GPU memory, 139.8 GiB free" in got["gpu.memory"].detail
    assert got["gpu.in-use"].status == "ok"


def test_old_cuda_driver_is_a_problem(tmp_path: Path) -> None:
    ctx = df.make_ctx(tmp_path, gpu_probe_factory=df.probe_factory([fk.FakeDevice()], meminfo(tmp_path), cuda=12080,
                                                                   driver="570.86.15"))
    r = one(ctx, "gpu.driver")
    assert r.status == "problem" and "CUDA 12.8" in r.detail and "580.65.06" in (r.remedy or "")


def test_no_driver_is_the_real_no_nvml_path(tmp_path: Path) -> None:
    got = run(df.make_ctx(tmp_path, gpu_probe_factory=df.no_gpu(meminfo(tmp_path))),
              "gpu.driver", "gpu.model", "gpu.memory", "gpu.in-use", "cpu.arch")
    assert got["gpu.driver"].status == "problem" and "libnvidia-ml.so.1" in got["gpu.driver"].detail
    assert got["gpu.driver"].data["cause"] == "LibraryNotFound"
    assert {got[i].status for i in ("gpu.model", "gpu.memory", "gpu.in-use", "cpu.arch")} == {"skipped"}


def test_gb10_memory_is_unified_from_meminfo(tmp_path: Path) -> None:
    ctx = df.make_ctx(tmp_path, gpu_probe_factory=df.probe_factory([fk.gb10()], meminfo(tmp_path)),
                      cpu_arch=lambda: "aarch64")
    got = run(ctx, "gpu.model", "gpu.memory", "cpu.arch")
    assert got["gpu.model"].data["hardware"] == "gb10"
    mem = got["gpu.memory"]
    assert mem.status == "ok" and mem.detail.startswith("unified 124.9 GiB, 95.4 GiB available")
    assert "not supported" in mem.detail and mem.data["memory"][0]["kind"] == "unified"
    assert got["cpu.arch"].status == "ok" and "linux/arm64" in got["cpu.arch"].detail


def test_unknown_gpu_is_a_warning(tmp_path: Path) -> None:
    ctx = df.make_ctx(tmp_path, gpu_probe_factory=df.probe_factory([fk.FakeDevice(name="NVIDIA A100-SXM4-80GB")],
                                                                   meminfo(tmp_path)))
    r = one(ctx, "gpu.model")
    assert r.status == "warn" and "A100" in r.detail and "gb10" in r.detail


def test_only_our_engine_on_the_gpu_is_fine(tmp_path: Path) -> None:
    ours = df.container("metralectl-x", cid="b" * 64)
    rt = df.FakeRuntime(running=[ours], pids={ours.id: {500}})
    dev = fk.FakeDevice(compute_procs=[(500, 70 * GiB)])
    r = one(df.make_ctx(tmp_path, runtime=rt, gpu_probe_factory=df.probe_factory([dev], meminfo(tmp_path))),
            "gpu.in-use")
    assert r.status == "ok" and "metralectl's engine" in r.detail


def test_gb10_processes_without_sizes_still_listed(tmp_path: Path) -> None:
    dev = fk.gb10(compute_procs=[(4242, None)])
    ctx = df.make_ctx(tmp_path, gpu_probe_factory=df.probe_factory([dev], meminfo(tmp_path)))
    r = one(ctx, "gpu.in-use")
    assert r.status == "warn" and "PID 4242" in r.detail


def test_nvml_hang_is_reported_not_waited_for(tmp_path: Path) -> None:
    import threading
    import time

    gate = threading.Event()

    class Hang:
        def open(self) -> Any:
            gate.wait(10)

        def sample(self) -> Any:
            return ()

        def close(self) -> None:
            pass

    ctx = df.make_ctx(tmp_path, gpu_probe_factory=lambda c, u: Hang(), fact_budget_s=0.3)
    started = time.monotonic()
    r = one(ctx, "gpu.driver")
    gate.set()
    assert r.status == "warn" and "did not answer within 0.3 s" in r.detail and time.monotonic() - started < 5.0


# -- CPU ------------------------------------------------------------------------------------------

def test_cpu_arch_mismatch(tmp_path: Path) -> None:
    r = one(df.make_ctx(tmp_path, cpu_arch=lambda: "aarch64"), "cpu.arch")
    assert r.status == "problem" and "linux/amd64" in r.detail and "aarch64" in r.detail


def test_cpu_arch_local_image_of_the_wrong_platform(tmp_path: Path) -> None:
    rt = df.FakeRuntime(images={df.HOPPER_IMAGE: df.image(platform="linux/arm64")})
    r = one(df.make_ctx(tmp_path, runtime=rt), "cpu.arch")
    assert r.status == "problem" and r.remedy == f"docker pull --platform linux/amd64 {df.HOPPER_IMAGE}"


def test_cpu_arch_from_proc_when_nvml_is_absent(tmp_path: Path) -> None:
    ctx = df.make_ctx(tmp_path, gpu_probe_factory=df.no_gpu(meminfo(tmp_path)), cpu_arch=lambda: "aarch64",
                      proc_gpu_names=lambda: ["NVIDIA GB10"])
    r = one(ctx, "cpu.arch")
    assert r.status == "ok" and "/proc/driver/nvidia" in r.detail


# -- HF cache -------------------------------------------------------------------------------------

def hub() -> Path:
    path = paths.hf_hub_cache()
    path.mkdir(parents=True, exist_ok=True)
    return path


def cached_model(repo: str = "Sehyo/Qwen3.5-35B-A3B-NVFP4") -> Path:
    snap = hub() / ("models--" + repo.replace("/", "--")) / "snapshots" / "0123abcd"
    snap.mkdir(parents=True, exist_ok=True)
    (snap / "config.json").write_text("{}")
    (snap / "model.safetensors").write_text("x")
    return snap


def test_hf_location_and_models(tmp_path: Path) -> None:
    r = one(df.make_ctx(tmp_path), "hf.cache")
    assert r.status == "ok" and "not created yet" in r.detail and r.data["source"] == "HF_HOME/hub"
    cached_model()
    r = one(df.make_ctx(tmp_path), "hf.cache")
    assert "1 model cached" in r.detail and r.data["models"] == ["Sehyo/Qwen3.5-35B-A3B-NVFP4"]


def test_hf_cache_that_is_a_file(tmp_path: Path) -> None:
    target = paths.hf_hub_cache()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("oops")
    got = run(df.make_ctx(tmp_path), "hf.cache", "hf.writable")
    assert got["hf.cache"].status == "problem" and got["hf.writable"].status == "problem"
    assert "a file stands where the cache should be" in (got["hf.writable"].remedy or "")


def test_hf_writable(tmp_path: Path) -> None:
    hub()
    r = one(df.make_ctx(tmp_path), "hf.writable")
    assert r.status == "ok" and r.detail.endswith("is writable") and not list(hub().iterdir())


@pytest.mark.skipif(os.geteuid() != 0, reason="planting a root-owned file needs root")
def test_root_owned_files_in_the_cache(tmp_path: Path) -> None:
    snap = cached_model()
    df.chown_tree(paths.hf_home())
    planted = snap / "tokenizer.json"
    planted.write_text("{}")  # written by root: the `sudo metralectl` trap
    r = one(df.make_ctx(tmp_path), "hf.ownership")
    assert r.status == "problem" and r.data["root_owned"] == 1 and str(planted) in r.detail
    assert r.remedy == f"sudo chown -R alice:alice {paths.hf_home()}"


def test_clean_cache_ownership(tmp_path: Path) -> None:
    cached_model()
    df.chown_tree(paths.hf_home())
    r = one(df.make_ctx(tmp_path), "hf.ownership")
    assert r.status == "ok" and r.data["root_owned"] == 0 and r.data["complete"] is True


def test_ownership_under_sudo_looks_at_the_invoking_users_cache(tmp_path: Path) -> None:
    alice_home = tmp_path / "alice"
    snap = alice_home / ".cache" / "huggingface" / "hub" / "models--a--b"
    snap.mkdir(parents=True)
    df.chown_tree(alice_home, 1000)
    (snap / "root-wrote-this").write_text("x")
    me = df.identity(tmp_path, uid=0, euid=0, user="root", sudo_user="alice", sudo_uid=1000, sudo_gid=1000,
                     sudo_home=alice_home, sudo_group="staff")
    r = one(df.make_ctx(tmp_path, identity=me), "hf.ownership")
    expect = "problem" if os.geteuid() == 0 else "warn"  # not root: the files are ours, not root's
    assert r.status == expect and r.data["roots"] == [str(alice_home / ".cache" / "huggingface")]
    assert r.remedy == f"sudo chown -R alice:staff {alice_home / '.cache' / 'huggingface'}"


def test_ownership_skipped_for_plain_root(tmp_path: Path) -> None:
    r = one(df.make_ctx(tmp_path, identity=df.identity(tmp_path, uid=0, euid=0, user="root")), "hf.ownership")
    assert r.status == "skipped"


def test_ownership_scan_is_bounded(tmp_path: Path) -> None:
    for i in range(50):
        (hub() / f"d{i}").mkdir()
    df.chown_tree(paths.hf_home())
    r = one(df.make_ctx(tmp_path, scan_budget_s=0.0), "hf.ownership")
    assert r.data["complete"] is False and "scan stopped" in r.detail


def test_disk_vs_the_flagship(tmp_path: Path) -> None:
    r = one(df.make_ctx(tmp_path), "hf.disk")
    assert r.status == "ok" and "needs 19.7 GB" in r.detail and r.data["recipe"] == "qwen3.5-35b-a3b"
    r = one(df.make_ctx(tmp_path, disk_usage=df.disk(5)), "hf.disk")
    assert r.status == "problem" and "not enough" in r.detail
    r = one(df.make_ctx(tmp_path, disk_usage=df.disk(25)), "hf.disk")
    assert r.status == "warn"


def test_disk_with_the_weights_already_cached(tmp_path: Path) -> None:
    cached_model()
    r = one(df.make_ctx(tmp_path, disk_usage=df.disk(1)), "hf.disk")
    assert r.status == "ok" and "already cached" in r.detail


def test_disk_vs_the_recipe(tmp_path: Path) -> None:
    r = one(df.make_ctx(tmp_path, recipe="qwen3.5-122b-a10b-single", disk_usage=df.disk(50)), "hf.disk")
    assert r.status == "problem" and r.data["recipe"] == "qwen3.5-122b-a10b-single"


def test_token_is_information(tmp_path: Path) -> None:
    r = one(df.make_ctx(tmp_path, environ={"HF_TOKEN": "hf_secret"}), "hf.token")
    assert r.status == "ok" and "HF_TOKEN is set" in r.detail and "hf_secret" not in json.dumps(r.to_json())
    r = one(df.make_ctx(tmp_path, environ={}), "hf.token")
    assert r.status == "ok" and "hf auth login" in r.detail


# -- PATH, port, agent ----------------------------------------------------------------------------

def test_metralectl_on_path(tmp_path: Path) -> None:
    r = one(df.make_ctx(tmp_path), "path.metralectl")
    assert r.status == "ok" and r.detail.endswith(".local/bin/metralectl")


def test_doubled_slash_is_explained_not_flagged(tmp_path: Path) -> None:
    bin_dir = tmp_path / "home" / "alice" / ".local" / "bin"
    ctx = df.make_ctx(tmp_path, environ={"PATH": f"/usr/bin:{bin_dir}/"})
    r = one(ctx, "path.metralectl")
    assert r.status == "ok" and f"{bin_dir}//metralectl" in r.detail and "harmless" in r.detail


def test_installed_but_not_on_path(tmp_path: Path) -> None:
    ctx = df.make_ctx(tmp_path, environ={"PATH": "/usr/bin"}, which=df.fake_which({}))
    (ctx.identity.home / ".local" / "bin" / "metralectl").write_text("#!/bin/sh\n")
    r = one(ctx, "path.metralectl")
    assert r.status == "warn"
    assert r.remedy == "echo 'export PATH=\"$PATH:$HOME/.local/bin\"' >> ~/.bashrc && source ~/.bashrc"


def test_not_installed_at_all(tmp_path: Path) -> None:
    ctx = df.make_ctx(tmp_path, environ={"PATH": "/usr/bin", "SHELL": "/usr/bin/zsh"}, which=df.fake_which({}))
    r = one(ctx, "path.metralectl")
    # no release is published: the remedy is the install from a checkout (never the engine team's installer)
    assert r.status == "warn" and "uv tool install ." in (r.remedy or "") and "~/.zshrc" in (r.remedy or "")
    assert "curl" not in (r.remedy or "")


def test_port_free_and_taken(tmp_path: Path) -> None:
    r = one(df.make_ctx(tmp_path), "net.port")
    assert r.status == "ok" and r.data["port"] == 8888
    ctx = df.make_ctx(tmp_path, port=9999, port_probe=df.in_use, port_holder=lambda p: {"pid": 31, "process": "nginx"})
    r = one(ctx, "net.port")
    assert r.status == "problem" and "port 9999 is already taken by nginx (PID 31)" in r.detail


def test_port_taken_by_our_engine(tmp_path: Path) -> None:
    ours = df.container("metralectl-qwen3.5-35b-a3b", cid="b" * 64)
    rt = df.FakeRuntime(running=[ours], pids={ours.id: {31}})
    ctx = df.make_ctx(tmp_path, runtime=rt, port_probe=df.in_use, port_holder=lambda p: {"pid": 31, "process": "met"})
    r = one(ctx, "net.port")
    assert r.status == "problem" and "metralectl-qwen3.5-35b-a3b" in r.detail and "metralectl stop" in (r.remedy or "")


def test_port_from_the_recipe(tmp_path: Path) -> None:
    r = one(df.make_ctx(tmp_path, recipe="qwen3.5-35b-a3b"), "net.port")
    assert r.data["source"] == "recipe qwen3.5-35b-a3b" and r.data["port"] == 8888


def test_port_check_probes_with_the_one_bind_probe(tmp_path: Path) -> None:
    from metralectl.doctor.context import Context
    from metralectl.seams.ports import bind_error

    assert inspect.signature(Context).parameters["port_probe"].default is bind_error


def test_agent_running_and_its_own_view(tmp_path: Path) -> None:
    r = one(df.make_ctx(tmp_path), "agent")
    assert r.status == "ok" and "pid 4321" in r.detail and "ready" in r.detail
    down = one(df.make_ctx(tmp_path, agent_view=lambda: None), "agent")
    assert down.status == "warn" and "not running" in down.detail
    assert (down.remedy or "").startswith("metralectl agent start") and "systemctl" not in (down.remedy or "")
    unit = one(df.make_ctx(tmp_path, agent_view=lambda: None, agent_unit=lambda: True), "agent")
    assert (unit.remedy or "").startswith("systemctl --user start metralectl-agent")
    silent = {"pid": 1, "port": 8897, "error": "timed out"}
    detached = one(df.make_ctx(tmp_path, agent_view=lambda: {**silent, "how": "detached"}), "agent")
    assert detached.status == "warn" and "metralectl agent stop && metralectl agent start" in (detached.remedy or "")
    by_systemd = one(df.make_ctx(tmp_path, agent_view=lambda: {**silent, "how": "systemd"}), "agent")
    assert "systemctl --user restart metralectl-agent" in (by_systemd.remedy or "")
    refusing = one(df.make_ctx(tmp_path, agent_view=lambda: {"pid": 1, "port": 8897, "status": {
        "can_run": False, "summary": "Docker: permission denied", "problems": [{"remedy": "sudo usermod -aG docker $USER"}]}}),
        "agent")
    assert refusing.status == "problem" and "cannot run models" in refusing.detail and "usermod" in (refusing.remedy or "")


# -- --recipe -------------------------------------------------------------------------------------

def test_recipe_narrows_the_checks() -> None:
    ids = [c.id for c in select("qwen3.5-35b-a3b")]
    assert ids[-3:] == ["recipe.image", "recipe.weights", "recipe.fit"]
    assert not {"docker.cli", "hf.token", "path.metralectl", "agent"} & set(ids)
    assert "recipe.image" not in [c.id for c in select(None)]


def test_recipe_on_its_own_hardware(tmp_path: Path) -> None:
    ctx = df.make_ctx(tmp_path, recipe="qwen3.5-35b-a3b-hopper")
    got = run(ctx, "recipe.image", "recipe.weights", "recipe.fit")
    assert got["recipe.image"].status == "ok" and "abc123" in got["recipe.image"].detail
    assert got["recipe.weights"].status == "warn" and "hf download Sehyo/Qwen3.5-35B-A3B-NVFP4" in (
        got["recipe.weights"].remedy or "")
    fit = got["recipe.fit"]
    assert fit.status == "ok" and "of a 124.1 GB budget" in fit.detail, fit.detail


def test_recipe_fit_with_weights_over_the_budget_is_a_problem_though_the_kv_part_is_unknown(tmp_path: Path) -> None:
    import dataclasses

    from metralectl.core.overrides import apply_sets

    catalog = df.shipped_catalog()
    vllm = apply_sets(catalog, catalog.recipes["nemotron-3-super-120b-a12b-vllm"], ["resources.memory-utilization=0.3"])
    over = dataclasses.replace(vllm, name="over-h200", hardware="hopper")  # 67.5 GB of weights, 0.3 of 141 GB
    ctx = df.make_ctx(tmp_path, recipe="over-h200",
                      catalog=dataclasses.replace(catalog, recipes={**catalog.recipes, "over-h200": over}))
    fit = run(ctx, "recipe.fit")["recipe.fit"]
    assert fit.status == "problem" and "alone exceed a 42.3 GB budget" in fit.detail, fit.detail
    assert "tensor-parallel size" in (fit.remedy or "")


def test_recipe_fit_over_more_gpus_than_the_machine_has_is_a_problem(tmp_path: Path) -> None:
    import dataclasses

    from metralectl.core.overrides import apply_sets

    catalog = df.shipped_catalog()
    vllm = apply_sets(catalog, catalog.recipes["qwen3.6-35b-a3b-vllm"], ["serve.tensor-parallel-size=2"])
    wide = dataclasses.replace(vllm, name="wide-h200", hardware="hopper")
    wider = dataclasses.replace(catalog, recipes={**catalog.recipes, "wide-h200": wide})
    fit = run(df.make_ctx(tmp_path, recipe="wide-h200", catalog=wider), "recipe.fit")["recipe.fit"]  # one H200
    assert fit.status == "problem" and fit.detail == ("wide-h200 spreads the model over 2 GPUs (serve's "
                                                      "tensor-parallel-size 2 × pipeline-parallel-size 1); this "
                                                      "machine has 1"), fit.detail
    assert "`--set serve.tensor-parallel-size=1`" in (fit.remedy or "")
    two = df.make_ctx(tmp_path, recipe="wide-h200", catalog=wider,
                      gpu_probe_factory=df.probe_factory([fk.FakeDevice(), fk.FakeDevice(uuid="GPU-1", bus_id="00000000:1A:00.0")],
                                                         tmp_path / "meminfo"))
    assert "spreads the model" not in run(two, "recipe.fit")["recipe.fit"].detail


def test_recipe_image_absent_and_weights_cached(tmp_path: Path) -> None:
    cached_model()
    ctx = df.make_ctx(tmp_path, recipe="qwen3.5-35b-a3b-hopper", runtime=df.FakeRuntime())
    got = run(ctx, "recipe.image", "recipe.weights")
    # the Hopper image is built from source: the remedy is the build, never a pull
    assert got["recipe.image"].status == "problem" and "docker build -f docker/hopper/Dockerfile" in (
        got["recipe.image"].remedy or "")
    assert got["recipe.weights"].status == "ok"


def test_recipe_for_other_hardware_does_not_fit(tmp_path: Path) -> None:
    r = one(df.make_ctx(tmp_path, recipe="qwen3.5-35b-a3b"), "recipe.fit")
    assert r.status == "problem" and "built for gb10; this machine is hopper" in r.detail


def test_recipe_fit_vs_memory_held_now(tmp_path: Path) -> None:
    dev = fk.FakeDevice(memory=(143771 * 1024**2, 130 * GiB), compute_procs=[(4242, 130 * GiB)])
    ctx = df.make_ctx(tmp_path, recipe="qwen3.5-35b-a3b-hopper",
                      gpu_probe_factory=df.probe_factory([dev], meminfo(tmp_path)))
    r = one(ctx, "recipe.fit")
    assert r.status == "problem" and "is free now" in r.detail


def test_recipe_fit_without_a_gpu_judges_the_recipes_class(tmp_path: Path) -> None:
    ctx = df.make_ctx(tmp_path, recipe="qwen3.5-35b-a3b", gpu_probe_factory=df.no_gpu(meminfo(tmp_path)))
    r = one(ctx, "recipe.fit")
    assert r.status == "ok" and "no GPU detected" in r.detail


def test_recipe_image_revision_differs_from_validated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    catalog = df.shipped_catalog()
    recipe = catalog.recipes["qwen3.5-35b-a3b-hopper"]
    patched = replace(recipe, validated=replace(recipe.validated, engine_revision="fff000"))
    monkeypatch.setitem(catalog.recipes, recipe.name, patched)
    r = one(df.make_ctx(tmp_path, recipe=recipe.name), "recipe.image")
    assert r.status == "warn" and "validated on fff000" in r.detail


def test_all_checks_have_unique_ids_and_titles() -> None:
    ids = [c.id for c in CHECKS + RECIPE_CHECKS]
    assert len(ids) == len(set(ids))
    assert all(c.title and c.timeout_s <= 5.0 for c in CHECKS + RECIPE_CHECKS)


def test_no_runtime_endpoint_attribute_needed_beyond_the_seam(tmp_path: Path) -> None:
    rt = df.FakeRuntime(endpoint=Endpoint("tcp://10.0.0.5:2376", "context remote"))
    got = run(df.make_ctx(tmp_path, runtime=rt), "docker.daemon", "docker.nvidia-runtime")
    assert got["docker.daemon"].detail == "tcp://10.0.0.5:2376 (context remote) answers"
    assert got["docker.nvidia-runtime"].status == "ok"
