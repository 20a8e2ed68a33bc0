"""llama.cpp's real `llama-server`, started as a host process through ProcessRuntime: ready (/health 200), stopped,
and afterwards no process of it and no listener on its port.

The binary is the one CI builds and caches (images/build-llama-server.sh --print-cache-dir, the lookup
tests/real_llamacpp/image.sh makes); the model the tiny GGUF of tests/real_llamacpp/build_tiny_gguf.py in an HF
cache layout, found with `-hf ORG/NAME:Q8_0 --offline`. Skips with the reason when either is missing, except under
CI (CI set), where .ci/run builds the binary, so a missing one fails instead of passing as "skipped".
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from metralectl.core.labels import LABEL_MANAGED, LABEL_OWNER, LABEL_RECIPE, owner
from metralectl.core.render import ContainerSpec
from metralectl.seams.process.runtime import ProcessRuntime
from tests.contract.conftest import proc_alive
from tests.ports import PortTaken, port_in_use, start_retrying

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "images" / "build-llama-server.sh"


def _fail_or_skip(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def llama_server() -> str:
    entry = subprocess.run(["bash", str(BUILD), "--print-cache-dir"], capture_output=True, text=True, timeout=60)
    binary = Path(entry.stdout.strip()) / "bin" / "llama-server"
    if entry.returncode != 0 or not os.access(binary, os.X_OK):
        _fail_or_skip(f"llama-server is not built ({binary}): run `bash scripts/build-llama-server.sh` "
                      f"(builds llama.cpp once, ~10 min). {entry.stderr.strip()[-300:]}")
    return str(binary)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    try:
        import gguf  # noqa: F401  (the writer's dependency)
    except ImportError:
        _fail_or_skip("the `gguf` package is missing (scripts/bootstrap.sh installs tests/realengines/requirements.txt)")
    sys.path.insert(0, str(REPO / "tests" / "real_llamacpp"))
    import build_tiny_gguf

    cache = tmp_path_factory.mktemp("llama-hf") / "hub"
    return cache, build_tiny_gguf.install(cache)


def _health(port: int) -> int | None:
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code
    except httpx.TransportError:
        return None


def _listening(port: int) -> bool:
    """Whether anything accepts connections on 127.0.0.1:port."""
    with socket.socket() as probe:
        probe.settimeout(2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_llama_server_as_a_host_process_serves_then_stops_leaving_nothing(
        llama_server: str, tiny_model: tuple[Path, dict[str, Any]]) -> None:
    cache, model = tiny_model
    rt = ProcessRuntime()
    name = "metralectl-pr-llama"

    def start(port: int) -> int:
        spec = ContainerSpec(
            name=name, image=f"process:{llama_server}", port=port, gpus=None,
            command=(llama_server, "-hf", model["hf_arg"], "--offline", "--metrics", "--host", "127.0.0.1",
                     "--port", str(port), "-c", "4096", "-np", "1", "--alias", "tiny-llama"),
            env={"HF_HUB_CACHE": str(cache)}, labels={LABEL_MANAGED: "true", LABEL_OWNER: owner(), LABEL_RECIPE: "tiny"})
        started = rt.create_and_start(spec)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if _health(port) == 200:
                return port
            info = rt.inspect(started.id)
            if info is None or not info.running:
                said = "\n".join(rt.log_tail(name, 40))
                rt.remove(name, force=True)
                if port_in_use(said, "llama-cpp"):
                    raise PortTaken(said)
                raise AssertionError(f"llama-server exited while loading ({info}):\n{said}")
            time.sleep(0.05)
        raise AssertionError("llama-server not ready in 120 s:\n" + "\n".join(rt.log_tail(name, 40)))

    try:
        port = start_retrying(start)
        info = rt.inspect(name)
        assert info is not None and info.running and info.command[0] == llama_server
        pids = rt.container_pids(name)
        engine = int(info.id.split("-")[0])
        assert engine in pids and os.readlink(f"/proc/{engine}/exe") == os.path.realpath(llama_server)
        assert any(f"listening on http://127.0.0.1:{port}" in line for line in rt.log_tail(name, 200))

        rt.stop(name, timeout_s=30)
        after = rt.inspect(name)
        assert after is not None and after.status == "exited", after
        assert not any(proc_alive(pid) for pid in pids) and rt.container_pids(name) == set()
        assert not _listening(port), f"something still listens on {port} after stop"
        rt.remove(name)
        assert rt.inspect(name) is None
    finally:
        rt.remove(name, force=True)
