"""What `metralectl pull` leaves for a GGUF quant is what the REAL llama-server loads with `-hf REPO:QUANT --offline`.

Nothing of llama.cpp is a double: the binary is the one scripts/build-llama-server.sh built from llama.cpp's
source (run directly on this host, loopback only); its file choice is read back from its own /props
(`model_path`). The checkpoints are tiny random-weight GGUFs (tests/real_llamacpp/build_tiny_gguf.py) served
by the fake Hub (tests/fakehub, 127.0.0.1) in the layout of an Unsloth repository: a split quant in a folder
named after it, two single-file quants, a multimodal projector (junk bytes: llama-server would fail loading
it, were it pulled) and a router preset.ini (it would make llama-server serve a preset, were it pulled).

Skips with the reason when llama-server is not built — except under CI (CI set), where .ci/run builds it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metralectl import paths
from metralectl.core.recipe import CheckpointRef
from metralectl.seams.hf import cache as hfcache, hub as hfhub, state as hfstate, weights
from tests.fakehub.server import FakeHub, FakeRepo
from tests.ports import PortTaken, port_in_use, start_retrying

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[2]
REPO = "metralectl-test/tiny-gguf-quants"
SPLIT = ("UD-Q4_K_XL/tiny-UD-Q4_K_XL-00001-of-00002.gguf", "UD-Q4_K_XL/tiny-UD-Q4_K_XL-00002-of-00002.gguf")
Q8, Q4 = "tiny-Q8_0.gguf", "tiny-Q4_K_M.gguf"


def _fail_or_skip(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def llama_server() -> Path:
    out = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "build-llama-server.sh"), "--print-cache-dir"],
                         capture_output=True, text=True, check=True)
    binary = Path(out.stdout.strip()) / "bin" / "llama-server"
    if not binary.is_file():
        _fail_or_skip(f"llama-server is not built ({binary}): run `bash scripts/build-llama-server.sh` (~10 min once)")
    return binary


@pytest.fixture(scope="module")
def repo_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    try:
        import gguf  # noqa: F401  (the writer's dependency)
    except ImportError:
        _fail_or_skip("the `gguf` package is missing (scripts/bootstrap.sh installs tests/realengines/requirements.txt)")
    sys.path.insert(0, str(REPO_ROOT / "tests" / "real_llamacpp"))
    import build_tiny_gguf

    work = tmp_path_factory.mktemp("gguf-quants")
    (work / "UD-Q4_K_XL").mkdir()
    build_tiny_gguf.build_gguf(work / "UD-Q4_K_XL" / "tiny-UD-Q4_K_XL.gguf", name="split", split_max_tensors=12)
    build_tiny_gguf.build_gguf(work / Q8, name="q8")
    build_tiny_gguf.build_gguf(work / Q4, name="q4")
    files = {p: (work / p).read_bytes() for p in (*SPLIT, Q8, Q4)}
    files["mmproj-F16.gguf"] = b"not a projector" * 100
    files["preset.ini"] = b"[tiny]\nhf-repo = " + REPO.encode() + b":Q8_0\n"
    files["README.md"] = b"# tiny\n"
    return files


@pytest.fixture
def hub(repo_files: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub([FakeRepo.build(REPO, repo_files)]) as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield fake


def ck(quant: str) -> CheckpointRef:
    return CheckpointRef(repo=REPO, quant=quant, revision=None, format="gguf")


def serve(binary: Path, quant: str, timeout: float = 60) -> tuple[int | None, dict[str, Any] | None, str]:
    """Start llama-server on the test's HF cache; (exit status or None, /props once healthy, its log).
    llama-server binds the port itself: a start that lost it to another program is tried again on another."""

    def start(port: int) -> tuple[int | None, dict[str, Any] | None, str]:
        code, props, log = _serve_on(binary, quant, port, timeout)
        if props is None and port_in_use(log, "llama-cpp"):
            raise PortTaken(log)
        return code, props, log

    return start_retrying(start)


def _serve_on(binary: Path, quant: str, port: int, timeout: float) -> tuple[int | None, dict[str, Any] | None, str]:
    import httpx

    env = {k: v for k, v in os.environ.items() if k not in ("LLAMA_CACHE", "HF_ENDPOINT")}
    env["HF_HUB_CACHE"] = str(paths.hf_hub_cache())
    log = paths.hf_hub_cache().parent / f"llama-server-{quant}.log"
    with open(log, "w") as sink:
        proc = subprocess.Popen([str(binary), "-hf", f"{REPO}:{quant}", "--offline", "--host", "127.0.0.1",
                                 "--port", str(port), "-c", "256", "-np", "1", "--no-warmup", "-v"],
                                stdout=sink, stderr=subprocess.STDOUT, env=env)
    props: dict[str, Any] | None = None
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    props = httpx.get(f"http://127.0.0.1:{port}/props", timeout=5).json()
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    finally:
        code = proc.poll()
        if code is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return code, props, log.read_text(errors="replace")


def test_llama_server_loads_exactly_the_files_pull_verified(llama_server: Path, hub: FakeHub) -> None:
    result = weights.pull(ck("UD-Q4_K_XL"))
    snapshot = hfcache.snapshot_path(REPO, result.commit)
    assert result.paths == SPLIT and not (snapshot / "mmproj-F16.gguf").exists()
    weights.weights_preflight(SimpleRecipe("UD-Q4_K_XL"))
    code, props, log = serve(llama_server, "UD-Q4_K_XL")
    assert props is not None, f"llama-server did not come up (exit {code}):\n{log[-3000:]}"
    assert props["model_path"] == str(snapshot / SPLIT[0]), log[-3000:]  # part 1; part 2 is found by its name
    assert "llama_model_loader: additional 1 GGUFs metadata loaded" in log

    weights.pull(ck("Q8_0"))  # a second quant next to the first
    code, props, log = serve(llama_server, "Q8_0")
    assert props is not None and props["model_path"] == str(snapshot / Q8), log[-3000:]

    # a quant metralectl says is absent is one llama-server cannot find either
    assert hfstate.checkpoint_state(ck("Q4_K_M")).status == "absent"
    with pytest.raises(hfhub.WeightsError, match="Q4_K_M is absent"):
        weights.weights_preflight(SimpleRecipe("Q4_K_M"))
    code, props, log = serve(llama_server, "Q4_K_M")
    assert props is None and code not in (None, 0), log[-3000:]


def test_a_missing_part_is_partial_for_metralectl_and_fatal_for_llama_server(llama_server: Path,
                                                                              hub: FakeHub) -> None:
    result = weights.pull(ck("UD-Q4_K_XL"))
    (hfcache.snapshot_path(REPO, result.commit) / SPLIT[1]).unlink()
    assert hfstate.checkpoint_state(ck("UD-Q4_K_XL")).status == "partial"
    code, props, log = serve(llama_server, "UD-Q4_K_XL")
    assert props is None and code not in (None, 0), log[-3000:]


def test_what_pull_leaves_out_would_change_what_llama_server_does(llama_server: Path, hub: FakeHub,
                                                                  repo_files: dict[str, bytes]) -> None:
    """Why a quant's pull takes its model files only: the repository's projector, once in the cache, is
    loaded by llama-server on its own (here it is junk, so the server fails to start)."""
    result = weights.pull(ck("Q8_0"))
    snapshot = hfcache.snapshot_path(REPO, result.commit)
    (snapshot / "mmproj-F16.gguf").write_bytes(repo_files["mmproj-F16.gguf"])
    code, props, log = serve(llama_server, "Q8_0")
    assert props is None and code not in (None, 0), log[-3000:]
    assert "mmproj-F16.gguf" in log


class SimpleRecipe:
    """What weights_preflight reads of a recipe."""

    def __init__(self, quant: str) -> None:
        self.name = f"tiny-{quant.lower()}"
        self.checkpoint = ck(quant)
