"""Run records under $METRALE_HOME/runs/<suite>/<run-id>/: run.json (atomic) + requests.jsonl (appended).

run.json is written when a run starts (status "running", with pid and host) and replaced whole when it
ends, so a reader never sees a torn file. A run whose process died without finishing (SIGKILL, power)
still says "running"; readers report it as "interrupted" once that pid is gone (and `repair` rewrites it).
"""

from __future__ import annotations

import csv
import io
import os
import socket
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from metralectl import paths
from metralectl.bench.run_record import RunHeader

from metralectl.seams import store
from metralectl.seams.process import pid_alive
from metralectl.errors import ExitCode, NotFound

SCHEMA = 1
KIND = "metralectl-bench-run"
REQUESTS = "requests.jsonl"


def runs_root() -> Path:
    return paths.metrale_home() / "runs"


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def run_dir(suite: str, run_id: str) -> Path:
    return runs_root() / suite / run_id


def header(suite: str, run_id: str) -> RunHeader:
    """The keys a record starts with: what it is, and which process on which host is running it."""
    return {"schema": SCHEMA, "kind": KIND, "run_id": run_id, "suite": suite, "status": "running",
            "pid": os.getpid(), "host": socket.gethostname(), "requests_file": REQUESTS}


def start(suite: str, run_id: str, record: Mapping[str, Any]) -> Path:
    """Create the run's directory and write its first run.json: the record under this run's header."""
    directory = run_dir(suite, run_id)
    directory.mkdir(parents=True, exist_ok=True)
    store.write_json(directory / "run.json", {**record, **header(suite, run_id)})
    return directory


def save(directory: Path, record: Mapping[str, Any]) -> None:
    store.write_json(directory / "run.json", record)


def append_requests(directory: Path, lines: list[dict[str, Any]]) -> None:
    for line in lines:
        store.append_jsonl(directory / REQUESTS, line)


def effective_status(record: Mapping[str, Any]) -> str:
    """The status to show for a record, also one written before the no-green-over-errors rules: a
    'completed' run whose stages counted failed requests beyond its allowance (or no success at all), or
    measured a changed model, is errors / invalid, never completed."""
    status = str(record.get("status") or "?")
    if status != "completed":
        return status
    allowed = (record.get("params") or {}).get("max_error_frac") or 0
    for stage in record.get("stages") or []:
        agg = stage.get("summary") or {}
        requests, ok = agg.get("requests") or 0, agg.get("ok") or 0
        if stage.get("invalid"):
            return "invalid"
        if not requests or ok == 0 or (requests - ok) > allowed * requests:
            return "errors"
    return status


def load(directory: Path) -> dict[str, Any] | None:
    record = store.read_json(directory / "run.json")
    if not isinstance(record, dict):
        return None
    shown = effective_status(record)
    if shown != record.get("status"):
        record["status_recorded"], record["status"] = record.get("status"), shown
    if record.get("status") == "running" and record.get("host") == socket.gethostname():
        pid = record.get("pid")
        if isinstance(pid, int) and not pid_alive(pid):  # another user's process counts: never rewrite a live run
            record["status"] = "interrupted"
            record["error"] = record.get("error") or f"the benchmark process (pid {pid}) ended without finishing"
    record["_dir"] = str(directory)
    return record


def repair(directory: Path) -> dict[str, Any] | None:
    """Rewrite a dead run's record as interrupted (keeping what it had), so it stays that way."""
    record = load(directory)
    if record is not None and record.get("status") == "interrupted":
        on_disk = store.read_json(directory / "run.json")
        if isinstance(on_disk, dict) and on_disk.get("status") == "running":
            # killed without a chance to say so (SIGKILL, a crash): the run failed, it was not a Ctrl-C
            on_disk.update({"status": "interrupted", "error": record.get("error"),
                            "exit_code": ExitCode.FAILED})
            save(directory, on_disk)
    return record


def requests(directory: Path) -> list[dict[str, Any]]:
    return store.read_jsonl(directory / REQUESTS)


def list_runs(suite: str | None = None) -> list[dict[str, Any]]:
    root = runs_root()
    suites = [root / suite] if suite else (sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else [])
    out = []
    for s in suites:
        if not s.is_dir():
            continue
        for d in s.iterdir():
            if d.is_dir() and (d / "run.json").is_file():
                record = load(d)
                if record is not None:
                    out.append(record)
    out.sort(key=lambda r: (str(r.get("started_at", "")), str(r.get("run_id", ""))), reverse=True)
    return out


def find(run: str) -> Path:
    """A run by id (or a unique prefix / suffix of it), in any suite."""
    root = runs_root()
    hits = sorted(p for p in root.glob("*/*") if p.is_dir() and (p.name == run or p.name.startswith(run)
                                                                 or p.name.endswith(run))) if root.is_dir() else []
    exact = [p for p in hits if p.name == run]
    if exact:
        return exact[0]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise NotFound(f"no benchmark run {run!r} under {paths.display(root)}", "`metralectl bench history` lists runs")
    raise NotFound(f"{run!r} matches {len(hits)} runs: {', '.join(p.name for p in hits[:5])}", "give more of the id")


def export_runs_csv(runs: list[dict[str, Any]]) -> str:
    """One row per run: identity columns, then every headline metric seen in any of them."""
    metrics: list[str] = []
    for r in runs:
        for key in ((r.get("summary") or {}).get("headline") or {}):
            if key not in metrics:
                metrics.append(key)
    base = ["run_id", "suite", "status", "verdict", "started_at", "url", "model", "recipe", "engine", "engine_source",
            "hardware_class", "client_bound", "source", "metralectl_version"]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(base + metrics)
    for r in runs:
        target = r.get("target") or {}
        engine = target.get("engine")
        engine = engine if isinstance(engine, dict) else {}  # absent: a record from before engines were named
        headline = (r.get("summary") or {}).get("headline") or {}
        writer.writerow([r.get("run_id"), r.get("suite"), r.get("status"), r.get("verdict"), r.get("started_at"),
                         target.get("url"), target.get("model"), target.get("recipe"), engine.get("name"),
                         engine.get("source"), target.get("hardware_class"),
                         (r.get("client") or {}).get("client_bound"), r.get("source"), r.get("metralectl_version")]
                        + [headline.get(m) for m in metrics])
    return buf.getvalue()


def export_requests_csv(lines: list[dict[str, Any]]) -> str:
    cols = ["stage", "index", "worker", "phase", "tag", "ok", "status", "error_kind", "error", "response_id", "model",
            "t_send_us", "t_sched_us", "ttft_ms", "ttft_content_ms", "tpot_ms", "e2e_ms", "decode_tok_s",
            "output_tokens", "asked_tokens", "reasoning_tokens", "prompt_tokens", "expected_prompt_tokens",
            "count_method", "finish_reason", "done", "end", "events", "retried", "retry_ms"]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(cols)
    for line in lines:
        writer.writerow([line.get(c) for c in cols])
    return buf.getvalue()
