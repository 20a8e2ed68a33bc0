"""Snapshots of the human report for an all-ok and an all-bad machine (fakes at every seam).

Paths under the test's temporary directory are shown as /tmp/doctor and the elapsed time is fixed.
Regenerate after an intended change with: METRALECTL_UPDATE_GOLDEN=1 pytest tests/unit/test_doctor_golden.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from metralectl import paths
from metralectl.cli.doctor_cmd import render_text
from metralectl.doctor import CHECKS, exit_code, run_checks
from metralectl.doctor.context import Context
from tests.unit import doctor_fakes as df
from tests.unit import fake_pynvml as fk
from tests.unit.recipe_helpers import REPO

GOLDEN = REPO / "tests" / "golden"
GiB = 1024**3


def report(ctx: Context, tmp_path: Path) -> tuple[str, int]:
    results = run_checks(ctx, CHECKS)
    ctx.close()
    text = render_text(results, elapsed_s=0.42)
    text = text.replace(str(tmp_path), "/tmp/doctor").replace(f"uid {df.TEST_UID})", "uid 1000)")
    return text + "\n", exit_code(results)


def compare(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("METRALECTL_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs; see the module docstring to regenerate"


def test_all_ok_machine(tmp_path: Path) -> None:
    snap = paths.hf_hub_cache() / "models--Sehyo--Qwen3.5-35B-A3B-NVFP4" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (snap / "model.safetensors").write_text("x")
    df.chown_tree(paths.hf_home())
    text, code = report(df.make_ctx(tmp_path, environ={"PATH": f"/usr/bin:{tmp_path}/home/alice/.local/bin",
                                                       "HF_TOKEN": "hf_x"}), tmp_path)
    assert code == 0
    compare("doctor-all-ok.txt", text)


@pytest.mark.skipif(os.geteuid() != 0, reason="the all-bad machine plants a root-owned file, which needs root")
def test_all_bad_machine(tmp_path: Path) -> None:
    alice = tmp_path / "home" / "alice"
    cache = alice / ".cache" / "huggingface" / "hub" / "models--Sehyo--Qwen3.5-35B-A3B-NVFP4" / "blobs"
    cache.mkdir(parents=True)
    df.chown_tree(alice, 1000)
    (cache / "0f1e2d").write_text("x")  # root-owned: written by `sudo metralectl`
    hub = paths.hf_hub_cache()  # root's own cache is a file, not a directory
    hub.parent.mkdir(parents=True, exist_ok=True)
    hub.write_text("not a directory")
    me = df.identity(tmp_path / "home" / "root", uid=0, euid=0, gid=0, user="root", group="root", groups=(0,),
                     docker_listed=False, sudo_user="alice", sudo_uid=1000, sudo_gid=1000, sudo_home=alice,
                     sudo_group="alice")
    h200 = fk.FakeDevice(memory=(143771 * 1024**2, 61 * GiB), compute_procs=[(4242, 60 * GiB)])
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(df.MEMINFO)
    ctx = df.make_ctx(
        tmp_path, identity=me, environ={"PATH": "/usr/sbin:/usr/bin"}, which=df.fake_which({}),
        runtime_factory=df.raising(df.unavailable("not-running", "the Docker daemon is not running (no socket at "
                                                  "/var/run/docker.sock)",
                                                  "sudo systemctl start docker && sudo systemctl enable docker")),
        endpoint=lambda: ("unix:///var/run/docker.sock.test-absent", "default"),
        gpu_probe_factory=df.probe_factory([h200], meminfo, cuda=12080, driver="570.86.15"),
        cpu_arch=lambda: "aarch64", port_probe=df.in_use, port_holder=lambda port: {"pid": 777, "process": "node"},
        disk_usage=df.disk(4), agent_view=lambda: None)
    df.fake_proc(ctx.proc_root, 4242, "python3", container_id="e" * 64)
    text, code = report(ctx, tmp_path)
    assert code == 1
    compare("doctor-all-bad.txt", text)
