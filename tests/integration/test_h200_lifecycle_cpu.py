"""The H200 lifecycle run (benchmarks/h200/run_lifecycle_gpu.sh's driver), as its CPU dry run: lifecycle_gpu.py
drives the real CLI through run → ps → logs → top → bench → swap → swap to a truncated model (rolls back) →
stop, with llama-server (CI's CPU build) started as a host process (`runtime: process`, found on PATH), and
check_lifecycle.py must find every expectation held — with no NVML here, the run says "no GPU" and the GPU
memory expectations are the device's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ports import own_port

pytestmark = [pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "benchmarks" / "h200"


def _fail_or_skip(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def llama_server() -> Path:
    out = subprocess.run(["bash", str(REPO / "scripts" / "build-llama-server.sh"), "--print-cache-dir"],
                         capture_output=True, text=True, check=True)
    binary = Path(out.stdout.strip()) / "bin" / "llama-server"
    if not binary.is_file():
        _fail_or_skip(f"llama-server is not built ({binary}): run `bash scripts/build-llama-server.sh` (~10 min once)")
    return binary


def test_the_lifecycle_dry_run_holds_every_expectation_with_the_engine_as_a_process(
        tmp_path: Path, llama_server: Path) -> None:
    try:
        import gguf  # noqa: F401  (the model writer's dependency)
    except ImportError:
        _fail_or_skip("the `gguf` package is missing (scripts/bootstrap.sh installs tests/realengines/requirements.txt)")
    # No Docker daemon for this run (as on the H200): a model another test serves in a container on a shared daemon
    # would be this machine's served model too, and refuse the run
    env = {**os.environ, "PYTHONPATH": str(REPO), "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    made = subprocess.run([sys.executable, str(H200 / "make_lifecycle_models.py"), "--hf-cache", str(tmp_path / "hub"),
                           "--preset", "tiny", "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert made.returncode == 0, made.stderr
    (tmp_path / "models.json").write_text(made.stdout)
    port = own_port()  # held for the whole test: llama-server binds beside it (SO_REUSEADDR), nobody else can
    res = tmp_path / "res"
    drive = subprocess.run(
        [sys.executable, str(H200 / "lifecycle_gpu.py"), "--res", str(res), "--metralectl", f"{sys.executable} -m metralectl",
         "--models", str(tmp_path / "models.json"), "--engine-dir", str(llama_server.parent), "--gpus", "none",
         "--ngl", "0", "--ctx", "1024", "--parallel", "2", "--threads", "1", "--port", str(port),
         "--bench-repeats", "3", "--max-tokens", "16", "--bench-param", "client_bound=warn", "--settle-s", "1"],
        capture_output=True, text=True, timeout=600, env=env)
    assert drive.returncode == 0, drive.stdout[-3000:] + drive.stderr[-3000:]
    assert "no GPU: " in drive.stdout  # said plainly, not a silent pass
    check = subprocess.run([sys.executable, str(H200 / "check_lifecycle.py"), str(res), "--allow-no-gpu"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr + drive.stdout[-3000:]
    life = json.loads((res / "lifecycle.json").read_text())
    printed = next(s for s in life["steps"] if s["name"] == "print-a")
    out = (res / "steps" / printed["stdout"]).read_text()
    assert str(llama_server) in out and "--n-gpu-layers 0" in out, out  # the process argv, from PATH
    ps = next(s for s in life["steps"] if s["name"] == "ps-a")["json"]
    [served] = [e for e in ps["serving"] if e["recipe"] == "lc-a"]
    assert served["image"] == f"process:{llama_server}", served
