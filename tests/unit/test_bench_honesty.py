"""A benchmark never reports success over failure, against servers with the habits of real ones
(tests/bench_truth/quirky_server.py, a real HTTP server on loopback): completion judged by the stream's
events, refused request fields dropped after one probe, nothing measured lost, failures named by kind,
a changed model invalidates the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from metralectl.bench import dialect as D
from metralectl.bench import records
from metralectl.bench.params import parse_params
from metralectl.bench.results import late_stamp_errors
from metralectl.bench.run_record import RunRecord, StageRecord
from metralectl.bench.runner import Event, RunRequest, run
from metralectl.bench.sse import TokenEvent
from metralectl.bench.suites import get_suite
from metralectl.errors import ExitCode
from tests.bench_truth.helpers import REPO
from tests.bench_truth.quirky_server import quirky_server


def bench(suite: str, url: str, *pairs: str) -> tuple[RunRecord, list[Event]]:
    """Run a suite in this process. The server is a thread of this process too, so the client shares the
    GIL with it and is late to read now and then: the client-bound guard is not what these tests are about
    (it is tested against the truth server, in its own process), so it only warns here."""
    s = get_suite(suite)
    events: list[Event] = []
    params = parse_params(s.id, s.schema, ["client_bound=warn", *pairs])
    done = run(RunRequest(s.id, params, url), events.append)
    assert done.directory == records.run_dir(suite, done.record["run_id"])
    on_disk = json.loads((done.directory / "run.json").read_text())
    assert on_disk == json.loads(json.dumps(done.record, default=str))  # no runner state rides in the record
    declared = RunRecord.__required_keys__ | RunRecord.__optional_keys__
    assert RunRecord.__required_keys__ <= set(on_disk) <= declared, set(on_disk) ^ declared
    for stage in on_disk["stages"]:
        assert set(stage) == StageRecord.__required_keys__
    return done.record, events


def lines_of(record: RunRecord) -> list[dict[str, Any]]:
    return records.requests(records.run_dir(record["suite"], record["run_id"]))


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ), timeout=timeout)


# -- streams as real servers end them -----------------------------------------------------------------
@pytest.mark.parametrize("end", ["chunked", "close"])
def test_a_stream_without_done_marker_is_complete(end: str) -> None:
    with quirky_server(done_marker=False, end=end) as (url, _):
        record, _ = bench("decode", url, "repeats=3", "warmup=1", "max_tokens=12")
    assert record["status"] == "completed" and record["exit_code"] == 0
    agg = record["stages"][0]["summary"]
    assert agg["ok"] == 3 and agg["done_marker_missing"] == 3
    assert all(line["ok"] and not line["done"] and line["output_tokens"] == 12 for line in lines_of(record))


def test_a_stream_cut_before_its_finish_is_truncated() -> None:
    with quirky_server(cut_after=4) as (url, _):
        record, _ = bench("decode", url, "repeats=2", "warmup=0", "max_tokens=12", "dialect=full")
    assert record["status"] == "errors" and record["exit_code"] == 1
    assert record["stages"][0]["summary"]["error_kinds"] == {"truncated": 2}
    assert all(line["error_kind"] == "truncated" and "before any finish_reason" in line["error"]
               for line in lines_of(record))


def test_an_error_event_is_a_server_error() -> None:
    with quirky_server(error_event=3) as (url, _):
        record, _ = bench("decode", url, "repeats=2", "warmup=0", "max_tokens=12", "dialect=full")
    assert record["status"] == "errors"
    [kind] = record["errors"]
    assert kind["kind"] == "server-error" and kind["count"] == 2 and "illegal memory access" in kind["example"]


# -- no green over errors ----------------------------------------------------------------------------
def test_a_server_that_rejects_everything_stops_the_stage_early() -> None:
    with quirky_server(reject_all=503) as (url, seen):
        record, events = bench("concurrency-sweep", url, "concurrencies=4", "duration_s=30", "warmup_s=0",
                               "isls=16", "osl=8", "dialect=full")
    assert record["status"] == "errors" and record["exit_code"] == 1
    stage = record["stages"][0]
    assert stage["ok"] is False and "failed requests in a row" in stage["aborted"]
    assert stage["summary"]["ok"] == 0 and record["errors"][0]["kind"] == "http-503"
    # a short run of failures, not a 30-second burst into a server that says no
    assert len(seen.bodies) <= 2 * 5 + 4
    done = [e for e in events if e.kind == "stage-done"]
    assert done and done[0].data["ok"] is False


def test_failures_within_the_allowance_complete_beyond_it_fail() -> None:
    with quirky_server(fail_every=4) as (url, _):
        strict, _ = bench("decode", url, "repeats=8", "warmup=0", "max_tokens=6", "dialect=full")
        lenient, _ = bench("decode", url, "repeats=8", "warmup=0", "max_tokens=6", "dialect=full",
                           "max_error_frac=0.3")
    assert strict["status"] == "errors" and strict["exit_code"] == 1
    assert "2 of 8 measured requests failed" in strict["error"] and "http-500 ×2" in strict["error"]
    assert lenient["status"] == "completed" and lenient["exit_code"] == 0
    assert lenient["stages"][0]["summary"]["errors"] == 2  # allowed, still counted and shown


def test_cli_against_a_server_that_rejects_every_request() -> None:
    with quirky_server(reject_all=500) as (url, seen):
        probe = cli("bench", "run", "decode", "--url", url)  # the probe finds out before any load
        assert len(seen.bodies) == 1
        full = cli("bench", "run", "decode", "--url", url, "-p", "dialect=full", "-p", "repeats=20")
    assert probe.returncode == 1 and "HTTP 500" in probe.stderr and "✔" not in probe.stderr
    assert full.returncode == 1 and "✔" not in full.stderr and "✘ 0/" in full.stderr
    assert "http-500 ×" in full.stderr and "benchmark errors" in full.stderr
    history = cli("bench", "history")
    assert history.returncode == 0
    statuses = [line.split()[3:5] for line in history.stdout.splitlines()[1:]]
    assert statuses and all(s[0] == "FAILED" for s in statuses), history.stdout
    as_json = json.loads(cli("bench", "history", "--format", "json").stdout)
    assert {r["status"] for r in as_json} <= {"errors", "failed"}


def test_an_old_completed_record_with_failures_is_shown_failed() -> None:
    old = {"status": "completed", "params": {}, "stages": [{"name": "decode", "summary": {"requests": 5, "ok": 0}}]}
    assert records.effective_status(old) == "errors"
    fine = {"status": "completed", "params": {}, "stages": [{"name": "decode", "summary": {"requests": 5, "ok": 5}}]}
    assert records.effective_status(fine) == "completed"
    directory = records.start("decode", "20260101-000000-0ld0ld", {"started_at": "2026-01-01T00:00:00+00:00"})
    on_disk = json.loads((directory / "run.json").read_text())
    on_disk.update(old)
    (directory / "run.json").write_text(json.dumps(on_disk))
    loaded = records.load(directory)
    assert loaded is not None and loaded["status"] == "errors" and loaded["status_recorded"] == "completed"


# -- request dialect ---------------------------------------------------------------------------------
def test_refused_fields_are_dropped_after_one_probe_and_labelled() -> None:
    with quirky_server(refuse_fields=("ignore_eos", "min_tokens")) as (url, seen):
        record, events = bench("decode", url, "repeats=4", "warmup=1", "max_tokens=10")
    assert record["status"] == "completed" and record["exit_code"] == 0
    d = record["dialect"]
    assert sorted(d["refused"]) == ["ignore_eos", "min_tokens"] and d["source"] == "probe"
    assert d["output_length_forced"] is False and "Unexpected fields" in d["refusal"]
    assert seen.refused == 1  # one refused probe, then nothing doomed
    sent = seen.bodies[1:]
    assert sent and not any("ignore_eos" in b or "min_tokens" in b for b in sent)
    warnings = [e.message for e in events if e.kind == "warning"]
    assert any("refused ignore_eos, min_tokens" in w for w in warnings)
    assert any("output length is not forced" in w for w in warnings)


def test_no_usage_counts_events_and_says_so(tmp_path: Path) -> None:
    with quirky_server(refuse_fields=("stream_options",), usage=False) as (url, seen):
        record, events = bench("decode", url, "repeats=2", "warmup=0", "max_tokens=9")
    assert record["status"] == "completed"
    assert record["dialect"]["refused"] == ["stream_options"] and record["dialect"]["sends_usage"] is False
    assert record["stages"][0]["summary"]["count_methods"] == {"events": 2}
    assert any("reports no token usage" in e.message for e in events if e.kind == "warning")


def test_a_tokenizer_counts_tokens_when_there_is_no_usage(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "w": 1, **{str(i): 2 + i for i in range(10)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    pre = tokenizers.pre_tokenizers
    tok.pre_tokenizer = pre.Sequence([pre.WhitespaceSplit(), pre.Split(tokenizers.Regex(r"w|\d"), behavior="isolated")])
    tok.save(str(tmp_path / "tokenizer.json"))
    with quirky_server(usage=False) as (url, _):
        record, _ = bench("decode", url, "repeats=2", "warmup=0", "max_tokens=12", f"tokenizer={tmp_path}")
    # " w0" .. " w11": w + one digit (10 tokens of 2) and w + two digits (2 tokens of 3) = 26
    assert record["stages"][0]["summary"]["count_methods"] == {"tokenizer-spread": 2}
    assert all(line["output_tokens"] == 26 for line in lines_of(record))


def test_probe_refusal_naming_no_field_fails_before_any_load() -> None:
    with quirky_server(reject_all=400) as (url, seen):
        with pytest.raises(Exception) as info:
            bench("decode", url, "repeats=50")
    assert "refused the benchmark's probe request" in str(info.value) and len(seen.bodies) == 1


def test_dialect_pieces() -> None:
    assert D.named_fields("Unexpected fields in the request: {'ignore_eos', 'min_tokens'}",
                          ["ignore_eos", "min_tokens", "seed"]) == ["ignore_eos", "min_tokens"]
    assert D.named_fields('{"loc":["body","stream_options"],"msg":"Extra inputs"}', ["stream_options", "seed"]) == [
        "stream_options"]
    assert D.named_fields("no_ignore_eos_here", ["ignore_eos"]) == []
    assert D.FULL.without(["stream_options"]).continuous_usage is False
    assert D.from_engine("x", {"ignore-eos": "accepted", "min-tokens": "accepted", "stream-usage": "accepted",
                               "continuous-usage": "unknown"}) is None
    refused = D.from_engine("x", {"ignore-eos": "refused", "min-tokens": "refused", "stream-usage": "accepted",
                                  "continuous-usage": "refused"})
    assert refused is not None and not refused.forces_length(True) and refused.source == "engine x"


# -- the served model must not change under a run ------------------------------------------------------
def test_a_model_change_invalidates_the_run() -> None:
    with quirky_server(switch_after=4) as (url, _):
        record, _ = bench("concurrency-sweep", url, "concurrencies=1,2", "duration_s=0.6", "warmup_s=0",
                          "isls=16", "osl=4")
    assert record["status"] == "invalid" and record["exit_code"] == 1
    assert "the served model changed (quirky-a → quirky-b at stage 1" in record["error"]
    assert len(record["stages"]) == 1  # nothing after the change is measured as if it were the same model


def test_each_stage_names_the_model_it_measured() -> None:
    with quirky_server() as (url, _):
        record, _ = bench("concurrency-sweep", url, "concurrencies=1,2", "duration_s=0.3", "warmup_s=0",
                          "isls=16", "osl=4")
    assert record["status"] == "completed"
    assert [s["model"] for s in record["stages"]] == ["quirky-a", "quirky-a"]
    assert all(isinstance(s["t0_unix_ns"], int) and abs(s["t0_unix_ns"] / 1e9 - time.time()) < 600
               for s in record["stages"])


# -- nothing measured is lost ------------------------------------------------------------------------
def test_a_stalled_request_is_recorded_as_cancelled_at_drain() -> None:
    with quirky_server(stall_request=3) as (url, _):
        record, events = bench("concurrency-sweep", url, "concurrencies=2", "duration_s=0.4", "warmup_s=0",
                               "isls=16", "osl=4", "drain_timeout_s=3")
    assert record["status"] == "errors" and record["exit_code"] == 1
    stage = record["stages"][0]
    assert stage["drain_timed_out"] is True and stage["summary"]["error_kinds"] == {"cancelled-at-drain": 1}
    stalled = [line for line in lines_of(record) if line["error_kind"] == "cancelled-at-drain"]
    assert len(stalled) == 1 and stalled[0]["phase"] == "measure" and "3 s drain timeout" in stalled[0]["error"]
    assert any(e.kind == "progress" and "draining: 1 measured request" in e.message for e in events)
    csv = records.export_requests_csv(lines_of(record))
    assert "response_id" in csv.splitlines()[0] and "cancelled-at-drain" in csv


def test_ctrl_c_writes_every_in_flight_request_as_interrupted() -> None:
    home = Path(os.environ["METRALE_HOME"])
    with quirky_server(stall_request=2) as (url, seen):
        proc = subprocess.Popen([sys.executable, "-m", "metralectl", "bench", "run", "concurrency-sweep", "--url", url,
                                 "-p", "concurrencies=2", "-p", "duration_s=30", "-p", "warmup_s=0", "-p", "isls=16",
                                 "-p", "osl=4"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Ctrl-C only once the server holds the stalled request (a fixed sleep lost that race on a loaded box)
        assert seen.stalled.wait(60), "the benchmark never sent its second request"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not list(home.glob("runs/concurrency-sweep/*/run.json")):
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.INTERRUPTED, err  # Ctrl-C's own code, not the run-failed 1
    [run_dir] = list(home.glob("runs/concurrency-sweep/*"))
    lines = [json.loads(x) for x in (run_dir / "requests.jsonl").read_text().splitlines()]
    interrupted = [x for x in lines if x["error_kind"] == "interrupted"]
    assert interrupted and all(x["phase"] == "measure" for x in interrupted)
    on_disk = json.loads((run_dir / "run.json").read_text())
    assert on_disk["status"] == "interrupted" and on_disk["exit_code"] == ExitCode.INTERRUPTED


# -- the client-bound guard's estimate ------------------------------------------------------------------
def test_late_stamp_errors() -> None:
    ms = 1_000_000
    prompt = 10_000
    # a stream every 10 ms; events 3 and 4 share a read whose oldest bytes came 8 ms before its newest
    events = [TokenEvent(t, "c") for t in (10 * ms, 20 * ms, 40 * ms, 40 * ms, 50 * ms)]
    alone = {t: (t, prompt) for t in (10 * ms, 20 * ms, 50 * ms)}
    errs = late_stamp_errors(events, {**alone, 40 * ms: (32 * ms, prompt)}, 0)
    assert errs == [0.0, 0.0, 8.0 * ms, 0.0, 0.0]  # the first of them came with the oldest bytes
    # three events in one read, 24 ms from the oldest bytes to the newest: the middle one a short gap before
    three = [TokenEvent(t, "c") for t in (10 * ms, 20 * ms, 30 * ms, 55 * ms, 55 * ms, 55 * ms)]
    spread = late_stamp_errors(three, {10 * ms: (10 * ms, prompt), 20 * ms: (20 * ms, prompt),
                                       30 * ms: (30 * ms, prompt), 55 * ms: (31 * ms, prompt)}, 0)
    assert spread == [0.0, 0.0, 0.0, 24.0 * ms, 10.0 * ms, 0.0]
    # oldest and newest bytes together, read at once: the server wrote them together, no error
    together = late_stamp_errors(events, {**alone, 40 * ms: (40 * ms, prompt)}, 0)
    assert together == [0.0] * 5
    # together but read 15 ms late, more than the stream's 10 ms gap: segments the kernel merged while the
    # client did not read; the earlier event is charged one gap
    merged = late_stamp_errors(events, {**alone, 40 * ms: (40 * ms, 15 * ms)}, 0)
    assert merged == [0.0, 0.0, 10.0 * ms, 0.0, 0.0]
    # together and read 6 ms late, less than a gap: a burst the server wrote at once, read late
    burst = late_stamp_errors(events, {**alone, 40 * ms: (40 * ms, 6 * ms)}, 0)
    assert burst == [0.0] * 5
