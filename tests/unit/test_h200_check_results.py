"""benchmarks/h200/check_results.py: a run counts as passed only when its records show every measured
request succeeded (an exit status of 0 with "0/2 ok" is what it exists to catch)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "benchmarks" / "h200" / "check_results.py"


def _metralectl_run(res: Path, suite: str, rows: list[dict[str, object]]) -> None:
    run = res / "metrale" / "runs" / suite / "20261201-000000-abcdef"
    run.mkdir(parents=True)
    (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _aiperf_run(res: Path, rung: str, count: int, errors: list[object], osl: float) -> None:
    d = res / "aiperf" / rung
    d.mkdir(parents=True)
    (d / "profile_export_aiperf.json").write_text(json.dumps({
        "request_count": {"unit": "requests", "avg": count}, "error_summary": errors, "was_cancelled": False,
        "output_sequence_length": {"avg": osl}, "time_to_first_token": {"p50": 12.5}}))


def _check(res: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHECK), str(res), *extra], capture_output=True, text=True, timeout=60)


def ok_row(**kw: object) -> dict[str, object]:
    return {"phase": "measure", "ok": True, "finish_reason": "length", "output_tokens": 16, "ttft_ms": 20.0,
            "tpot_ms": 3.0, **kw}


def test_all_requests_ok_in_both_tools_passes(tmp_path: Path) -> None:
    _metralectl_run(tmp_path, "decode", [ok_row(phase="warmup", ok=False, error="cold"), ok_row(), ok_row()])
    _aiperf_run(tmp_path, "c4", 8, [], 16.0)
    out = _check(tmp_path, "--expect-osl", "16")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("ok   metralectl") and "2/2 ok" in lines[0]  # the failed warmup is left out
    assert lines[1].startswith("ok   aiperf") and "8/8 ok" in lines[1]
    checked = json.loads((tmp_path / "check.json").read_text())
    assert [r["passed"] for r in checked] == [True, True]


def test_zero_successes_fail_even_though_the_run_exited_zero(tmp_path: Path) -> None:
    refused = "HTTP 422: Unexpected fields in the request: {'ignore_eos'}"
    _metralectl_run(tmp_path, "decode", [ok_row(ok=False, error=refused), ok_row(ok=False, error=refused)])
    out = _check(tmp_path)
    assert out.returncode == 1
    assert out.stdout.startswith("FAIL metralectl") and "0/2 ok" in out.stdout and "ignore_eos" in out.stdout


def test_one_failed_request_or_an_aiperf_error_fails(tmp_path: Path) -> None:
    _metralectl_run(tmp_path, "long-decode", [ok_row(), ok_row(ok=False, error="stream ended without [DONE]")])
    _aiperf_run(tmp_path, "c1", 8, [{"code": 500, "count": 1}], 16.0)
    out = _check(tmp_path)
    assert out.returncode == 1
    assert [line[:4] for line in out.stdout.splitlines()] == ["FAIL", "FAIL"]


def test_nothing_collected_fails(tmp_path: Path) -> None:
    out = _check(tmp_path)
    assert out.returncode == 1 and "no benchmark results" in out.stderr


def test_short_outputs_are_noted(tmp_path: Path) -> None:
    _aiperf_run(tmp_path, "c1", 8, [], 11.5)
    out = _check(tmp_path, "--expect-osl", "16")
    assert out.returncode == 0 and "output length 11.5 != 16" in out.stdout
