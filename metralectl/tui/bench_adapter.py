"""The Benchmarks view's window on metralectl.bench.

Run records live under $METRALE_HOME/runs/<suite>/ (one directory or JSON file per run), written
by `metralectl bench` and by the dashboard alike. `RecordsBench` reads them directly, so History
works whatever state the bench package is in; running suites goes through `metralectl.bench` when
its runner is importable (`make_bench` decides), otherwise the form says why it is unavailable.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metralectl.errors import MetralError
from metralectl.tui.services import BenchProgress, RunDetail, RunSummary, SuiteInfo

if TYPE_CHECKING:
    from metralectl.tui.cancel import CancelToken
    from metralectl.tui.services import BenchService

RECORD_NAMES = ("record.json", "run.json", "result.json")
NOT_READY = ("running benchmarks from the dashboard needs metralectl.bench's runner, which this build does not "
             "have yet; History below reads the run records")


def runs_dir() -> Path:
    from metralectl import paths
    return paths.metrale_home() / "runs"


def _record_file(entry: Path) -> Path | None:
    if entry.is_file() and entry.suffix == ".json":
        return entry
    if entry.is_dir():
        for name in RECORD_NAMES:
            if (entry / name).is_file():
                return entry / name
    return None


def _first(data: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        cursor: Any = data
        for part in key.split("."):
            cursor = cursor.get(part) if isinstance(cursor, dict) else None
        if cursor not in (None, ""):
            return cursor
    return None


def summarize(data: dict[str, Any], suite_dir: str, path: Path) -> RunSummary:
    started = _first(data, "started", "started_at", "at", "time.started")
    if isinstance(started, str):
        from datetime import datetime

        try:
            started = datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp()
        except ValueError:
            started = None
    headline = _first(data, "headline", "summary.headline")
    if headline is None:
        tok = _first(data, "summary.tok_s", "result.tok_s", "summary.output_tok_s")
        headline = f"{tok:.1f} tok/s" if isinstance(tok, (int, float)) else "-"
    return RunSummary(
        run_id=str(_first(data, "run_id", "id") or path.parent.name if path.name in RECORD_NAMES else path.stem),
        suite=str(_first(data, "suite", "benchmark", "benchmark_id") or suite_dir),
        started=float(started) if isinstance(started, (int, float)) else None,
        source=str(_first(data, "source") or "?"),
        target=str(_first(data, "target.recipe", "target.model", "target.url", "target") or "-"),
        outcome=str(_first(data, "verdict", "outcome", "status") or "?"),
        headline=str(headline),
        path=str(path),
    )


def read_history(limit: int = 200) -> list[RunSummary]:
    root = runs_dir()
    found: list[RunSummary] = []
    if not root.is_dir():
        return found
    for suite_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for entry in suite_dir.iterdir():
            record = _record_file(entry)
            if record is None:
                continue
            try:
                data = json.loads(record.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(data, dict):
                found.append(summarize(data, suite_dir.name, record))
    found.sort(key=lambda r: (r.started or 0.0, r.run_id), reverse=True)
    return found[:limit]


def read_detail(run: RunSummary) -> RunDetail:
    try:
        data = json.loads(Path(run.path).read_text())
    except (OSError, ValueError) as exc:
        raise MetralError(f"cannot read run record {run.path}: {exc}") from None
    params = data.get("params") or data.get("parameters") or {}
    table = data.get("results") or data.get("rungs") or data.get("rows") or []
    columns: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()
    if isinstance(table, list) and table and isinstance(table[0], dict):
        columns = tuple(dict.fromkeys(k for row in table for k in row if not isinstance(row[k], (dict, list))))
        rows = tuple(tuple(_cell(row.get(c)) for c in columns) for row in table)
    notes = tuple(str(n) for n in (data.get("notes") or ()))
    return RunDetail(run, dict(params) if isinstance(params, dict) else {}, columns, rows, notes)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


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
