"""Choosing how an engine runs: `--runtime docker|process` on run/swap (and the agent's job body), which is the
recipe's `runtime:` overridden as a --set; `run --print` and `show` of a host process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metralectl.app.serving_change import Change
from metralectl.errors import UsageError

REPO = Path(__file__).resolve().parents[2]


def test_runtime_is_the_set_runtime_eq_r_recorded_with_the_others() -> None:
    change = Change.run("demo-cpu", ["parallel=4"], runtime="process")
    assert change.sets == ("parallel=4", "runtime=process") and change.options.sets == change.sets
    assert Change.swap("demo-cpu", ["runtime=docker"], runtime="process").sets == ("runtime=process",)


def test_the_agents_job_body_takes_a_runtime() -> None:
    run = Change.from_json({"recipe": "demo-cpu", "runtime": "process"}, kind="run")
    assert run.sets == ("runtime=process",)
    swap = Change.from_json({"recipe": "demo-cpu", "runtime": "docker", "sets": ["parallel=4"]}, kind="swap")
    assert swap.sets == ("parallel=4", "runtime=docker")
    with pytest.raises(UsageError, match="runtime must be"):
        Change.from_json({"recipe": "demo-cpu", "runtime": 1}, kind="run")
    with pytest.raises(UsageError, match="unknown runtime 'proces'") as refused:
        Change.from_json({"recipe": "demo-cpu", "runtime": "proces"}, kind="run")
    assert refused.value.hint == "did you mean `process`?"
    with pytest.raises(UsageError, match="unknown key runtime"):
        Change.from_json({"runtime": "process"}, kind="stop")


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_a_misspelt_runtime_on_the_command_line_is_a_usage_error() -> None:
    for command in (["run", "demo-cpu", "--print"], ["swap", "demo-cpu"]):
        out = _cli(*command, "--runtime", "procss")
        assert out.returncode == 64, out.stderr
        assert "unknown runtime 'procss'" in out.stderr and "did you mean `process`?" in out.stderr
        assert "Traceback" not in out.stderr


def test_print_of_a_host_process_whose_program_is_missing_says_where_it_looked(tmp_path: Path) -> None:
    out = _cli("run", "demo-cpu", "--runtime", "process", "--print", env={"PATH": str(tmp_path / "empty")})
    assert out.returncode == 69 and out.stdout == "", out
    assert "`llama-server` is not on PATH" in out.stderr and str(tmp_path / "empty") in out.stderr
    assert "engines.yaml: `llama-cpp: {executable: /absolute/path/to/llama-server}`" in out.stderr


def _fake_program(tmp_path: Path) -> Path:
    program = tmp_path / "bin" / "llama-server"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    return program


def test_print_shows_the_exact_argv_and_environment(tmp_path: Path, isolated_env: Path) -> None:
    program = _fake_program(tmp_path)
    env = {"PATH": f"{program.parent}:/usr/bin:/bin", "LANG": "C.UTF-8", "SECRET_OF_MINE": "x"}
    out = _cli("run", "demo-cpu", "--runtime", "process", "--print", env=env)
    assert out.returncode == 0, out.stderr
    assert "deviation from the validated recipe: runtime: docker -> process" in out.stderr
    text = out.stdout
    assert text.startswith("env -i \\\n") and f"PATH={program.parent}:/usr/bin:/bin" in text and "LANG=C.UTF-8" in text
    assert "SECRET_OF_MINE" not in text and "docker run" not in text
    assert f"HF_HOME={isolated_env / 'hf'}" in text and f"HF_HUB_CACHE={isolated_env / 'hf' / 'hub'}" in text
    assert f"\n  {program} \\\n  --hf-repo Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M --host 127.0.0.1 --port 8080" in text
    spec = json.loads(_cli("run", "demo-cpu", "--runtime", "process", "--print", "--json", env=env).stdout)
    assert spec["command"][0] == str(program) and spec["image"] == f"process:{program}"
    assert spec["environment"] == {"PATH": env["PATH"], "HOME": os.environ["HOME"], "LANG": "C.UTF-8",
                                   **({"USER": os.environ["USER"]} if "USER" in os.environ else {}),
                                   **{k: v for k, v in os.environ.items() if k in ("LOGNAME", "TZ", "TMPDIR")
                                      or k.startswith("LC_")}, **spec["env"]}


def test_show_of_a_host_process_recipe(tmp_path: Path, isolated_env: Path) -> None:
    (isolated_env / "config" / "recipes").mkdir()
    (isolated_env / "config" / "recipes" / "demo-proc.yaml").write_text("extends: demo-cpu\nname: demo-proc\n"
                                                                         "runtime: process\n")
    missing = _cli("show", "demo-proc", env={"PATH": str(tmp_path / "empty")})
    assert missing.returncode == 0, missing.stderr
    assert "Command (a host process: runtime process)" in missing.stdout
    assert "cannot be rendered here: llama-cpp: `llama-server` is not on PATH" in missing.stdout
    program = _fake_program(tmp_path)
    found = _cli("show", "demo-proc", "--json", env={"PATH": f"{program.parent}:/usr/bin"})
    shown = json.loads(found.stdout)
    assert shown["runtime"] == "process" and shown["commands"][0].startswith("env -i")
    assert shown["container_specs"][0]["command"][0] == str(program)


def test_pull_of_a_host_process_recipe_asks_docker_for_no_image(tmp_path: Path) -> None:
    out = _cli("pull", "demo-cpu", "--set", "runtime=process", "--image-only", "--json",
               env={"DOCKER_HOST": f"unix://{tmp_path}/no.sock"})
    assert out.returncode == 0, out.stderr
    assert "demo-cpu: runs as a host process (runtime: process): no image to pull" in out.stderr
    assert json.loads(out.stdout) == {"recipes": [{"recipe": "demo-cpu", "image": None, "weights": None}]}
