"""A benchmark prints a number only for what actually ran (docs/development.md, "Benchmarks").

Each script under benchmarks/ checks that the child it timed did what was timed — painted, exited 0 (or the
status that is the answer), answered every request — and otherwise exits non-zero with the reason. Here the
cheap failures: the dashboard harness run by an interpreter that has no Textual (it once printed first-paint
times of programs that crashed at import), cold_start's commands that fail, a load generator that cannot run.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
TIMING = re.compile(r"\d+\.\d{3} s")  # a number of seconds, as the harnesses print them


def script(name: str) -> ModuleType:
    """benchmarks/NAME.py as a module (registered first: its dataclasses look themselves up there)."""
    if f"bench_{name}" in sys.modules:
        return sys.modules[f"bench_{name}"]
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def no_textual(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A bare venv's interpreter: the standard library, nothing installed (no Textual, no Typer)."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    assert subprocess.run([python, "-c", "import textual"], capture_output=True).returncode != 0
    return python


# --- benchmarks/tui.py ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("part,child", [("paint", "bare"), ("idle", "bare"), ("frames", "idle")])
def test_the_tui_harness_without_textual_says_what_did_not_paint_and_prints_no_time(
        no_textual: str, tmp_path: Path, part: str, child: str) -> None:
    out = subprocess.run([no_textual, str(BENCH / "tui.py"), "--parts", part, "--runs", "1", "--idle", "0.1",
                          "--idle-runs", "1", "--seconds", "0.1", "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    (said,) = [line for line in out.stderr.splitlines() if line.startswith("NOT MEASURED: ")]
    assert f"--child {child}" in said and "No module named 'textual'" in said, said
    assert ("never painted" in said) == (part != "frames"), said  # frames: the app crashed, no frame times
    assert not TIMING.search(out.stdout), out.stdout  # no time of a program that did not run
    assert json.loads((tmp_path / "r.json").read_text())["not_measured"] == said.removeprefix("NOT MEASURED: ")


# --- benchmarks/cold_start.py ---------------------------------------------------------------------------------
def test_a_cold_start_command_that_fails_stops_the_run_with_its_words(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    cold = script("cold_start")
    case = cold.Case("metralectl list", [sys.executable, "-c", "import sys; print('no catalog here'); sys.exit(3)"],
                     {"PATH": "/usr/bin:/bin"})
    with pytest.raises(SystemExit) as stopped:
        cold.measure([case], 3, tmp_path)  # the untimed first round already finds it out
    assert stopped.value.code == 1 and case.samples == []
    err = capsys.readouterr().err
    assert "metralectl list: exit 3 (expected 0)" in err and "no catalog here" in err


def test_a_crash_is_not_the_answer_of_ps_without_a_daemon(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cold = script("cold_start")
    crash = cold.Case("metralectl ps (no daemon)", [sys.executable, "-c", "raise SystemExit(70)"],
                      {"PATH": "/usr/bin:/bin"}, expect=(cold.UNAVAILABLE,))
    with pytest.raises(SystemExit):
        crash.once(tmp_path)
    assert "exit 70 (expected 69)" in capsys.readouterr().err
    answer = cold.Case("metralectl ps (no daemon)", [sys.executable, "-c", "raise SystemExit(69)"],
                       {"PATH": "/usr/bin:/bin"}, expect=(cold.UNAVAILABLE,))
    wall, cpu = answer.once(tmp_path)
    assert wall > 0 and cpu >= 0 and answer.exit_codes == {69}


def test_an_in_process_call_that_raises_is_no_daemon_answer(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    cold = script("cold_start")

    def refused() -> None:
        raise ConnectionRefusedError("[Errno 111] Connection refused")

    with pytest.raises(SystemExit):
        cold.Case("daemon answer (in-process)", call=refused).once(tmp_path)
    assert "daemon answer (in-process): ConnectionRefusedError" in capsys.readouterr().err


# --- the others -----------------------------------------------------------------------------------------------
def test_bench_client_exits_1_when_a_tool_could_not_run(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(BENCH / "bench_client.py"), "--tools", "metralectl:bogus",
                          "--concurrencies", "1", "--rounds", "1", "--tokens", "2", "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 1, out.stderr
    assert "NOT MEASURED: metralectl:bogus at c=1: exit 1: " in out.stderr and "unknown transport" in out.stderr
    assert all("failed" in r for r in json.loads((tmp_path / "r.json").read_text())["results"])


def test_a_sampler_that_took_no_sample_is_no_measurement() -> None:
    telemetry = script("telemetry")
    stats = telemetry.run(telemetry.NullProbe(), 0.3)
    assert telemetry.not_measured("baseline", stats, reads=False) is None
    from dataclasses import replace

    assert "took no sample" in telemetry.not_measured("x", replace(stats, samples=0), reads=False)
    assert "stopped: nvml gone" in telemetry.not_measured("x", replace(stats, error="nvml gone"), reads=True)
    assert "no read of the driver" in telemetry.not_measured("x", replace(stats, read_p50_s=None), reads=True)


def test_a_campaign_run_counts_only_with_a_completed_record() -> None:
    campaign = script("campaign")
    assert campaign.completed({"status": "completed"}, "x") == {"status": "completed"}
    with pytest.raises(SystemExit, match="NOT MEASURED: the remote unit bench-0 ended 'failed'"):
        campaign.completed({"status": "failed"}, "the remote unit bench-0")


def test_the_lifecycle_benchmark_times_only_an_engine_that_became_ready() -> None:
    from metralectl.core.render import ContainerSpec
    from tests.fakes.runtime import Boot, Exit, FakeRuntime, Log, engine_boot, image
    from tests.ports import own_port

    lifecycle = script("lifecycle")
    rt = FakeRuntime(images=[image("img")])
    spec = ContainerSpec(name="bench", image="img", command=(), port=own_port())
    rt.script("bench", Boot((Log("Error: the snapshot has no weight files"), Exit(1))), engine_boot(step_s=0.01))
    with pytest.raises(SystemExit, match="NOT MEASURED: the container bench exited before /health said 200: "
                                         "Error: the snapshot has no weight files"):
        lifecycle.raw_ready(rt, spec)
    assert rt.all() == []  # removed all the same
    assert lifecycle.raw_ready(rt, spec) > 0  # the second start boots like the engine


# --- the gateway's benchmarks and the side-by-sides -----------------------------------------------------------
async def _answering(status: bytes) -> asyncio.Server:
    """A loopback 'engine' that reads a request and answers `status` (b"": closes at once); it holds its port."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if status:
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 5\r\nConnection: close\r\n\r\noops!")
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_the_relay_cpu_bench_says_its_gateway_never_listened_and_prints_no_cpu(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(BENCH / "gateway_relay_cpu.py"), "--python", "/bin/false", "--rounds",
                          "1", "--streams", "1", "--events", "1", "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert "NOT MEASURED: the gateway from" in out.stderr and "exited 1 before listening" in out.stderr, out.stderr
    assert "CPU" not in out.stdout and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("status", [b"500 Internal Server Error", b""])
def test_a_relayed_stream_that_is_not_200_stops_the_relay_bench(status: bytes) -> None:
    relay = script("gateway_relay_cpu")

    async def go() -> None:
        server = await _answering(status)
        try:
            await relay.one_stream(server.sockets[0].getsockname()[1], 3)
        finally:
            server.close()

    with pytest.raises(SystemExit, match="gateway_relay_cpu: the gateway answered" + (" b'HTTP/1.1 500" if status
                                                                                       else " b''")):
        asyncio.run(go())


@pytest.mark.parametrize("connections", ["fresh", "keep-alive"])
@pytest.mark.parametrize("status", [b"500 Internal Server Error", b""])
def test_paired_overhead_with_every_request_failed_prints_no_figure_and_exits_1(
        status: bytes, connections: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paired, overhead = script("gateway_paired"), script("gateway_overhead")
    ns = argparse.Namespace(warmup=0.0, duration=0.2, alias="overhead", osl=4, prompts=["hi"], json=tmp_path / "r.json",
                            connections=connections)

    async def go() -> dict[str, Any]:
        server = await _answering(status)
        try:
            url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            return await paired.phase({"direct": url, "gateway": url}, 1, ns, seed_base=0)
        finally:
            server.close()

    got = asyncio.run(go())
    assert got["groups"] == [] and got["errors"], got
    got.update(round=0, concurrency=1)
    assert overhead.paired_report([got], [], [1], ["gateway"], ns) == 1
    out, err = capsys.readouterr()
    assert "c=1: no complete group" in out and not re.search(r"p50 \d|added [+-]\d", out), out
    no_answer = "IncompleteReadError" if connections == "fresh" else "closed"  # the kept transport's words for it
    assert "failed: direct: " in err and ("500" in err if status else no_answer in err), err
    assert json.loads(ns.json.read_text())["summary"] == []


def test_aiperf_side_by_side_without_aiperf_says_so_before_anything_runs(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(BENCH / "aiperf_rate_side_by_side.py"), "--aiperf-venv",
                          str(tmp_path / "none"), "--metralectl", "tree", "--llama-server", "/bin/false",
                          "--workdir", str(tmp_path / "w"), "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert f"NOT MEASURED: AIPerf's venv {tmp_path / 'none'} has no bin/aiperf" in out.stderr, out.stderr
    assert out.stdout == "" and not (tmp_path / "r.json").exists()


def test_benchy_side_by_side_without_llama_benchy_says_so(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(BENCH / "llama_benchy_side_by_side.py"), "--benchy-venv",
                          str(tmp_path / "none"), "--gguf", str(tmp_path / "x.gguf"), "--tokenizer",
                          str(tmp_path / "tokenizer.json"), "--llama-server", "/bin/false",
                          "--json", str(tmp_path / "r.json")], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert f"NOT MEASURED: llama-benchy's venv {tmp_path / 'none'} has no bin/llama-benchy" in out.stderr, out.stderr
    assert out.stdout == "" and not (tmp_path / "r.json").exists()


def test_benchy_side_by_side_stops_at_a_llama_server_that_exits(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "llama-benchy").symlink_to("/bin/true")
    out = subprocess.run([sys.executable, str(BENCH / "llama_benchy_side_by_side.py"), "--benchy-venv", str(venv),
                          "--gguf", str(tmp_path / "x.gguf"), "--tokenizer", str(tmp_path / "tokenizer.json"),
                          "--llama-server", "/bin/false", "--depths", "0", "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 1 and "llama-server exited" in out.stderr, out.stderr
    assert out.stdout == "" and not (tmp_path / "r.json").exists()


def test_benchy_requests_that_failed_are_no_speeds(tmp_path: Path) -> None:
    """llama-benchy exits 0 after 'Error during run' and still writes speeds: they would be averaged in."""
    benchy = script("llama_benchy_side_by_side")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    result = {"latency_ms": 1.0, "benchmarks": [{"context_size": 0, "pp_throughput": {"values": [100.0]},
                                                 "tg_throughput": {"values": [10.0]}, "e2e_ttft": {"values": [5.0]}}]}
    fake = venv / "bin" / "llama-benchy"
    fake.write_text("#!/bin/sh\necho 'Error during run: HTTP 500'\nwhile [ \"$1\" != --save-result ]; do shift; done\n"
                    f"echo '{json.dumps(result)}' > \"$2\"\n")
    fake.chmod(0o755)
    a = argparse.Namespace(pp=8, tg=2, depths=[0], runs=1, benchy_attempts=3)  # not a lost connection: no retry
    with pytest.raises(SystemExit, match=r"NOT MEASURED: llama-benchy said 2 request error\(s\) \(attempt 1\)"):
        benchy.run_benchy_attempts(venv, "http://127.0.0.1:9", tmp_path / "tok.json", tmp_path, a,
                                   tmp_path / "out.json")


@pytest.mark.parametrize("attempts", [2, 3])
def test_benchy_is_run_again_only_for_connections_the_server_closed_and_says_so(tmp_path: Path,
                                                                                attempts: int) -> None:
    benchy = script("llama_benchy_side_by_side")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    result = {"latency_ms": 1.0, "benchmarks": [{"context_size": 0, "pp_throughput": {"values": [100.0]},
                                                 "tg_throughput": None, "e2e_ttft": {"values": [5.0]}}]}
    fake = venv / "bin" / "llama-benchy"  # its first two runs each lose a request to a closed connection
    counter = tmp_path / "n"
    fake.write_text(f"#!/bin/sh\nn=$(cat {counter} 2>/dev/null || echo 0); echo $((n + 1)) > {counter}\n"
                    "[ \"$n\" -lt 2 ] && echo 'Error during run: Server disconnected'\n"
                    "while [ \"$1\" != --save-result ]; do shift; done\n"
                    f"echo '{json.dumps(result)}' > \"$2\"\n")
    fake.chmod(0o755)
    a = argparse.Namespace(pp=8, tg=2, depths=[0], runs=1, benchy_attempts=attempts)
    run = lambda: benchy.run_benchy_attempts(venv, "http://127.0.0.1:9", tmp_path / "tok.json", tmp_path, a,  # noqa: E731
                                             tmp_path / "out.json")
    if attempts == 2:
        with pytest.raises(SystemExit, match=r"NOT MEASURED: llama-benchy said 1 request error\(s\) \(attempt 2\)"):
            run()
        return
    _, got = run()
    assert (got["attempts"], got["disconnects_before"]) == (3, [1, 1])
    assert got["rows"][0] == {"pp": [100.0], "tg": [], "ttft_ms": [5.0], "latency_ms": 1.0}  # no tg measured: none


class _Box:
    """gateway_overhead's Box, answering every `metralectl bench run` with one completed process."""

    def __init__(self, done: subprocess.CompletedProcess[str]) -> None:
        self.done = done

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return self.done


@pytest.mark.parametrize("rc,stdout", [(1, "Traceback..."), (0, json.dumps({"status": "completed", "summary": {
    "headline": {"c1_isl8_osl4.ttft_ms_p50": 1.0, "c1_isl8_osl4.ttft_ms_p99": 2.0, "c1_isl8_osl4.output_tok_s": 9.0,
                 "c1_isl8_osl4.requests": 4, "c1_isl8_osl4.errors": 3}}}))])
def test_sequential_overhead_counts_no_bench_that_failed_or_had_errors(
        rc: int, stdout: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    overhead = script("gateway_overhead")
    ns = argparse.Namespace(isl=8, osl=4, duration=1, warmup=0, alias="overhead", json=tmp_path / "r.json")
    row = overhead.bench(_Box(subprocess.CompletedProcess([], rc, stdout, "engine said no")), "http://x", ns, 1)
    assert "failed" in row and ("3 errors" if rc == 0 else "bench exited 1") in row["failed"], row
    rows = [{"round": 0, "concurrency": 1, "target": t, **row} for t in ("direct", "gateway")]
    assert overhead.report(rows, [1], ns) == 1
    out, err = capsys.readouterr()
    assert "1  gateway  no measurement" in out and not re.search(r"\d+\.\d{2} ", out.split("\n", 1)[1]), out
    assert "failed: c=1 gateway round 0: " in err and "engine said no" in err, err
    assert json.loads(ns.json.read_text())["medians"] == []


@pytest.mark.parametrize("status", [b"500 Internal Server Error", b""])
def test_paired_overhead_stops_at_an_engine_that_cannot_size_its_prompts(status: bytes) -> None:
    paired = script("gateway_paired")

    async def serve_and_size() -> list[str]:
        server = await _answering(status)
        try:
            url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            return await asyncio.to_thread(paired.sized_prompts, url, 8)
        finally:
            server.close()

    with pytest.raises(SystemExit, match=r"NOT MEASURED: the engine at http://127\.0\.0\.1:\d+ did not size the "
                                         r"prompts \(/tokenize, /detokenize\): " + ("HTTPError" if status else "")):
        asyncio.run(serve_and_size())


@pytest.mark.parametrize("printed", ['{"status": "ok"}', '{"run_id": "r1", "requests_file": "requests.jsonl"}', "[]"])
def test_aiperf_side_by_side_takes_a_record_without_its_requests_as_not_measured(tmp_path: Path, printed: str) -> None:
    # a record with no run_id, one whose requests file is not there, or no object at all: run_failed, no traceback
    sbs = script("aiperf_rate_side_by_side")
    fake = [sys.executable, "-c", f"print({printed!r})"]
    cmd, got = sbs.run_metralectl(fake, {}, "http://127.0.0.1:9", tmp_path, ["rates=1"], tmp_path)
    assert set(got) == {"run_failed"} and "no usable record" in got["run_failed"], got


def test_paired_overhead_escapes_an_engines_words_before_the_terminal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    overhead = script("gateway_overhead")
    ns = argparse.Namespace(json=None, connections="fresh")
    phase = {"concurrency": 1, "round": 0, "groups": [], "incomplete": 1, "window_ns": (0, 1),
             "errors": ["direct: HTTP/1.1 500 \x1b]0;owned\x07\x1b[2J oops"]}
    assert overhead.paired_report([phase], [], [1], ["gateway"], ns) == 1
    err = capsys.readouterr().err
    assert "failed: direct: HTTP/1.1 500" in err and "\x1b" not in err and "\x07" not in err, err
