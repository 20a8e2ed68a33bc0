"""`doctor --recipe R` for a recipe run as a host process: its program (found where `run` finds it, built for
this CPU, or where it looked and the fix), and no Docker check counted against it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metralectl.doctor.registry import select
from tests.unit import doctor_fakes as df
from tests.unit.test_doctor_checks import run

REPO = Path(__file__).resolve().parents[2]
DOCKER_CHECKS = ("docker.daemon", "docker.version", "docker.nvidia-runtime", "docker.gpu-request", "cpu.arch",
                 "recipe.image")


def _program(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "llama-server"
    path.write_bytes(Path(sys.executable).resolve().read_bytes()[:64])  # an ELF header of this machine's
    path.chmod(0o755)
    return path


def test_a_process_recipe_is_judged_by_its_program_not_by_docker(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    program = _program(tmp_path / "bin")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    ctx = df.make_ctx(tmp_path, recipe="qwen3.5-35b-a3b-llamacpp", recipe_sets=("runtime=process",),
                      runtime=df.FakeRuntime(), endpoint=lambda: ("unix:///nowhere.sock", "default"))
    got = run(ctx, "recipe.program", *DOCKER_CHECKS)
    assert got["recipe.program"].status == "ok" and str(program) in got["recipe.program"].detail
    assert "from PATH" in got["recipe.program"].detail
    for check in DOCKER_CHECKS:
        assert got[check].status == "skipped" and "runs as a host process" in got[check].detail, check


def test_a_missing_program_says_where_it_looked_and_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    ctx = df.make_ctx(tmp_path, recipe="qwen3.5-35b-a3b-llamacpp", recipe_sets=("runtime=process",))
    found = run(ctx, "recipe.program")["recipe.program"]
    assert found.status == "problem" and "`llama-server` is not on PATH" in found.detail
    assert str(tmp_path / "empty") in found.detail and "engines.yaml" in (found.remedy or "")


def test_a_container_recipe_needs_no_program(tmp_path: Path) -> None:
    got = run(df.make_ctx(tmp_path, recipe="qwen3.5-35b-a3b-hopper"), "recipe.program", "recipe.image")
    assert got["recipe.program"].status == "skipped" and "runs in a container" in got["recipe.program"].detail
    assert got["recipe.image"].status == "ok"
    assert "recipe.program" in [c.id for c in select("qwen3.5-35b-a3b")]


def test_doctor_runtime_process_through_the_cli(tmp_path: Path, isolated_env: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path / "nothing-here"), "DOCKER_HOST": f"unix://{tmp_path}/no.sock"}
    out = subprocess.run([sys.executable, "-m", "metralectl", "doctor", "--recipe", "demo-cpu", "--runtime", "process",
                          "--json"], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    report = json.loads(out.stdout)
    checks = {c["id"]: c for c in report["checks"]}
    assert out.returncode == 1 and report["options"]["runtime"] == "process"
    assert checks["recipe.program"]["status"] == "problem"
    assert "is not on PATH" in checks["recipe.program"]["detail"]
    assert checks["docker.daemon"]["status"] == "skipped"  # no daemon here, and none needed
    bad = subprocess.run([sys.executable, "-m", "metralectl", "doctor", "--runtime", "procss", "--recipe", "demo-cpu"],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert bad.returncode == 64 and "did you mean `process`?" in bad.stderr and "Traceback" not in bad.stderr
