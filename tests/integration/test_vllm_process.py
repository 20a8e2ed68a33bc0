"""The real vLLM (0.32.0, its CPU build) run by metralectl as a host process (`runtime: process`), through the real
CLI in a subprocess, on a box without Docker.

vLLM is the venv tests/realengines/vllm_cpu_venv.sh builds once per machine (.ci/run builds it before pytest; the
test is skipped with the reason where it is absent, and fails under CI); the config dir's engines.yaml names its
Python (`vllm: {interpreter: ...}`) and CI's cached llama-server (tests/integration/test_llamacpp_process.py finds it
the same way). The model is a tiny random Llama (hidden 256, 4 heads: a head size vLLM's CPU attention takes) with a
fast tokenizer whose tokens decode to text (tests/realengines/build_tiny_llama.py, built by vLLM's own Python),
verified in the box's Hugging Face cache as `metralectl pull` leaves it; llama.cpp's is the tiny GGUF.

One test, one vLLM start shared by every step (a start is about a minute on two busy cores): run → ps → logs →
chat → bench (every request ok; its token counts equal to vLLM's own /metrics counters, read before and after) →
top --once --json (vLLM's series mapped, engine vllm) → bench at its URL (vLLM detected from its answers) → swap to llama.cpp (as a process) → swap back → stop: no
process of either engine left, nothing listening.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_llamacpp_process import BUILD, TINY as GGUF_REPO, _builder, _proc_entries, _verified
from tests.ports import HeldPort
from tests.realengines.vllm_cpu import venv_or_skip

pytestmark = [pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]
VLLM_REPO = "metralectl-test/tiny-llama-vllm"
REVISION = "0" * 40
MODEL_ARGS = ["--hidden", "256", "--heads", "4", "--kv-heads", "4", "--intermediate", "512"]
API_MODULE = "vllm.entrypoints.openai.api_server"


def _fail_or_skip(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    return venv_or_skip() / "bin" / "python"


@pytest.fixture(scope="module")
def llama_server() -> Path:
    out = subprocess.run(["bash", str(BUILD), "--print-cache-dir"], capture_output=True, text=True, timeout=60)
    binary = Path(out.stdout.strip()) / "bin" / "llama-server"
    if out.returncode != 0 or not os.access(binary, os.X_OK):
        _fail_or_skip(f"llama-server is not built here ({binary}): run `bash {BUILD.relative_to(REPO)}` once")
    return binary.resolve()


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory: pytest.TempPathFactory, vllm_python: Path) -> Path:
    """One HF cache: the tiny Llama (safetensors) for vLLM and the tiny GGUF for llama.cpp, both verified."""
    cache = Path.home() / ".cache" / "metralectl-tests" / "vllm"  # built once per machine (the key hashes its inputs)
    built = subprocess.run([str(vllm_python), str(REPO / "tests" / "realengines" / "build_tiny_llama.py"),
                            "--cache-root", str(cache), *MODEL_ARGS], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    model_dir = Path(built.stdout.strip().splitlines()[-1])
    home = tmp_path_factory.mktemp("hf")
    base = home / "hub" / ("models--" + VLLM_REPO.replace("/", "--"))
    snap = base / "snapshots" / REVISION
    snap.mkdir(parents=True)
    for path in model_dir.iterdir():
        if path.is_file() and path.name != "metralectl-build.json":
            shutil.copyfile(path, snap / path.name)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(REVISION)
    _verified(home / "hub", VLLM_REPO)
    _builder().install(home / "hub")
    _verified(home / "hub", GGUF_REPO)
    return home


class Box:
    """The test's machine without Docker: config (engines.yaml naming vLLM's Python and the llama-server binary, a
    user image description for vLLM on the cpu class, the two recipes), state, and the shared HF cache."""

    def __init__(self, home: Path, hf_home: Path, vllm_python: Path, llama_server: Path) -> None:
        self.home, self.python, self.binary = home, vllm_python, llama_server
        self.config = home / "config"
        for sub in ("recipes", "images"):
            (self.config / sub).mkdir(parents=True)
        (self.config / "engines.yaml").write_text(f"vllm:\n  interpreter: {vllm_python}\n"
                                                  f"llama-cpp:\n  executable: {llama_server}\n")
        # vLLM's images are NVIDIA's for GB10; on this cpu box the engine runs from its venv (runtime: process), so
        # the recipe names a description of that, as a user would (never pulled: a host process has no image).
        (self.config / "images" / "vllm-cpu-venv.yaml").write_text(
            "schema: 1\nid: vllm-cpu-venv\nref: metralectl-test/vllm-cpu:0.32.0\nengine: vllm\nhardware: [cpu]\n"
            "platform: linux/amd64\ncertified: false\nnotes: vLLM's CPU build in a venv, run as a host process\n")
        self.held = HeldPort()  # both engines bind beside it (SO_REUSEADDR); nobody else can take the port
        self.port = self.held.port
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "METRALECTL_CONFIG_DIR": str(self.config), "HF_HOME": str(hf_home),
                    "METRALE_HOME": str(home / "metrale"), "METRALECTL_CACHE_DIR": str(home / "cache"),
                    "METRALECTL_LOCK_DIR": str(home), "NO_COLOR": "1", "PYTHONUNBUFFERED": "1",
                    "DOCKER_HOST": f"unix://{home}/no-docker.sock"}
        self.env.pop("HF_HUB_CACHE", None)
        self.vllm = self._recipe(
            "proc-vllm", "engine: vllm\nruntime: process\n"
            f"checkpoint: {{repo: {VLLM_REPO}, quant: fp32, model: qwen2.5-0.5b-instruct, revision: null}}\n"
            "image: vllm-cpu-venv\n"
            "serve: {max-model-len: 1024, max-num-seqs: 4, served-model-name: tiny-vllm, dtype: float32}\n"
            "env: {VLLM_CPU_KVCACHE_SPACE: '1'}\n", "memory-utilization: 0.5, ")
        self.llama = self._recipe(
            "proc-llama", "engine: llama-cpp\nruntime: process\n"
            f"checkpoint: {{repo: {GGUF_REPO}, quant: Q8_0, model: qwen2.5-0.5b-instruct, revision: null}}\n"
            "image: llama-cpp-cpu\n"
            "serve: {ctx-size: 1024, parallel: 2, n-gpu-layers: 0, alias: tiny-llama, threads: 2, ui: false}\n")

    def _recipe(self, name: str, body: str, resources: str = "") -> str:
        (self.config / "recipes" / f"{name}.yaml").write_text(
            f"schema: 1\nname: {name}\ndescription: a tiny model on a real engine, as a host process\n{body}"
            f"hardware: cpu\nresources: {{{resources}port: {self.port}, bind: 127.0.0.1, gpus: none, ranks: 1}}\n"
            "validated: {source: null, hardware: cpu}\n")
        return name

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                              env=self.env, cwd=REPO, timeout=timeout)

    def json(self, *args: str, timeout: float = 300) -> Any:
        out = self.cli(*args, timeout=timeout)
        assert out.stdout.strip(), f"{args}: {out.returncode}\n{out.stderr}"
        return json.loads(out.stdout)

    def sessions(self) -> dict[int, set[int]]:
        """This box's engines, by session: vLLM's API server (its EngineCore and worker share its session) or
        llama-server, serving our port -> every pid in that session."""
        ours = set()
        table: dict[int, set[int]] = {}
        for pid, exe, cmdline, _ in _proc_entries():
            sid = _sid(pid)
            if sid is None:
                continue
            table.setdefault(sid, set()).add(pid)
            words = cmdline.split()
            serves_port = any(w == "--port" and words[i + 1] == str(self.port) for i, w in enumerate(words[:-1]))
            if serves_port and (API_MODULE in words or exe == str(self.binary)):
                ours.add(sid)
        return {sid: table[sid] for sid in ours}

    def listening(self) -> bool:
        with socket.socket() as probe:
            probe.settimeout(1.0)
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def cleanup(self) -> None:
        if self.sessions():
            self.cli("stop", "--all", timeout=180)
        for pids in self.sessions().values():  # a failed test's leftovers: never left running
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        self.held.close()


def _sid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[3])  # pid (comm) state ppid pgrp session ...


def _alive(pids: set[int]) -> dict[int, str]:
    """Which of pids still run, with their command lines. A zombie has exited: it waits only for its new parent
    (the engine's children are reparented when the engine goes) to read its status."""
    out = {}
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z":
            out[pid] = cmdline[:200]
    return out


def _counters(url: str) -> dict[str, float]:
    """vLLM's own counters from its /metrics text, summed over their label sets (read here, not by metralectl)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total"):
        values = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
        assert values, f"{name} is not in vLLM's /metrics"
        out[name] = sum(float(v) for v in values)
    return out


@pytest.fixture()
def box(tmp_path: Path, hf_home: Path, vllm_python: Path, llama_server: Path) -> Iterator[Box]:
    machine = Box(tmp_path, hf_home, vllm_python, llama_server)
    try:
        yield machine
    finally:
        machine.cleanup()


def test_vllm_as_a_host_process_through_the_whole_lifecycle(box: Box) -> None:
    printed = box.cli("run", box.vllm, "--print")
    assert printed.returncode == 0, printed.stderr
    assert f"{box.python} -m {API_MODULE} \\\n  --model {VLLM_REPO}" in printed.stdout, printed.stdout
    assert "VLLM_CPU_KVCACHE_SPACE=1" in printed.stdout and "HF_HUB_OFFLINE=1" in printed.stdout

    run = box.cli("run", box.vllm, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "loading" in run.stderr and "ready" in run.stderr, run.stderr  # vLLM's own log phases
    [first] = box.sessions().values()

    ps = box.json("ps", "--json")
    [served] = ps["serving"]
    assert (served["recipe"], served["state"], served["health"], served["endpoint"]) == (
        box.vllm, "running", "ok", box.url), served
    assert served["image"] == f"process:{box.python}", served
    logs = box.cli("logs", box.vllm)
    assert logs.returncode == 0 and f"Starting vLLM server on {box.url}" in logs.stdout, logs.stderr
    chat = box.cli("chat", "Hello", "--max-tokens", "8", timeout=120)
    assert chat.returncode == 0 and chat.stdout.strip(), chat.stderr

    # bench finds the served engine by itself: every request ok, and what it counted is what vLLM counted
    before = _counters(box.url)
    decode = box.cli("bench", "run", "decode", "-p", "repeats=3", "-p", "warmup=0", "-p", "max_tokens=16",
                     "-p", "client_bound=warn", "--format", "json", timeout=600)
    assert decode.returncode == 0, decode.stderr
    record = json.loads(decode.stdout)
    after = _counters(box.url)
    [run_dir] = (box.home / "metrale" / "runs").glob(f"*/{record['run_id']}")
    lines = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines() if line.strip()]
    assert record["status"] == "completed" and record["target"]["recipe"] == box.vllm, record["target"]
    assert record["target"]["engine"]["name"] == "vllm", record["target"]["engine"]
    assert record["dialect"]["source"] == "engine vllm", record["dialect"]  # from engine/vllm.yaml: no probe sent
    assert lines and all(r["ok"] for r in lines), [(r["error_kind"], r["error"]) for r in lines if not r["ok"]]
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == len(lines)
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == sum(r["prompt_tokens"] for r in lines)
    assert (after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
            == sum(r["output_tokens"] for r in lines))

    # top finds it by itself and reads vLLM's own series
    top = box.json("top", "--once", "--json", "--interval", "0.5", timeout=120)
    [watched] = [e for e in top["engines"] if e["url"] == box.url]
    assert (watched["engine"], watched["state"], watched["recipe"]) == ("vllm", "ok", box.vllm), watched
    assert watched["totals"]["generation_tokens"] == after["vllm:generation_tokens_total"], watched
    assert watched["totals"]["requests"] == after["vllm:request_success_total"], watched
    assert watched["ttft_p50_s"] is not None and watched["itl_p50_s"] is not None, watched
    # and bench at its URL tells vLLM from the server's own answers too, not only from the recipe
    bare = box.cli("bench", "run", "decode", "--url", box.url, "-p", "repeats=1", "-p", "warmup=0", "-p",
                   "max_tokens=4", "-p", "client_bound=warn", "--format", "json", timeout=300)
    assert bare.returncode == 0, bare.stderr
    engine = json.loads(bare.stdout)["target"]["engine"]
    assert (engine["name"], engine["detected"]) == ("vllm", "vllm"), engine
    assert 'owned_by "vllm"' in engine["evidence"] and "vllm:* samples" in engine["evidence"], engine

    # to llama.cpp and back, each a host process on the same address; nothing of the engine swapped out is left
    to_llama = box.json("swap", box.llama, "--json", timeout=600)
    assert to_llama["outcome"] == "swapped" and to_llama["model"] == "tiny-llama", to_llama
    assert _alive(first) == {}, "a process of the swapped-out vLLM is still running"
    back = box.json("swap", box.vllm, "--json", timeout=600)
    assert back["outcome"] == "swapped" and back["model"] == "tiny-vllm", back
    [second] = box.sessions().values()

    stopped = box.json("stop", "--json", timeout=180)
    [result] = stopped
    assert result["recipe"] == box.vllm and result["removed"] is True, stopped
    assert _alive(second) == {} and box.sessions() == {} and not box.listening()
    assert box.json("ps", "--json")["serving"] == []
