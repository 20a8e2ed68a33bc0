"""Where a host-process engine's program is: engines.yaml in the config dir, else PATH; never a guess, and a
miss says where it looked and how to fix it (seams/engine_programs.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from metralectl.core.engine_profile import ProcessStart
from metralectl.errors import ExitCode, RecipeInvalid
from metralectl.seams.engine_programs import ProgramMissing, locate

LLAMA = ProcessStart(executable="llama-server")
KNOWN = ("llama-cpp", "metrale")


def _program(directory: Path, name: str = "llama-server", mode: int = 0o755) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(mode)
    return path


def _config(isolated_env: Path, text: str) -> Path:
    path = isolated_env / "config" / "engines.yaml"
    path.write_text(text)
    return path


def test_the_program_is_found_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    program = _program(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'empty'}{os.pathsep}{tmp_path / 'bin'}")
    found = locate("llama-cpp", LLAMA, KNOWN)
    assert found.path == str(program) and found.how == "PATH"


def test_engines_yaml_names_it_before_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           isolated_env: Path) -> None:
    _program(tmp_path / "bin")
    mine = _program(tmp_path / "opt", "my-llama-server")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    _config(isolated_env, f"llama-cpp:\n  executable: {mine}\n")
    found = locate("llama-cpp", LLAMA, KNOWN)
    assert found.path == str(mine) and "engines.yaml (llama-cpp.executable)" in found.how


def test_a_home_relative_path_in_engines_yaml_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          isolated_env: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    mine = _program(tmp_path / "llama" / "bin")
    _config(isolated_env, "llama-cpp: {executable: ~/llama/bin/llama-server}\n")
    assert locate("llama-cpp", LLAMA, KNOWN).path == str(mine)


def test_a_missing_program_says_where_it_looked_and_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}")
    with pytest.raises(ProgramMissing) as missing:
        locate("llama-cpp", LLAMA, KNOWN)
    error = missing.value
    assert error.exit_code == ExitCode.UNAVAILABLE
    assert "`llama-server` is not on PATH" in error.message and str(tmp_path / "a") in error.message
    assert "engines.yaml names no llama-cpp.executable" in error.message
    assert "llama-cpp: {executable: /absolute/path/to/llama-server}" in (error.hint or "")


@pytest.mark.parametrize("given", ["/nowhere/llama-server", "relative/llama-server", "not-on-path-anywhere"])
def test_engines_yaml_naming_what_is_not_there_is_refused(given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          isolated_env: Path) -> None:
    _program(tmp_path / "bin")  # PATH has one: it is not used behind the user's back
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    _config(isolated_env, f"llama-cpp:\n  executable: {given}\n")
    with pytest.raises(ProgramMissing, match="which is not an executable file") as missing:
        locate("llama-cpp", LLAMA, KNOWN)
    assert "remove it to use `llama-server` from PATH" in (missing.value.hint or "")


def test_a_file_that_may_not_be_executed_is_not_a_program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _program(tmp_path / "bin", mode=0o644)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(ProgramMissing):
        locate("llama-cpp", LLAMA, KNOWN)


def test_a_misspelt_engine_or_key_in_engines_yaml_is_refused_with_its_line(isolated_env: Path) -> None:
    _config(isolated_env, "llama-cpp:\n  executable: /x\nllama-ccp:\n  executable: /y\n")
    with pytest.raises(RecipeInvalid) as refused:
        locate("llama-cpp", LLAMA, KNOWN)
    assert "engines.yaml:3:1" in refused.value.message and "unknown engine 'llama-ccp'" in refused.value.message
    assert refused.value.hint == "did you mean `llama-cpp`?" and refused.value.exit_code == ExitCode.DATA
    _config(isolated_env, "llama-cpp:\n  exectuable: /x\n")
    with pytest.raises(RecipeInvalid, match="exectuable"):
        locate("llama-cpp", LLAMA, KNOWN)


def test_a_module_engine_looks_up_its_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   isolated_env: Path) -> None:
    python = _program(tmp_path / "venv" / "bin", "python")
    _config(isolated_env, f"vllm:\n  interpreter: {python}\n")
    found = locate("vllm", ProcessStart(module="vllm.entrypoints.openai.api_server"), ("vllm",))
    assert found.path == str(python) and "vllm.interpreter" in found.how
