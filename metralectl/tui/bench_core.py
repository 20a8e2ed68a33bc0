"""The Benchmarks view over metralectl.bench: the suites' schemas as forms, runs through the same
runner as `metralectl bench run` (recorded with source "tui"), History from the same records."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from metralectl.errors import MetralError
from metralectl.tui.bench_adapter import read_detail
from metralectl.tui.services import BenchProgress, ParamSpec, RunDetail, RunSummary, SuiteInfo

if TYPE_CHECKING:
    from metralectl.tui.cancel import CancelToken

KINDS = {"ints": "int-list", "floats": "float-list"}
HEADLINE_KEYS = ("decode_tok_s_p50", "prefix_speedup", "well_formed_frac")
DEFAULT_URL = "http://127.0.0.1:8888"


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def headline(record: dict[str, Any]) -> str:
    """The one number of a run, chosen as `bench history` chooses it."""
    from metralectl.present.bench_view import fmt

    values = (record.get("summary") or {}).get("headline") or {}
    key = next((k for k in HEADLINE_KEYS if k in values), None)
    if key is None:
        key = next((k for k in values if k.endswith(("output_tok_s", "goodput_rps"))), None)
    return f"{key}={fmt(values.get(key), 2)}" if key else "-"


def summary_of(record: dict[str, Any]) -> RunSummary:
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
    return RunSummary(str(record.get("run_id")), str(record.get("suite")), when, str(record.get("source") or "?"),
                      str(target.get("recipe") or target.get("model") or target.get("url") or "-"), outcome,
                      headline(record), f"{directory}/run.json" if directory else "")


def _why(exc: MetralError) -> str:
    """'--param x=0: 0 is below the minimum 1 (suite decode)' -> '0 is below the minimum 1'."""
    text = exc.message.split(": ", 1)[-1]
    return re.sub(r" \(suite [^)]*\)$", "", text)


class CoreBench:
    """Runs go to the endpoint metralectl serves (the same lookup as `bench run` without --url)."""

    unavailable: str | None = None

    def suites(self) -> list[SuiteInfo]:
        from metralectl.bench.suites import SUITES

        return [SuiteInfo(s.id, s.title, s.description, tuple(
            ParamSpec(p.name, KINDS.get(p.kind, "choice" if p.choices else p.kind), p.default, p.help, p.choices,
                      p.minimum, p.maximum) for p in s.schema)) for s in SUITES.values()]

    def check_params(self, suite: str, values: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
        from metralectl.bench.suites import get_suite

        params: dict[str, Any] = {}
        errors: dict[str, str] = {}
        for p in get_suite(suite).schema:
            text = values.get(p.name)
            if text is None or text.strip() == _text(p.default):
                params[p.name] = p.default
                continue
            try:
                params[p.name] = p.parse(text, suite)
            except MetralError as exc:
                errors[p.name] = _why(exc)
        return params, errors

    def run(self, suite: str, params: dict[str, Any], on_event: Callable[[BenchProgress], None],
            cancel: CancelToken) -> RunSummary:
        from metralectl.bench.runner import RunInterrupted, RunRequest
        from metralectl.bench.runner import run as run_suite
        from metralectl.bench.suites import get_suite
        from metralectl.bench.target import managed_container
        from metralectl.tui.cancel import Cancelled

        total = len(get_suite(suite).stages(params))
        found = managed_container(None)
        url = (found or {}).get("url") or DEFAULT_URL
        recipe = None
        if found and found.get("recipe"):
            try:
                from metralectl.core.catalog import load_catalog

                recipe = load_catalog().recipe(str(found["recipe"]))
            except MetralError:
                recipe = None  # a served recipe this catalog no longer has: no recipe gate
        done = [0]

        def relay(event: Any) -> None:
            cancel.check()
            if event.kind == "stage-done":
                done[0] += 1
            on_event(BenchProgress(done[0], total, f"{event.message}" if event.kind != "stage-done"
                                   else f"{event.message} done ({done[0]}/{total})"))

        request = RunRequest(suite, params, url, "tui", recipe=recipe, managed=found)
        try:
            done_run = run_suite(request, relay)
        except RunInterrupted:
            if cancel.cancelled:  # ours: report it as a cancel
                raise Cancelled() from None
            raise
        from metralectl.bench import records

        # read back as History reads it, so the new row and the History row are the same
        return summary_of(records.load(done_run.directory) or dict(done_run.record))

    def history(self, limit: int = 200) -> list[RunSummary]:
        from metralectl.bench import records
        return [summary_of(r) for r in records.list_runs()[:limit]]

    def detail(self, run: RunSummary) -> RunDetail:
        from metralectl.bench import records
        from metralectl.present.bench_view import fmt

        record = records.repair(records.find(run.run_id)) or {}
        if not record:
            return read_detail(run)
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
        notes = [f"{k} = {fmt(v, 2)}" for k, v in ((record.get("summary") or {}).get("headline") or {}).items()]
        notes += [f"gate {g.get('metric')} {g.get('op')} {g.get('threshold')}: "
                  f"{ {True: 'PASS', False: 'FAIL', None: 'n/a'}[g.get('passed')] }" for g in record.get("gates") or []]
        if record.get("error"):
            notes.append(f"error: {record['error']}")
        params = {k: v for k, v in (record.get("params") or {}).items()}
        return RunDetail(summary_of(record), params, columns, tuple(rows), tuple(notes))
