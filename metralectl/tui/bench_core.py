"""The Benchmarks view over metralectl.bench: the suites' schemas as forms, runs through the same
runner as `metralectl bench run` (recorded with source "tui"), History from the same records
(bench_adapter reads them)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from metralectl.errors import MetralError
from metralectl.tui.bench_adapter import read_detail, read_history, summary_of
from metralectl.tui.services import BenchProgress, ParamSpec, RunDetail, RunSummary, SuiteInfo

if TYPE_CHECKING:
    from metralectl.cancel import CancelToken

KINDS = {"ints": "int-list", "floats": "float-list"}


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


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
        from metralectl.bench.target import endpoint_to_measure
        from metralectl.cancel import Cancelled

        total = len(get_suite(suite).stages(params))
        url, found = endpoint_to_measure(None)
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
        return read_history(limit)

    def detail(self, run: RunSummary) -> RunDetail:
        return read_detail(run)
