"""`metralectl bench` as a real subprocess against the truth server: exit codes, clean JSON on stdout,
records on disk, and what a kill mid-run leaves behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from metralectl.errors import ExitCode

from tests.bench_truth.helpers import REPO, truth_server

HEAVY = ("docker", "textual", "httpx", "huggingface_hub", "pynvml", "aiohttp")


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ), timeout=timeout)


@pytest.mark.parametrize("argv", [["bench", "list"], ["bench", "list", "rate"], ["--help"]])
def test_bench_list_imports_nothing_heavy(argv: list[str]) -> None:
    code = ("import sys, runpy\n"
            f"sys.argv = ['metralectl', *{argv!r}]\n"
            "try:\n    runpy.run_module('metralectl', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            f"print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.stderr.rstrip().endswith("HEAVY="), out.stderr


def test_unknown_param_is_a_usage_error_listing_valid_keys() -> None:
    out = cli("bench", "run", "decode", "--param", "repeat=3", "--url", "http://127.0.0.1:9")
    assert out.returncode == ExitCode.USAGE and "unknown parameter 'repeat'" in out.stderr and "repeats" in out.stderr
    assert out.stdout == ""


def test_run_json_gates_and_history() -> None:
    # What this test checks is the CLI (JSON, gates, history), not timing: the server paces tokens at 10 ms and
    # the client-bound guard only warns, so a loaded 2-core box cannot turn it red (the guard has its own tests,
    # the client's timing budget lives in benchmarks/bench_client.py).
    lax = ("-p", "client_bound=warn")
    with truth_server("--ttft-ms", "10", "--itl-ms", "10") as url:
        ok = cli("bench", "run", "decode", "--url", url, "-p", "repeats=3", "-p", "max_tokens=20", *lax,
                 "--format", "json")
        assert ok.returncode == 0, ok.stderr
        record = json.loads(ok.stdout)  # stdout is one clean JSON document; progress went to stderr
        assert record["status"] == "completed" and record["schema"] == 1 and record["source"] == "cli"
        assert record["params"]["repeats"] == 3 and record["params"]["warmup"] == 2  # every parameter
        assert record["target"]["url"] == url and record["target"]["model"] == "truth-model"
        assert record["stages"][0]["energy"].startswith("unavailable: ")
        assert 0 < record["summary"]["headline"]["decode_tok_s_p50"] <= 1000 / 10 * 1.05  # never past the pace
        assert "▸" in ok.stderr
        run_dir = Path(os.environ["METRALE_HOME"]) / "runs" / "decode" / record["run_id"]
        lines = [json.loads(x) for x in (run_dir / "requests.jsonl").read_text().splitlines()]
        assert len(lines) == 5 and {x["phase"] for x in lines} == {"warmup", "measure"}
        assert all(len(x["token_us"]) == 20 for x in lines)
        gated = cli("bench", "run", "decode", "--url", url, "-p", "repeats=2", "-p", "max_tokens=10", *lax,
                    "--gate", "decode_tok_s_p50>=100000")
        assert gated.returncode == ExitCode.GATE and "[FAIL]" in gated.stdout
        lenient = cli("bench", "run", "decode", "--url", url, "-p", "repeats=2", "-p", "max_tokens=10", *lax,
                      "--gate", "decode_tok_s_p50>=100000", "--no-fail-on-verdict")
        assert lenient.returncode == 0
    hist = json.loads(cli("bench", "history", "--id", "decode", "--limit", "2", "--format", "json").stdout)
    assert len(hist) == 2 and hist[0]["verdict"] == "fail"
    one = json.loads(cli("bench", "history", "--run", record["run_id"], "--format", "json").stdout)
    assert one["run_id"] == record["run_id"]
    cmp = cli("bench", "compare", record["run_id"], hist[0]["run_id"])
    assert cmp.returncode == 0 and "decode_tok_s_p50" in cmp.stdout and "%" in cmp.stdout
    csv = cli("bench", "export", "--csv")
    assert csv.stdout.splitlines()[0].startswith("run_id,suite,status") and len(csv.stdout.splitlines()) == 4
    assert "ttft_ms" in cli("bench", "show", record["run_id"]).stdout


def test_an_endpoint_nothing_answers_at_is_unavailable_as_in_chat() -> None:
    out = cli("bench", "run", "decode", "--url", "http://127.0.0.1:9")
    assert out.returncode == ExitCode.UNAVAILABLE and out.stdout == ""
    assert out.stderr.startswith("metralectl: nothing answers at http://127.0.0.1:9: "), out.stderr


def _stages_recorded(home: Path) -> int:
    """How many stages the run's record holds so far (it is written whole after each: never torn)."""
    for path in home.glob("runs/concurrency-sweep/*/run.json"):
        try:
            return len(json.loads(path.read_text()).get("stages") or [])
        except (OSError, ValueError):
            return 0
    return 0


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_kill_mid_run_leaves_a_valid_record_marked_interrupted(sig: signal.Signals) -> None:
    home = Path(os.environ["METRALE_HOME"])
    with truth_server("--ttft-ms", "5", "--itl-ms", "5") as url:
        proc = subprocess.Popen([sys.executable, "-m", "metralectl", "bench", "run", "concurrency-sweep", "--url", url,
                                 "-p", "concurrencies=2,4", "-p", "duration_s=1", "-p", "warmup_s=0.2",
                                 "-p", "isls=16", "-p", "osl=400"],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _stages_recorded(home):
            time.sleep(0.05)  # the first rung is recorded (not merely begun: a busy box is slow): now kill the second
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    if sig == signal.SIGTERM:
        assert proc.returncode == ExitCode.INTERRUPTED and "interrupted" in err, err
    [run_dir] = list(home.glob("runs/concurrency-sweep/*"))
    record = json.loads((run_dir / "run.json").read_text())  # whole, parseable: never torn
    assert record["status"] in ("running", "interrupted")
    hist = json.loads(cli("bench", "history", "--format", "json").stdout)
    assert hist[0]["status"] == "interrupted" and hist[0]["run_id"] == run_dir.name
    assert len(hist[0]["stages"]) >= 1  # what was measured before the kill is kept
    for line in (run_dir / "requests.jsonl").read_text().splitlines():
        json.loads(line)
