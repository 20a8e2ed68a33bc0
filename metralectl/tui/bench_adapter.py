"""The Benchmarks view's window on metralectl.bench.

Run records live under $METRALE_HOME/runs/<suite>/<run-id>/run.json, written by `metralectl bench` and by
the dashboard alike, and are read here through metralectl.bench.records (the one reader, which also shows
an old record's true status and a dead run as interrupted). History and details work without the runner;
running suites goes through `metralectl.bench` when its runner is importable (`make_bench` decides),
otherwise the form says why it is unavailable.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metralectl.errors import MetralError
from metralectl.tui.services import BenchProgress, RunDetail, RunSummary, SuiteInfo

if TYPE_CHECKING:
    from metralectl.cancel import CancelToken
    from metralectl.tui.services import BenchService

NOT_READY = ("running benchmarks from the dashboard needs metralectl.bench's runner, which this build does not "
             "have yet; History below reads the run records")
HEADLINE_KEYS = ("decode_tok_s_p50", "prefix_speedup", "well_formed_frac")


def headline(record: dict[str, Any]) -> str:
    """The one number of a run, chosen as `bench history` chooses it."""
    from metralectl.present.bench_view import fmt

    values = (record.get("summary") or {}).get("headline") or {}
    key = next((k for k in HEADLINE_KEYS if k in values), None)
    if key is None:
        key = next((k for k in values if k.endswith(("output_tok_s", "goodput_rps"))), None)
    return f"{key}={fmt(values.get(key), 2)}" if key else "-"


def summary_of(record: dict[str, Any]) -> RunSummary:
    """One History row from a record as metralectl.bench.records reads it."""
    from datetime import datetime

    started = record.get("started_at")
    try:
        when = datetime.fromisoformat(str(started)).timestamp() if started else None
    except ValueError:
        when = None
    from metralectl.bench.outcome import FAILED_STATUSES, effective_status

    target = record.get("target") or {}
    status = effective_status(record)
    verdict = record.get("verdict")
    if status in FAILED_STATUSES:
        outcome = f"failed ({status})"  # never shown as plain completed
    else:
        outcome = status if not verdict or verdict == "none" else f"{status}/{verdict}"
    directory = record.get("_dir") or ""
    from metralectl.bench.engine_id import short

    return RunSummary(str(record.get("run_id")), str(record.get("suite")), when, str(record.get("source") or "?"),
                      str(target.get("recipe") or target.get("model") or target.get("url") or "-"), outcome,
                      headline(record), f"{directory}/run.json" if directory else "", short(target.get("engine")))


def read_history(limit: int = 200) -> list[RunSummary]:
    """The recorded runs, newest first, through the one record reader (metralectl.bench.records)."""
    from metralectl.bench import records

    return [summary_of(r) for r in records.list_runs()[:limit]]


def read_detail(run: RunSummary) -> RunDetail:
    """A run's stages, headline numbers and gates (a dead run's record is rewritten as interrupted first)."""
    from metralectl.bench import records
    from metralectl.present.bench_view import fmt

    directory = Path(run.path).parent if run.path else None
    try:
        record = records.repair(directory if directory is not None else records.find(run.run_id))
    except MetralError:
        record = None
    if not record:
        raise MetralError(f"cannot read the record of run {run.run_id}"
                          + (f" ({run.path})" if run.path else ""), "`metralectl bench history` lists runs")
    columns = ("stage", "ok/req", "out tok/s", "TTFT p50 ms", "TTFT p95 ms", "TPOT p50 ms", "ITL p95 ms",
               "E2E p50 ms", "client")
    rows = []
    for s in record.get("stages") or []:
        a = s.get("summary") or {}

        def q(metric: str, p: str, a: dict[str, Any] = a) -> Any:
            return (a.get(metric) or {}).get(p)

        rows.append((s.get("name", "?"), f"{a.get('ok', 0)}/{a.get('requests', 0)}", fmt(a.get("output_tok_s")),
                     fmt(q("ttft_ms", "p50")), fmt(q("ttft_ms", "p95")), fmt(q("tpot_ms", "p50"), 2),
                     fmt(q("itl_ms", "p95"), 2), fmt(q("e2e_ms", "p50")),
                     "BOUND" if s.get("client_bound") else "ok"))
    from metralectl.bench.engine_id import describe

    notes = [f"engine: {describe((record.get('target') or {}).get('engine'))}"]
    notes += [f"{k} = {fmt(v, 2)}" for k, v in ((record.get("summary") or {}).get("headline") or {}).items()]
    notes += [f"gate {g.get('metric')} {g.get('op')} {g.get('threshold')}: "
              f"{ {True: 'PASS', False: 'FAIL', None: 'n/a'}[g.get('passed')] }" for g in record.get("gates") or []]
    if record.get("error"):
        notes.append(f"error: {record['error']}")
    params = {k: v for k, v in (record.get("params") or {}).items()}
    return RunDetail(summary_of(record), params, columns, tuple(rows), tuple(notes))


class RecordsBench:
    """History from the records directory; no runner (yet)."""

    def __init__(self, reason: str = NOT_READY) -> None:
        self._reason = reason

    @property
    def unavailable(self) -> str | None:
        return self._reason

    def suites(self) -> list[SuiteInfo]:
        return []

    def check_params(self, suite: str, values: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
        return {}, {"": self._reason}

    def run(self, suite: str, params: dict[str, Any], on_event: Callable[[BenchProgress], None],
            cancel: CancelToken) -> RunSummary:
        raise MetralError(self._reason)

    def history(self, limit: int = 200) -> list[RunSummary]:
        return read_history(limit)

    def detail(self, run: RunSummary) -> RunDetail:
        return read_detail(run)


def make_bench() -> BenchService:
    """The bench service this build can offer."""
    import importlib.util

    try:  # found, not imported: the runner's imports stay off the UI thread until a run starts
        has_runner = importlib.util.find_spec("metralectl.bench.runner") is not None
    except ImportError:
        has_runner = False
    if not has_runner:
        return RecordsBench()
    from metralectl.tui.bench_core import CoreBench

    return CoreBench()
