"""`metralectl top` as a real subprocess on this machine (no GPU, no driver): `--once --json` is a clean
document on stdout, the no-GPU state is a value, an engine is read over real HTTP (the engine double as
a local process), `--record`/`--json` streams stay valid JSONL even when killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from metralectl.errors import ExitCode

from tests.ports import own_port
from tests.unit.recipe_helpers import REPO
from tests.unit.test_engine_double_local import MARKER, Double, clean_env

NO_DOCKER = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}  # discovery answers "no Docker": deterministic


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], check=False, capture_output=True,
                          text=True, env={**os.environ, **NO_DOCKER}, cwd=REPO, timeout=timeout)


def popen(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "metralectl", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **NO_DOCKER}, cwd=REPO)


def nvml_present() -> bool:
    from metralectl.seams.gpu import NvmlProbe
    from metralectl.core.gpudata import GpuSystem

    probe = NvmlProbe()
    try:
        return isinstance(probe.open(), GpuSystem)
    finally:
        probe.close()


@pytest.fixture
def engine():  # type: ignore[no-untyped-def]
    d = Double("serve", "Org/Model-7B", "--model-name", "served-7b", "--enable-prefix-caching",
               "--speculative", "--num-drafts", "2", env=clean_env())
    try:
        assert d.wait_for(MARKER), d.text
        yield d
    finally:
        d.stop()


def test_once_json_without_gpu_or_engine() -> None:
    out = cli("top", "--once", "--json", "--interval", "0.2")
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    data = json.loads(out.stdout)  # stdout is exactly one JSON document
    assert data["schema"] == 1 and data["interval_s"] == 0.2
    if not nvml_present():
        assert data["gpu"]["available"] is False and data["gpu"]["reason"].startswith("no GPU: ")
        assert data["gpu"]["hint"] and data["gpus"] == [] and data["sampler"] is None
    assert data["engines"] == [] and data["engine_note"].startswith("no engine found: ")


def test_once_json_reads_a_real_engine_over_http(engine: Double) -> None:
    for i in range(3):
        r = httpx.post(f"{engine.url}/v1/chat/completions", timeout=10,
                       json={"model": "served-7b", "max_tokens": 8,
                             "messages": [{"role": "user", "content": f"hello number {i}"}]})
        assert r.status_code == 200
    out = cli("top", "--once", "--json", "--url", engine.url, "--interval", "0.3")
    assert out.returncode == 0, out.stderr
    (e,) = json.loads(out.stdout)["engines"]
    assert e["state"] == "ok" and e["source"] == "url" and e["url"] == engine.url
    assert e["requests_active"] == 0 and e["totals"]["requests"] == 3
    assert e["totals"]["generation_tokens"] == 24 and e["totals"]["prompt_tokens"] > 0
    assert e["tokens_per_s"] == 0.0 and e["window"]["span_s"] > 0.25  # nothing finished during the interval
    assert e["ttft_scope"] == "lifetime" and e["lifetime"]["ttft_count"] == 3 and e["ttft_p50_s"] > 0
    assert 0 < e["spec_acceptance"] < 1 and e["prefix_cache_hit_rate"] is not None


def test_unreachable_engine_is_one_clear_line() -> None:
    port = own_port()  # held, never listening: connections are refused
    out = cli("top", "--once", "--json", "--url", f"http://127.0.0.1:{port}", "--interval", "0.1")
    assert out.returncode == 0 and "Traceback" not in out.stderr
    (e,) = json.loads(out.stdout)["engines"]
    assert e["state"] == "unreachable" and "Connection refused" in e["error"] and e["totals"] is None
    text = cli("top", "--once", "--url", f"http://127.0.0.1:{port}", "--interval", "0.1")
    assert text.returncode == 0 and "unreachable" in text.stdout
    assert text.stdout.count("Connection refused") == 1  # one line, not a storm
    if not nvml_present():
        assert "no GPU: " in text.stdout


# vLLM's own series names (the CPU build's /metrics, ../shared/TIPS.md); none is in a mapping metralectl has.
VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 0.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny"} 96.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 3.0
"""


def test_an_engine_metralectl_does_not_know_is_unknown_never_another(tmp_path: Path) -> None:
    """`top --url` at a server whose /metrics carry only another engine's series says "unknown" (and which series
    it saw), not "metrale" with nothing mapped."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = VLLM_METRICS.encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)  # bound here, before anything is told its port
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        out = cli("top", "--once", "--json", "--url", url, "--interval", "0.2")
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        (e,) = json.loads(out.stdout)["engines"]
        assert e["engine"] == "unknown" and e["state"] == "unknown-engine", e
        assert "vllm:num_requests_running" in e["error"] and e["totals"]["generation_tokens"] is None, e
        text = cli("top", "--once", "--url", url, "--interval", "0.2")
        assert text.returncode == 0 and "unknown-engine" in text.stdout and "unknown engine: no series" in text.stdout
    finally:
        server.shutdown()
        server.server_close()


def test_live_view_needs_a_terminal() -> None:
    out = cli("top")
    assert out.returncode == ExitCode.USAGE and "needs a terminal" in out.stderr and "--once --json" in out.stderr
    assert out.stdout == ""


def test_json_stream_and_record_survive_a_kill(tmp_path: Path) -> None:
    record = tmp_path / "top.jsonl"
    proc = popen("top", "--json", "--record", str(record), "--interval", "0.1")
    time.sleep(2.5)
    proc.send_signal(signal.SIGKILL)
    stdout, _ = proc.communicate(timeout=10)
    streamed = [json.loads(line) for line in stdout.splitlines()]
    recorded = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(recorded) >= 3 and len(streamed) >= 3
    assert all(r["schema"] == 1 for r in recorded)
    walls = [r["wall"] for r in recorded]
    assert walls == sorted(walls)


def test_sigterm_ends_a_recording_cleanly(tmp_path: Path) -> None:
    record = tmp_path / "top.jsonl"
    proc = popen("top", "--record", str(record), "--interval", "0.1")  # no terminal: records headless
    deadline = time.monotonic() + 60
    while not (record.exists() and record.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)  # the first record is written inside the SIGTERM handling: now it is installed
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    assert stdout == "" and "recorded" in stderr and "Traceback" not in stderr
    n = int(stderr.split("recorded ")[1].split()[0])
    assert n >= 1 and len(record.read_text().splitlines()) == n


def test_once_record_writes_one_line(tmp_path: Path) -> None:
    record = tmp_path / "top.jsonl"
    out = cli("top", "--once", "--json", "--record", str(record), "--interval", "0.1")
    assert out.returncode == 0, out.stderr
    (line,) = record.read_text().splitlines()
    assert json.loads(line)["schema"] == 1


def test_help_of_top_imports_nothing_heavy() -> None:
    code = ("import sys, runpy\nsys.argv = ['metralectl', 'top', '--help']\n"
            "try:\n    runpy.run_module('metralectl', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('HEAVY=' + ','.join(m for m in ('rich', 'httpx', 'pynvml', 'docker', 'prometheus_client') "
            "if m in sys.modules), file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=REPO,
                         timeout=60)
    assert "--once" in out.stdout and "--record" in out.stdout
    assert out.stderr.rstrip().endswith("HEAVY="), out.stderr


def test_json_stream_into_a_reader_that_leaves_exits_0() -> None:
    proc = popen("top", "--json", "--interval", "0.1")  # as in `metralectl top --json | head -2`
    assert proc.stdout is not None and proc.stderr is not None
    lines = [proc.stdout.readline() for _ in range(2)]
    assert all(json.loads(line)["schema"] == 1 for line in lines)
    proc.stdout.close()
    assert proc.wait(timeout=10) == 0
    assert "Traceback" not in proc.stderr.read()
