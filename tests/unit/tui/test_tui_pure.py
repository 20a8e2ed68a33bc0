"""The dashboard's pure pieces: filter, progress model, coalescer, cancel token, chart series, plans."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from metralectl.errors import MetralError
from metralectl.lifecycle import events as ev
from metralectl.tui import library_filter
from metralectl.tui.bench_adapter import read_detail
from metralectl.cancel import Cancelled, CancelToken
from metralectl.tui.coalesce import Coalescer
from metralectl.tui.progress_model import DONE, FAIL, ProgressModel
from metralectl.tui.screens.run_detail import compare_rows
from metralectl.tui.services import RunDetail, RunSummary
from metralectl.tui.telemetry_history import TelemetryHistory
from tests.unit.tui.fakes import DEFAULT_ITEMS, top_view


def names(query: str) -> list[str]:
    return [i.row.name for i in library_filter.apply(DEFAULT_ITEMS, query)]


def test_filter_words_keywords_fields_and_negation() -> None:
    assert names("") == [i.row.name for i in DEFAULT_ITEMS]
    assert names("fp8") == ["qwen3.6-35b-a3b-fp8"]
    assert names("cached") == ["qwen3.5-35b-a3b"]
    assert names("hw:hopper") == ["qwen3.5-35b-a3b-hopper"]
    assert names("qwen !hopper mtp") == ["qwen3.5-35b-a3b"]
    assert names("image fits") == ["qwen3.5-35b-a3b", "qwen3.6-35b-a3b-fp8"]
    assert names("tag:flagship") == ["qwen3.5-35b-a3b"]
    assert names("GEMMA") == ["gemma-4-31b"]
    assert names("nothing-like-this") == []


def test_progress_model_steps_phases_and_bars() -> None:
    from metralectl.core.images import LayerProgress
    from metralectl.seams.hf.steps import PullEvent

    m = ProgressModel()
    assert m.apply(ev.Step("image", "img:latest"))
    assert m.apply(ev.Phase("loading", "loading X", 0.5))
    assert not m.apply(ev.LogLine("a log line"))  # lines go to the log, not the steps
    assert m.apply(ev.Ready("http://h:1", "m", 2.0))
    assert [line.mark for line in m.lines] == [DONE, DONE, DONE] and m.ready_url == "http://h:1"
    m.apply(ev.Failed("oom", "out of memory", "lower it"))
    assert m.lines[-1].mark == FAIL and m.failed
    m.apply(PullEvent("Org/M", "download", 50, 100, 10.0, 5.0, 1, 4))
    assert m.bar is not None and m.bar.done == 50 and m.bar.total == 100 and "ETA" in m.bar.detail
    m.apply(LayerProgress("img", "abc", "Downloading", 10, 20))
    m.apply(LayerProgress("img", "def", "Pull complete", None, None))
    assert m.bar.label == "image img" and m.bar.detail.startswith("1/2 layers")


def test_coalescer_notifies_once_per_burst_and_keeps_order() -> None:
    notes: list[int] = []
    c: Coalescer[int] = Coalescer(lambda: notes.append(1), maxlen=5)
    for i in range(8):
        c.push(i)
    assert notes == [1]  # one notification for the whole burst
    assert c.drain() == [3, 4, 5, 6, 7] and c.dropped == 3
    c.extend([8, 9])
    assert notes == [1, 1] and c.drain() == [8, 9] and c.drain() == []


def test_cancel_token_raises_from_the_listener() -> None:
    token = CancelToken()
    token.check()
    token.cancel()
    with pytest.raises(Cancelled):
        token.check()
    assert isinstance(Cancelled(), KeyboardInterrupt)  # the core's Ctrl-C cleanup runs


def test_cancel_is_delivered_once_so_the_cleanup_after_it_runs_to_the_end() -> None:
    """The listener raises Cancelled; the core's cleanup then calls the listener again and takes its time.
    Nothing may raise a second time inside it."""
    token = CancelToken()
    result: list[str] = []

    def core_with_cleanup() -> None:
        try:
            with token.bound():
                try:
                    while True:
                        token.check()  # the core's event listener
                        time.sleep(0.01)
                except Cancelled:
                    token.check()  # the cleanup emits an event ("removing the half-started container")
                    time.sleep(0.3)
                    result.append("cleaned up")
                    raise
        except Cancelled:
            result.append("cancelled")

    thread = threading.Thread(target=core_with_cleanup)
    thread.start()
    time.sleep(0.05)
    token.cancel()
    thread.join(3)
    assert result == ["cleaned up", "cancelled"]
    assert token.cancelled


def test_telemetry_history_series_lines_and_unified_memory() -> None:
    h = TelemetryHistory(keep=5)
    for i in range(8):
        h.add(top_view(i))
    assert len(h.values("util")) == 5
    temp = h.chart("temp")
    assert {line.label for line in temp.lines} == {"park 80", "resume 70"} and temp.current.endswith("°C")
    mem = h.chart("memory")
    assert "unified pool" in mem.note and "GPU-held 24.0 GB" in mem.note and mem.current.endswith("/120 GB")
    assert h.chart("tok_s").current.endswith("tok/s") and h.chart("ttft").current == "42 ms"
    h.add(top_view(gpu=False))
    assert h.values("util")[-1] is None and h.chart("util").current == "?"


def test_compare_rows_puts_differences_first() -> None:
    a = RunDetail(RunSummary("a", "sweep", None, "cli", "x", "ok", "1"), {"osl": 64, "n": 1})
    b = RunDetail(RunSummary("b", "sweep", None, "tui", "x", "ok", "2"), {"osl": 128, "n": 1})
    params = [r for r in compare_rows(a, b) if r[0].startswith("param")]
    assert params[0] == ("param osl", "64", "128") and params[-1] == ("param n", "1", "1")


def test_history_reads_the_records_through_the_one_reader(isolated_env: Path) -> None:
    """Without the runner (RecordsBench) History reads bench.records' way: an old 'completed' record with
    failed stages shows as failed, a run whose process died as interrupted, a torn run.json is skipped."""
    import subprocess
    import sys

    from metralectl.bench import records
    from metralectl.tui.bench_adapter import RecordsBench

    good = records.start("decode", "20261129-100000-aaaaaa", {
        "started_at": "2026-11-29T10:00:00+00:00", "source": "cli", "params": {"max_tokens": 128},
        "target": {"recipe": "qwen3.5-35b-a3b"}})
    records.save(good, {**(records.load(good) or {}), "status": "completed", "verdict": "pass",
                        "summary": {"headline": {"decode_tok_s_p50": 131.0}},
                        "stages": [{"name": "decode", "summary": {"ok": 4, "requests": 4, "output_tok_s": 131.0}}]})
    old = records.start("decode", "20261129-110000-bbbbbb", {"started_at": "2026-11-29T11:00:00+00:00",
                                                             "source": "cli", "target": {}})
    records.save(old, {**(records.load(old) or {}), "status": "completed",
                       "stages": [{"name": "decode", "summary": {"ok": 0, "requests": 5}}]})
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    died = records.start("sweep", "20261129-120000-cccccc", {"started_at": "2026-11-29T12:00:00+00:00",
                                                              "source": "tui", "target": {}})
    records.save(died, {**(records.load(died) or {}), "pid": dead.pid})  # still "running", its process gone
    torn = isolated_env / "metrale" / "runs" / "sweep" / "20261129-130000-dddddd"
    torn.mkdir(parents=True)
    (torn / "run.json").write_text('{"run_id": "20261129-130000-dddddd", "sta')
    history = RecordsBench().history()
    assert [(r.run_id, r.outcome) for r in history] == [("20261129-120000-cccccc", "failed (interrupted)"),
                                                         ("20261129-110000-bbbbbb", "failed (errors)"),
                                                         ("20261129-100000-aaaaaa", "completed/pass")]
    assert history[2].headline == "decode_tok_s_p50=131.00" and history[2].target == "qwen3.5-35b-a3b"
    detail = RecordsBench().detail(history[2])
    assert detail.params == {"max_tokens": 128} and detail.rows[0][:3] == ("decode", "4/4", "131.0")
    with pytest.raises(MetralError, match="cannot read the record"):
        read_detail(RunSummary("20261129-130000-dddddd", "sweep", None, "?", "-", "?", "-", str(torn / "run.json")))


def test_core_bench_schema_checks_and_records(isolated_env: Path) -> None:
    from metralectl.bench import records
    from metralectl.tui.bench_core import CoreBench

    bench = CoreBench()
    suites = {s.id: s for s in bench.suites()}
    decode = {p.name: p for p in suites["decode"].params}
    assert decode["max_tokens"].kind == "int" and decode["max_tokens"].maximum == 128
    assert {p.kind for p in suites["concurrency-sweep"].params} >= {"int-list", "choice"}
    params, errors = bench.check_params("decode", {"max_tokens": "500", "repeats": "x", "warmup": "1"})
    assert errors == {"max_tokens": "500 is above the maximum 128", "repeats": "expected an integer"}
    assert params["warmup"] == 1 and params["prompt"] == "What is the capital of France?"  # defaults filled in
    directory = records.start("decode", "20261129-120000-abcdef", {
        "started_at": "2026-11-29T12:00:00+00:00", "source": "cli", "params": {"max_tokens": 64},
        "target": {"recipe": "qwen3.5-35b-a3b"}})
    records.save(directory, {**(records.load(directory) or {}), "status": "completed", "verdict": "pass",
                             "summary": {"headline": {"decode_tok_s_p50": 131.2}},
                             "stages": [{"name": "decode", "summary": {"ok": 10, "requests": 10, "output_tok_s": 131.2,
                                                                       "ttft_ms": {"p50": 41.0}}}]})
    [run] = bench.history()
    assert (run.run_id, run.source, run.target, run.outcome) == ("20261129-120000-abcdef", "cli", "qwen3.5-35b-a3b",
                                                                 "completed/pass")
    assert run.headline == "decode_tok_s_p50=131.20"
    detail = bench.detail(run)
    assert detail.rows[0][:4] == ("decode", "10/10", "131.2", "41.0") and detail.params == {"max_tokens": 64}


def test_history_rows_and_details_read_the_engine_a_record_names(isolated_env: Path) -> None:
    from metralectl.bench import records
    from metralectl.tui.bench_adapter import RecordsBench

    named = records.start("decode", "20261129-100000-aaaaaa", {
        "started_at": "2026-11-29T10:00:00+00:00", "source": "cli", "target": {"url": "http://127.0.0.1:8080",
        "engine": {"name": "llama-cpp", "source": "detected", "evidence": "GET /props: default_generation_settings",
                   "detected": "llama-cpp", "revision": None, "version": "b6500"}}})
    records.save(named, {**(records.load(named) or {}), "status": "completed"})
    old = records.start("decode", "20261129-110000-bbbbbb", {"started_at": "2026-11-29T11:00:00+00:00",
                                                             "source": "cli", "target": {}})
    records.save(old, {**(records.load(old) or {}), "status": "completed"})
    history = RecordsBench().history()
    assert [(r.run_id, r.engine) for r in history] == [("20261129-110000-bbbbbb", "-"),
                                                       ("20261129-100000-aaaaaa", "llama-cpp")]
    assert RecordsBench().detail(history[1]).notes[0] == (
        "engine: llama-cpp (detected, build b6500: GET /props: default_generation_settings)")
    assert RecordsBench().detail(history[0]).notes[0] == (
        "engine: not recorded (a record from before metralectl named engines)")


def test_failures_stay_readable_without_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under NO_COLOR Textual greys every colour by luminance (red → dark grey on black): FAIL is reverse video."""
    from metralectl.tui.widgets.check_table import mark_of

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert mark_of("problem") == ("FAIL", "bold red") and mark_of("warn") == ("warn", "yellow")
    monkeypatch.setenv("NO_COLOR", "1")
    assert mark_of("problem") == ("FAIL", "bold reverse") and "underline" in mark_of("warn")[1]
    assert mark_of("ok") == ("ok", "green") and mark_of("odd") == ("odd", "")
