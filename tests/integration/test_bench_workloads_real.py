"""The workloads people compare (issue 34), each against llama.cpp's real `llama-server` (CI's cached CPU build,
started here as a plain process on the tiny GGUF of tests/real_llamacpp/build_tiny_gguf.py), through the real CLI:
every request counted (the record's stages say how many were sent and how many came back whole; 0 failed, exit 0).

- `depth`: pp/tg at depths 0 and 1024; 4096 does not fit the 4096-token context the server reports (/props) and
  is skipped and said; the prompts are sized to pp + depth tokens as the server counts them.
- `depth prefix_cache=true`: the context loaded, then the prompt after it: the engine evaluates only the prompt's tail
  (its own log says so), and the ctx_ numbers are there.
- `rate rates=auto`: the sweep runs until it says why it stopped, with a knee and goodput next to throughput.
- `shared-prefix`: one system prompt for every user; every prompt is prefix + suffix tokens as the server counts.
- `trace`: the shipped sample replayed (faster), every request of it sent once, at its time, with its lengths; a
  bad trace is named (file, line, field, fix) with exit 65 before anything is sent.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ports import PortTaken, pick_port, port_in_use, start_retrying

pytestmark = [pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "images" / "build-llama-server.sh"
SERVER_LOGS: dict[str, Path] = {}  # the module's llama-server URL -> its log (the engine's own account of each request)
EVALUATED = re.compile(r"prompt eval time =\s+[\d.]+ ms /\s+(\d+) tokens")


def _fail_or_skip(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}")
    pytest.skip(reason)


def llama_server_binary() -> Path:
    out = subprocess.run(["bash", str(BUILD), "--print-cache-dir"], capture_output=True, text=True, timeout=60)
    binary = Path(out.stdout.strip()) / "bin" / "llama-server"
    if out.returncode != 0 or not os.access(binary, os.X_OK):
        _fail_or_skip(f"llama-server is not built here ({binary}): run `bash {BUILD.relative_to(REPO)}` once")
    return binary


def start_llama_server(binary: Path, model: Path, log: Path, *, ctx: int = 4096, alias: str = "tiny") -> tuple[subprocess.Popen[bytes], str]:
    """llama-server on a loopback port of its own (chosen again when another program took it); its URL."""
    def start(port: int) -> tuple[subprocess.Popen[bytes], str]:
        with log.open("wb") as out:
            proc = subprocess.Popen([str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c",
                                     str(ctx), "-np", "1", "--alias", alias, "-t", "2"], stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        import httpx

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                said = log.read_text(errors="replace")[-3000:]
                if port_in_use(said, "llama-cpp"):
                    raise PortTaken(said)
                raise AssertionError(f"llama-server exited while loading:\n{said}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    return proc, f"http://127.0.0.1:{port}"
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        stop(proc)
        raise AssertionError("llama-server not ready in 120 s:\n" + log.read_text(errors="replace")[-3000:])

    return start_retrying(lambda port: start(port or pick_port()))


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = llama_server_binary()
    try:
        import gguf  # noqa: F401  (the writer's dependency)
    except ImportError:
        _fail_or_skip("the `gguf` package is missing (scripts/bootstrap.sh installs tests/realengines/requirements.txt)")
    sys.path.insert(0, str(REPO / "tests" / "real_llamacpp"))
    import build_tiny_gguf

    tmp = tmp_path_factory.mktemp("workloads")
    model = build_tiny_gguf.install(tmp / "hub")
    proc, url = start_llama_server(binary, Path(model["file"]), tmp / "llama-server.log")
    SERVER_LOGS[url] = tmp / "llama-server.log"
    try:
        yield url
    finally:
        stop(proc)


def bench(tmp_path: Path, url: str, suite: str, *params: str, timeout: float = 600) -> tuple[int, dict[str, Any], str]:
    env = {**os.environ, "METRALE_HOME": str(tmp_path / "home"), "NO_COLOR": "1"}
    args = [sys.executable, "-m", "metralectl", "bench", "run", suite, "--url", url, "--json",
            "-p", "client_bound=warn"]  # a shared CI box: timing accuracy is not what these tests check
    for p in params:
        args += ["-p", p]
    out = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    try:
        doc = json.loads(out.stdout)
    except ValueError:
        raise AssertionError(f"exit {out.returncode}, no JSON record:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}") from None
    return out.returncode, doc, out.stderr


def every_request_counted(doc: dict[str, Any], rc: int, stderr: str) -> None:
    """0 failed and exit 0; or the failure said (status, error, per stage error kinds) and exit 1."""
    failed = {s["name"]: s["summary"].get("error_kinds") for s in doc["stages"] if s["summary"]["errors"]}
    if failed or rc != 0:
        assert rc == 1 and doc["status"] != "completed" and doc.get("error"), (rc, doc.get("status"), doc.get("error"))
        pytest.fail(f"requests failed against the real llama-server (said, exit 1): {failed} {doc.get('error')}\n"
                    f"{stderr[-3000:]}")
    for s in doc["stages"]:
        agg = s["summary"]
        assert agg["requests"] == agg["ok"] > 0 and agg["errors"] == 0, (s["name"], agg)
    assert doc["status"] == "completed", doc.get("error")


def test_depth_sweep_pp_tg_at_depths_within_the_served_context(server: str, tmp_path: Path) -> None:
    rc, doc, err = bench(tmp_path, server, "depth", "depths=0,1024,4096", "pp=128", "tg=64", "runs=2")
    every_request_counted(doc, rc, err)
    summary = doc["summary"]
    assert summary["skipped_depths"] == [4096] and summary["max_context"] == 4096, summary
    assert "n_ctx of /props" in doc["context_limit"]
    assert [s["name"] for s in doc["stages"]] == ["pp128 tg64 @ d0", "pp128 tg64 @ d1024"]
    assert [s["summary"]["requests"] for s in doc["stages"]] == [2, 2]  # the warm-up run is not measured
    for row in summary["depths"]:
        # the server's own count of every prompt: pp + depth, as sized with /tokenize (the longest below it when a
        # two-token word straddles the target)
        assert len(row["prompt_tokens"]) == 1 and 0 <= 128 + row["depth"] - row["prompt_tokens"][0] <= 2, row
        # pp is prompt tokens over (TTFT - the API's round trip): a busy box can measure a round trip as long as a
        # short prefill (seen on CI: 4.2 ms at depth 0), which leaves that run no pp, as llama-benchy would not
        assert row["pp_tok_s"]["n"] <= 2 and (row["pp_tok_s"]["n"] == 0 or row["pp_tok_s"]["mean"] > 0), row
        # tg needs two distinct arrival times: a busy box may read a whole short answer at once (llama-benchy then
        # has no tg for that run either)
        assert row["tg_tok_s"]["n"] <= 2 and (row["tg_tok_s"]["n"] == 0 or row["tg_tok_s"]["mean"] > 0), row
        assert row["api_rtt_ms"] > 0, row
    # 64 tokens take tens of ms to generate here: at least one run of the sweep sees them arrive apart (seen on CI: a
    # stalled box read both 16-token answers at depth 0 at once, so that row had no tg, as llama-benchy would not)
    assert sum(row["tg_tok_s"]["n"] for row in summary["depths"]) >= 1, summary["depths"]
    assert summary["depths"][1]["pp_tok_s"]["n"] == 2, summary["depths"]  # 1152 tokens of prefill: far past any RTT
    d1024 = summary["depths"][1]["tg_tok_s"]
    assert doc["api_rtt_ms"] > 0 and (summary["headline"].get("d1024.tg_tok_s") or 0) > 0 or d1024["n"] == 0


def test_depth_prefix_cache_loads_the_context_then_measures_the_prompt_after_it(server: str, tmp_path: Path) -> None:
    log = SERVER_LOGS[server]
    before = log.stat().st_size
    rc, doc, err = bench(tmp_path, server, "depth", "depths=0,2048", "pp=64", "tg=8", "runs=3", "prefix_cache=true")
    every_request_counted(doc, rc, err)
    d0, d2048 = doc["summary"]["depths"]
    assert "ctx_pp_tok_s" not in d0 and d2048["ctx_pp_tok_s"]["n"] == d2048["pp_tok_s"]["n"] == 3
    assert doc["stages"][1]["summary"]["requests"] == 6  # three pairs: the load, then the prompt
    assert d2048["ctx_prompt_tokens"][0] < d2048["prompt_tokens"][0]
    # The context was cached, by the engine's own account (its log: how many prompt tokens each request evaluated),
    # not by timing (on a shared 2-core box the 40 ms a cache hit saves here is within the noise): the last six
    # requests are the measured pairs, each a load of the whole context then a prompt that evaluates only its tail.
    with log.open("rb") as f:
        f.seek(before)
        evaluated = [int(n) for n in EVALUATED.findall(f.read().decode(errors="replace"))]
    loads, prompts = evaluated[-6::2], evaluated[-5::2]
    assert all(n >= 2048 for n in loads) and all(n <= 64 + 32 for n in prompts), evaluated


def _requests(tmp_path: Path, doc: dict[str, Any]) -> list[dict[str, Any]]:
    path = tmp_path / "home" / "runs" / doc["suite"] / doc["run_id"] / doc["requests_file"]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_rate_sweep_to_saturation_says_where_and_why_it_stopped(server: str, tmp_path: Path) -> None:
    rc, doc, err = bench(tmp_path, server, "rate", "rates=auto", "rate_start=2", "rate_factor=2", "max_rates=4",
                         "isl=32", "osl=16", "duration_s=3", "warmup_s=0.5", "slo_ttft_ms=2000", "slo_tpot_ms=500",
                         "slo_itl_ms=1000", "knee_attainment=0")
    every_request_counted(doc, rc, err)
    sat = doc["summary"]["saturation"]
    rates = [s["labels"]["rate"] for s in doc["stages"]]
    assert rates == [2.0, 4.0, 8.0, 16.0][:len(rates)] and sat["stopped"], sat
    assert sat["knee"]["rate"] in rates and doc["summary"]["headline"]["knee.rate"] == sat["knee"]["rate"]
    h = doc["summary"]["headline"]
    for r in rates:  # goodput next to throughput, per rate
        assert h[f"rate{r:g}.goodput_rps"] is not None and h[f"rate{r:g}.output_tok_s"] is not None, h
        assert 0 <= h[f"rate{r:g}.goodput_rps"] <= h[f"rate{r:g}.offered_rps"] + 1e-9
    # max_inflight (256) is a ceiling: opened up front, the idle connections held this 1-slot server's 3 HTTP
    # threads and requests sent on the others waited for a keep-alive timeout (5 s) before it read them. Below
    # saturation (2/s) a few are in flight at once; past it requests pile up, each on a connection of its own (94
    # opened at 16/s on CI), which is what an open loop is for
    opened = [s["client_health"]["connections_opened"] for s in doc["stages"]]
    assert 1 <= opened[0] <= 64 and all(n >= 1 for n in opened), opened


def test_shared_prefix_every_user_sends_the_one_system_prompt(server: str, tmp_path: Path) -> None:
    rc, doc, err = bench(tmp_path, server, "shared-prefix", "users=1,3", "prefix_tokens=512", "suffix_tokens=64",
                         "osl=8", "duration_s=2", "warmup_s=0.5")
    every_request_counted(doc, rc, err)
    h = doc["summary"]["headline"]
    assert 0 <= 576 - h["users1.prompt_tokens"] <= 2 and h["users3.prompt_tokens"] == h["users1.prompt_tokens"], h
    sent = [r for r in _requests(tmp_path, doc) if r["phase"] == "measure"]
    assert sent and all(r["prompt_tokens"] == h["users1.prompt_tokens"] for r in sent)


def test_trace_replays_every_request_at_its_time_with_its_lengths(server: str, tmp_path: Path) -> None:
    from metralectl.bench import trace as T

    rc, doc, err = bench(tmp_path, server, "trace", "speed=4", "max_requests=12")
    every_request_counted(doc, rc, err)
    want = T.load("sample")[0][:12]
    sent = sorted((r for r in _requests(tmp_path, doc) if r["phase"] == "measure"), key=lambda r: r["index"])
    assert len(sent) == 12 == doc["stages"][0]["summary"]["requests"]
    assert [r["asked_tokens"] for r in sent] == [w.output_tokens for w in want]
    assert [r["output_tokens"] for r in sent] == [w.output_tokens for w in want]  # output forced to its length
    assert all(0 <= w.input_tokens - r["prompt_tokens"] <= 2 for r, w in zip(sent, want)), [
        (r["prompt_tokens"], w.input_tokens) for r, w in zip(sent, want)]
    start = want[0].timestamp_s
    for r, w in zip(sent, want):  # sent when the trace says (at 4x), give or take the client's dispatch
        assert r["t_sched_us"] == pytest.approx((w.timestamp_s - start) / 4 * 1e6, abs=2000)
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp_s,input_tokens,output_tokens\n0,10,5\n1,-3,5\n")
    rc, doc, err = bench_raw(tmp_path, server, "trace", f"trace={bad}")
    assert rc == 65 and "line 3 field input_tokens: -3 is outside 1..1e+06" in err and "hint:" in err, err


def bench_raw(tmp_path: Path, url: str, suite: str, *params: str) -> tuple[int, str, str]:
    env = {**os.environ, "METRALE_HOME": str(tmp_path / "home"), "NO_COLOR": "1"}
    args = [sys.executable, "-m", "metralectl", "bench", "run", suite, "--url", url]
    for p in params:
        args += ["-p", p]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    return out.returncode, out.stdout, out.stderr


def test_multi_turn_resends_each_conversation_with_the_engines_answers(server: str, tmp_path: Path) -> None:
    rc, doc, err = bench(tmp_path, server, "multi-turn", "users=2", "turns=3", "turn_words=20", "osl=12")
    every_request_counted(doc, rc, err)
    assert [s["name"] for s in doc["stages"]] == ["turn 1", "turn 2", "turn 3"]
    h = doc["summary"]["headline"]
    grown = [h[f"turn{t}.prompt_tokens_p50"] for t in (1, 2, 3)]
    assert grown[0] < grown[1] < grown[2], grown  # each turn holds the last one's prompt, its answer and a new turn
    sent = [r for r in _requests(tmp_path, doc) if r["phase"] == "measure"]
    answers = {(r["stage"], r["index"]): r["content"] for r in sent}
    assert len(sent) == 6 and all(a for a in answers.values())
    # turn 2's prompt is turn 1's prompt + its answer + the new user turn: more tokens than turn 1 used in all
    for c in (0, 1):
        t1 = next(r for r in sent if r["stage"] == "turn 1" and r["index"] == c)
        t2 = next(r for r in sent if r["stage"] == "turn 2" and r["index"] == c)
        assert t2["prompt_tokens"] > t1["prompt_tokens"] + t1["output_tokens"], (t1["prompt_tokens"], t2["prompt_tokens"])
