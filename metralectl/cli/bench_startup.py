"""`metralectl bench startup RECIPE [--repeats N]`: how long from `run` to ready and to the first token of a first
request, split by phase (bench/startup.py says which), N times with a stop between, recorded and signed as a run
of the suite `startup` under $METRALE_HOME/runs/startup/<id>/ (docs/bench.md, "Startup").

The lifecycle is the one `run` and `stop` use (app.serving.Serving). It measures a cold start of the recipe, so
it refuses when anything is served already (stop it first: a warm `run` of what serves starts nothing), and it
stops what it started also after a failure or Ctrl-C.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

import typer

from metralectl.cli.state import note, style
from metralectl.errors import ExitCode, MetralError

PROMPT = "What is the capital of France?"


def startup(
    recipe: str = typer.Argument(..., metavar="RECIPE", help="The recipe to start (nothing may be served)."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Cold starts, each stopped before the next."),
    max_tokens: int = typer.Option(16, "--max-tokens", min=1, help="Output tokens of the first request."),
    timeout_s: float = typer.Option(300.0, "--request-timeout", min=1, help="The first request's timeout (s)."),
    as_json: bool = typer.Option(False, "--json", help="The record as JSON on stdout."),
) -> None:
    """Time `run` RECIPE to ready and to its first token, split by phase (preflight, pull, create, load, warm-up),
    REPEATS times with a stop between; recorded and signed as a benchmark run (suite startup)."""
    from metralectl import __version__
    from metralectl.app.serving import Change, Serving
    from metralectl.bench import records, signed
    from metralectl.bench import startup as S
    from metralectl.bench.target import managed_container
    from metralectl.cli.catalog_cmds import _catalog
    from metralectl.cli.serve_cmds import _Progress as LifecycleProgress
    from metralectl.lifecycle.events import to_json
    from metralectl.seams.process import sigterm_as_interrupt

    serving = Serving(catalog=_catalog, lock_note="(bench startup)")
    rec = serving.resolve(Change.run(recipe))
    served = managed_container(None)
    if served:
        raise MetralError(f"{served.get('recipe') or served.get('container')} is served now: a startup benchmark "
                          "times a cold start", "`metralectl stop` first", exit_code=ExitCode.BUSY)
    run_id = records.new_run_id()
    record: dict[str, Any] = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "finished_at": None, "source": "cli",
        "metralectl_version": __version__,
        "params": {"recipe": rec.name, "repeats": repeats, "max_tokens": max_tokens, "prompt": PROMPT},
        "target": {"url": None, "model": None, "recipe": rec.name, "runtime": rec.runtime,
                   "engine": {"name": rec.engine, "source": "recipe", "evidence": f"recipe {rec.name}",
                              "detected": None, "revision": None, "version": None}},
        "phases": list(S.PHASES), "stages": [], "summary": {"headline": {}}, "errors": [], "error": None,
        "verdict": "none", "gates": [], "exit_code": None}
    directory = records.start(S.SUITE, run_id, record)
    record = {**record, **records.header(S.SUITE, run_id)}
    lifecycle = LifecycleProgress(False)
    started_by_us = False
    try:
        with sigterm_as_interrupt():
            for i in range(repeats):
                note(style(f"▸ startup {i + 1} of {repeats}: run {rec.name}", "36", sys.stderr))
                timeline = S.Timeline()
                t0 = time.perf_counter_ns()

                def listen(event: Any, timeline: S.Timeline = timeline, t0: int = t0) -> None:
                    timeline.add((time.perf_counter_ns() - t0) / 1e9, to_json(event))
                    lifecycle(event)

                t0_unix = time.time_ns()
                launched = serving.run(Change.run(rec.name), listen)
                started_by_us = True
                result = S.first_request(launched.url, launched.model or rec.name, PROMPT, max_tokens, timeout_s)
                first = (result.token_ns[0] - t0) / 1e9 if result.ok and result.token_ns else None
                split = S.phases(timeline, first)
                _stop(serving, rec.name, lifecycle)
                started_by_us = False
                name = f"start {i + 1}"
                line = {"stage": name, **result.to_record(t0)}
                records.append_requests(directory, [line])
                record["target"].update({"url": launched.url, "model": launched.model})
                record["stages"].append({
                    "name": name, "labels": {"repeat": i + 1}, "load": {}, "workers": 1,
                    "summary": {"requests": 1, "ok": int(result.ok), "errors": int(not result.ok),
                                "ttft_ms": {"p50": result.ttft_ms}, **split,
                                "events": [[round(t, 4), e.get("kind"), e.get("name") or e.get("phase")]
                                           for t, e in timeline.events if e.get("kind") != "LogLine"]},
                    "client_health": {}, "client_bound": [], "energy": "not measured", "cancelled": False,
                    "t0_unix_ns": t0_unix, "model": result.model, "aborted": None, "drain_timed_out": False,
                    "invalid": None, "ok": bool(result.ok and not split["missing"] and split["ordered"])})
                records.save(directory, record)
                _say(i, split, result)
                if not result.ok:
                    raise MetralError(f"the first request after start {i + 1} failed: {result.error}")
        record["status"], record["exit_code"] = "completed", int(ExitCode.OK)
    except (MetralError, KeyboardInterrupt) as exc:
        interrupted = isinstance(exc, KeyboardInterrupt) or getattr(exc, "exit_code", None) == ExitCode.INTERRUPTED
        record["status"] = "interrupted" if interrupted else "failed"
        record["error"] = "interrupted" if isinstance(exc, KeyboardInterrupt) else exc.message
        record["exit_code"] = int(ExitCode.INTERRUPTED if interrupted else ExitCode.FAILED)
        if started_by_us:
            _stop(serving, rec.name, lifecycle)
    record["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    record["summary"] = {"headline": S.headline([s["summary"] for s in record["stages"]])}
    record["pid"], record["host"] = os.getpid(), socket.gethostname()
    records.save(directory, record)
    why = signed.sign_run(directory, record)
    if why:
        note(style(f"! {why}", "33", sys.stderr))
    if as_json:
        print(json.dumps(record, indent=2, sort_keys=True, default=str))
    else:
        _table(record)
    note(style(f"run {run_id} {record['status']} (signed; `metralectl bench report {run_id}`)", "2", sys.stderr))
    if record["exit_code"]:
        raise typer.Exit(record["exit_code"])


def _stop(serving: Any, recipe: str, lifecycle: Any) -> None:
    from metralectl.app.serving import Change

    serving.stop(Change.stop(recipe), lifecycle)


def _say(i: int, split: dict[str, Any], result: Any) -> None:
    parts = ", ".join(f"{k} {v:.2f} s" for k, v in split["phases"].items() if v is not None)
    ttft = split.get("time_to_first_token_s")
    note(style(f"  ✔ start {i + 1}: first token {ttft:.2f} s after run ({parts})" if result.ok and ttft is not None
               else f"  ✘ start {i + 1}: {result.error}", "2" if result.ok else "31", sys.stderr))


def _table(record: dict[str, Any]) -> None:
    from metralectl.bench.startup import PHASES
    from metralectl.present.table import render_table

    rows = []
    for stage in record.get("stages") or []:
        s = stage["summary"]
        rows.append([stage["name"], *(_s(s["phases"].get(p)) for p in PHASES), _s(s.get("time_to_ready_s")),
                     _s(s.get("time_to_first_token_s"))])
    head = ["START", *(p.upper() for p in PHASES), "READY", "FIRST TOKEN"]
    print(render_table(head, rows, right=tuple(range(1, len(head)))))


def _s(value: Any) -> str:
    return "–" if not isinstance(value, (int, float)) else f"{value:.2f} s"
