"""benchmarks/aiperf_rate_table.py: what the AIPerf side by side reads from each tool's records and how it says why
two numbers differ (the real run: tests/integration/test_aiperf_rate_real.py). AIPerf's export is written here in
the shape AIPerf 0.13.0 writes it (profile_export.jsonl: one record per request, `error` on a failed one)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import aiperf_rate_table as T  # noqa: E402


def _aiperf_export(out: Path, n_ok: int, n_err: int, *, gap_ns: int = 250_000_000, osl: int = 16) -> None:
    out.mkdir()
    recs: list[dict[str, Any]] = []
    for i in range(n_ok):
        start = 1_000_000_000 + i * gap_ns
        recs.append({"metadata": {"benchmark_phase": "profiling", "request_start_ns": start,
                                  "request_end_ns": start + 10_000_000},
                     "metrics": {"output_sequence_length": {"value": osl}, "usage_prompt_tokens": {"value": 96},
                                 "time_to_first_token": {"value": 4.0}, "inter_token_latency": {"value": 0.2}}})
    recs += [{"metadata": {"benchmark_phase": "profiling"}, "metrics": {},
              "error": {"code": None, "type": "ServerDisconnectedError", "message": "Server disconnected"}}] * n_err
    recs.append({"metadata": {"benchmark_phase": "warmup", "request_start_ns": 0, "request_end_ns": 1}, "metrics": {}})
    (out / "profile_export.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    (out / "profile_export_aiperf.json").write_text(json.dumps({
        "output_token_throughput": {"avg": 63.8}, "time_to_first_token": {"p50": 4.0, "p99": 4.0},
        "inter_token_latency": {"p50": 0.2}, "benchmark_duration": {"avg": 3.01},
        "error_summary": [{"error_details": {"type": "ServerDisconnectedError", "message": "Server disconnected"},
                           "count": n_err}] if n_err else []}))


def _metralectl(n: int, *, retried: int = 0, tok_s: float = 64.0, prompt: int = 96) -> dict[str, Any]:
    doc = {"status": "completed", "params": {"rates": [4.0]}, "stages": [{"summary": {
        "output_tok_s": tok_s, "ttft_ms": {"p50": 3.0, "p99": 5.0}, "itl_ms": {"p50": 0.15}, "requests": n, "ok": n,
        "errors": 0, "retried": retried, "error_kinds": {}}}]}
    lines = [{"phase": "measure", "ok": True, "t_send_us": i * 250_000, "e2e_ms": 10.0, "output_tokens": 16,
              "prompt_tokens": prompt} for i in range(n)] + [{"phase": "warmup", "ok": True}]
    return T.metralectl_result(doc, lines, 0)


def test_every_request_counted_and_a_kept_alive_close_said_for_each_tool(tmp_path: Path) -> None:
    _aiperf_export(tmp_path / "a", n_ok=10, n_err=2)
    a = T.aiperf_result(tmp_path / "a")
    assert (a["requests"], a["ok"], a["failed"], a["output_tokens"]) == (12, 10, 2, 160)  # the warm-up left out
    assert a["error_kinds"] == {"ServerDisconnectedError: Server disconnected": 2}  # not counted twice
    assert a["prompt_tokens"] == [96] * 10 and a["tok_s"] == 63.8
    m = _metralectl(12, retried=2)
    row = {"rate": 4.0, "metralectl": m, "aiperf": a, **T.agreement({"rate": 4.0, "metralectl": m, "aiperf": a}, 0.03)}
    assert not row["complete"] and row["agree"]  # the tok/s agree, but AIPerf lost two requests: not complete
    assert "AIPerf counted 2 of 12 requests failed (2× ServerDisconnectedError: Server disconnected)" in row["why"]
    assert "metralectl sent 2 again on a fresh connection" in row["why"]
    md = T.markdown({"tolerance": 0.03, "arrival": "constant", "prompt_tokens": 96, "osl": 16, "duration_s": 3,
                     "warmup_s": 1, "metralectl": "tree", "server": "llama-server", "commands": {}, "rows": [row]})
    assert "| 12 / 0 (2 re-sent) | 10 / 2 | 96 / 96 | yes: AIPerf counted 2" in md


def test_a_gap_of_definition_is_told_from_one_of_measurement(tmp_path: Path) -> None:
    # the same requests, computed the same way, agree; the headlines do not (here: 20 % apart)
    _aiperf_export(tmp_path / "a", n_ok=12, n_err=0)
    a = T.aiperf_result(tmp_path / "a")
    m = _metralectl(12, tok_s=63.8 * 1.2)
    row = T.agreement({"rate": 4.0, "metralectl": m, "aiperf": a}, 0.03)
    assert row["complete"] and not row["agree"] and abs(row["same_def_ratio"] - 1) < 1e-9
    assert "computed the same way" in row["why"] and "the gap is the definition" in row["why"]
    # prompts that differ on the server are named
    m = _metralectl(12, prompt=111)
    assert "the prompts differ on the server: [111] vs [96] tokens" in T.agreement(
        {"rate": 4.0, "metralectl": m, "aiperf": a}, 0.03)["why"]


def test_a_tool_that_did_not_run_is_a_row_that_says_so() -> None:
    row = T.agreement({"rate": 8.0, "metralectl": {"run_failed": "metralectl exit 69, no record: nothing answers"},
                       "aiperf": {"ok": 1}}, 0.03)
    assert row == {"complete": False, "ratio": None, "same_def_ratio": None, "agree": False,
                   "why": "a tool did not run: metralectl exit 69, no record: nothing answers"}


def test_a_client_that_sent_late_is_named_not_the_server(tmp_path: Path) -> None:
    # AIPerf's 12 requests went out 0.5 s apart where 4/s asks 0.25 s: its own scheduling, not saturation
    _aiperf_export(tmp_path / "a", n_ok=12, n_err=0, gap_ns=500_000_000)
    a = T.aiperf_result(tmp_path / "a")
    assert abs(a["send_span_s"] - 5.5) < 1e-9
    row = T.agreement({"rate": 4.0, "metralectl": _metralectl(12), "aiperf": a}, 0.03)
    assert "AIPerf sent late: its 12 requests went out over 5.50 s where 4/s asks 2.75 s" in row["why"]
    assert "past saturation" not in row["why"] and "metralectl sent late" not in row["why"]
