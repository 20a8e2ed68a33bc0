"""`bench`: run suites against the served endpoint; history, show, compare, export.

Nothing heavy at import: the load generator, httpx and docker are imported inside the commands.
Progress goes to stderr, results to stdout (`--format json > run.json` is a clean document).
Exit codes: 0 ran and gates passed (or none applied); 1 failed, cancelled or client-bound; 2 a gate said no.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from metralectl.cli import bench_report, bench_startup, verify_cmd
from metralectl.cli.state import note, style
from metralectl.errors import ExitCode

if TYPE_CHECKING:
    from metralectl.core.recipe import Recipe

app = typer.Typer(name="bench", help="Benchmark the served endpoint; keep and compare the results.",
                  no_args_is_help=True, add_completion=False, rich_markup_mode=None)
DEFAULT_URL = "http://127.0.0.1:8888"  # bench/target.DEFAULT_URL, spelled here so the help text loads no bench code


def _dump(value: Any) -> None:
    print(json.dumps({k: v for k, v in value.items() if not k.startswith("_")} if isinstance(value, dict) else value,
                     indent=2, sort_keys=True, default=str))


def _check_format(fmt: str, as_json: bool) -> str:
    """The format asked for: --json is --format json (the spelling every other command takes)."""
    if fmt not in ("text", "json"):
        from metralectl.errors import UsageError

        raise UsageError(f"--format {fmt!r}: expected text or json")
    return "json" if as_json else fmt


JSON_HELP = "Same as --format json."


@app.command("list")
def list_(suite: str = typer.Argument(None, metavar="[SUITE]", help="Show this suite's parameters."),
          fmt: str = typer.Option("text", "--format", help="text or json."),
          as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """The suites, or one suite's parameter schema."""
    from metralectl.bench.suites import SUITES, get_suite
    from metralectl.present.table import render_table

    fmt = _check_format(fmt, as_json)
    if suite is None:
        if fmt == "json":
            _dump({"suites": [{"id": s.id, "title": s.title, "description": s.description} for s in SUITES.values()]})
            return
        print(render_table(["SUITE", "WHAT"], [[s.id, s.title] for s in SUITES.values()]))
        note("`metralectl bench list SUITE` shows its parameters; set them with --param KEY=VALUE")
        return
    s = get_suite(suite)
    if fmt == "json":
        _dump({"id": s.id, "title": s.title, "description": s.description,
               "params": [{"name": p.name, "type": p.describe_type(), "default": p.default, "help": p.help}
                          for p in s.schema]})
        return
    print(f"{s.id}: {s.title}\n{s.description}\n")
    print(render_table(["PARAM", "TYPE", "DEFAULT", "MEANING"],
                       [[p.name, p.describe_type(), ",".join(map(str, p.default)) if isinstance(p.default, list)
                         else str(p.default), p.help] for p in s.schema]))


class _Progress:
    """Runner events on stderr. A stage gets ✔ only when every measured request succeeded."""

    def __call__(self, event: Any) -> None:
        from metralectl.safetext import clean

        err = sys.stderr
        if event.kind == "stage":
            note(style(f"▸ {clean(event.message, 600)}  (workers {event.data.get('workers')})", "36", err))
        elif event.kind == "stage-done":
            a = event.data["summary"]
            counts = f"{a.get('ok')}/{a.get('requests')} ok"
            if event.data.get("ok", True):
                ttft = (a.get("ttft_ms") or {}).get("p50")
                tok = a.get("output_tok_s")
                line = f"  ✔ {counts}, {tok if tok is not None else '-'} out tok/s" + (
                    f", TTFT p50 {ttft:.1f} ms" if ttft is not None else "")
                note(style(line, "2", err))
            else:
                note(style(f"  ✘ {counts}", "31", err))
                for kind in event.data.get("errors") or []:
                    note(style(f"    {kind['kind']} ×{kind['count']}: {clean(kind['example'], 160)}", "31", err))
            if a.get("retried"):
                note(style(f"  · {a['retried']} sent again on a fresh connection: the server closed a "
                           "kept-alive connection before answering (timed from the second send; `retried` "
                           "per request)", "2", err))
            for key, label in (("aborted", ""), ("invalid", "invalid: "), ("drain_timed_out", "")):
                value = event.data.get(key)
                if value:
                    text = ("the drain timeout passed with measured requests still running (kept as failures)"
                            if key == "drain_timed_out" else f"{label}{value}")
                    note(style(f"  ! {clean(text, 600)}", "31", err))
            for reason in event.data.get("client_bound") or []:
                note(style(f"  ! client-bound: {clean(str(reason), 600)}", "33", err))
        elif event.kind == "warning":
            note(style(f"! {clean(event.message, 600)}", "33", err))
        elif event.kind == "progress":
            note(style(f"  … {clean(event.message, 600)}", "2", err))
        else:
            note(style(f"▸ {clean(event.message, 600)}", "2", err))


@app.command("run")
def run(
    suite: str = typer.Argument(..., metavar="SUITE", help="Which suite (`metralectl bench list`)."),
    param: list[str] = typer.Option(None, "--param", "-p", metavar="KEY=VALUE", help="A suite parameter."),
    url: str = typer.Option(None, "--url", help=f"Engine base URL (default: what metralectl serves, else {DEFAULT_URL})."),
    gate: list[str] = typer.Option(None, "--gate", metavar="METRIC>=N", help="A threshold on a headline metric."),
    recipe: str = typer.Option(None, "--recipe", help="Gate against this recipe's validated numbers."),
    self_start: str = typer.Option(None, "--self-start", metavar="RECIPE", help="Serve RECIPE first, tear it down after."),
    fail_on_verdict: bool = typer.Option(True, "--fail-on-verdict/--no-fail-on-verdict", help="Exit 2 when a gate fails."),
    fmt: str = typer.Option("text", "--format", help="text or json (the whole record)."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    header: list[str] = typer.Option(None, "--header", metavar="NAME:VALUE", help="Extra request header (auth)."),
    source: str = typer.Option("cli", "--source", hidden=True),
    unit: str = typer.Option(None, "--unit", hidden=True, help="JSON: the peer's remote unit this run is for."),
    events_fd: int = typer.Option(None, "--events-fd", hidden=True, help="Also write events as JSON lines to this fd."),
) -> None:
    """Run a suite against the endpoint and record it under $METRALE_HOME/runs/SUITE/."""
    from metralectl.bench.gates import parse_gate
    from metralectl.bench.params import parse_params
    from metralectl.bench.runner import RunRequest
    from metralectl.bench.runner import run as run_suite
    from metralectl.bench.suites import get_suite
    from metralectl.errors import UsageError

    fmt = _check_format(fmt, as_json)
    s = get_suite(suite)
    params = parse_params(s.id, s.schema, param or [])
    gates = [parse_gate(g) for g in gate or []]
    from metralectl.bench.transport import header_problem
    from metralectl.safetext import clean

    headers = {}
    for h in header or []:
        name, sep, value = h.partition(":")
        if not sep:
            raise UsageError(f"--header {clean(h, 80)!r}: expected NAME:VALUE")
        why = header_problem(name.strip(), value.strip(" \t"))
        if why is not None:  # a CR/LF would start a header (or the body) of its own
            raise UsageError(f"--header {clean(h, 80)!r}: {clean(why)}", "one header per --header, NAME:VALUE in ASCII")
        headers[name.strip()] = value.strip(" \t")
    unit_label = _unit_label(unit)
    progress: Any = _Progress() if events_fd is None else _EventsPipe(events_fd, _Progress())
    from metralectl.seams.process import sigterm_as_interrupt

    with sigterm_as_interrupt():  # a SIGTERM ends the run as Ctrl-C does: recorded as interrupted
        if self_start:
            from metralectl.cli.bench_selfstart import served

            with served(self_start, progress) as (endpoint, managed, rec):
                request = RunRequest(s.id, params, endpoint, source, gates, fail_on_verdict, rec, managed,
                                     {"recipe": self_start, "url": endpoint}, headers, unit=unit_label)
                record = run_suite(request, progress).record
        else:
            from metralectl.bench.target import endpoint_to_measure

            endpoint, found = endpoint_to_measure(url)
            rec = _recipe(recipe or (found or {}).get("recipe"), explicit=recipe is not None)
            record = run_suite(RunRequest(s.id, params, endpoint, source, gates, fail_on_verdict, rec, found,
                                          headers=headers, unit=unit_label), progress).record
    _emit(record, fmt)


def _unit_label(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    from metralectl.errors import UsageError

    try:
        label = json.loads(text)
    except ValueError:
        label = None
    if not isinstance(label, dict) or not isinstance(label.get("key"), str):
        raise UsageError("--unit: expected a JSON object with a key")
    return label


class _EventsPipe:
    """Runner events as JSON lines on an inherited fd (the agent's unit runner reads them), and on stderr."""

    def __init__(self, fd: int, also: Any) -> None:
        import os

        self._out = os.fdopen(fd, "w", buffering=1)
        self._also = also

    def __call__(self, event: Any) -> None:
        try:
            self._out.write(json.dumps({"kind": event.kind, "message": event.message, "data": event.data},
                                       default=str) + "\n")
        except (OSError, ValueError):
            pass  # the reader went away; the record on disk still tells the whole story
        self._also(event)


def _recipe(name: str | None, *, explicit: bool) -> Recipe | None:
    if not name:
        return None
    from metralectl.cli.catalog_cmds import _catalog
    from metralectl.errors import MetralError

    try:
        return _catalog().recipe(name)
    except MetralError:
        if explicit:
            raise
        return None  # a served recipe this catalog no longer has: no recipe gate


def _emit(record: Mapping[str, Any], fmt: str) -> None:
    from metralectl.present.bench_view import render_run

    if fmt == "json":
        _dump(record)
    else:
        print(render_run(record))
    _say_failure(record)
    code = ExitCode.of(record.get("exit_code") or ExitCode.OK)
    if code is not ExitCode.OK:
        raise typer.Exit(code)


def _say_failure(record: Mapping[str, Any]) -> None:
    """A run that did not complete says so on stderr: its status, why, and its failed requests by kind."""
    from metralectl.bench.outcome import FAILED_STATUSES
    from metralectl.safetext import clean

    status = record.get("status")
    if status not in FAILED_STATUSES:
        return
    note(style(f"metralectl: benchmark {status}: {clean(str(record.get('error') or ''), 400)}", "31", sys.stderr))
    for kind in (record.get("errors") or [])[:5]:
        note(style(f"  {kind['kind']} ×{kind['count']} (e.g. {clean(str(kind.get('example') or ''), 200)})", "31",
                   sys.stderr))


@app.command("history")
def history(
    suite: str = typer.Option(None, "--id", help="Only this suite."),
    limit: int = typer.Option(20, "--limit", min=1, help="Most recent N runs."),
    run_id: str = typer.Option(None, "--run", help="One run (the whole record)."),
    fmt: str = typer.Option("text", "--format", help="text or json."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Recorded runs, newest first (a run whose process died shows as interrupted)."""
    from metralectl.bench import records
    from metralectl.present.bench_view import history_table, render_run

    fmt = _check_format(fmt, as_json)
    if run_id:
        record = records.repair(records.find(run_id))
        if fmt == "json":
            _dump(record)
        else:
            print(render_run(record or {}))
        return
    runs = records.list_runs(suite)[:limit]
    if fmt == "json":
        _dump([{k: v for k, v in r.items() if not k.startswith("_")} for r in runs])
        return
    if runs:
        print(history_table(runs))
    else:
        note("no benchmark runs recorded yet (`metralectl bench run decode`)")


@app.command("show")
def show(run_id: str = typer.Argument(..., metavar="RUN"),
         fmt: str = typer.Option("text", "--format", help="text or json."),
         as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
         requests: bool = typer.Option(False, "--requests", help="With --format json / --json: include per-request timings.")) -> None:
    """One run: target, stages, headline, gates."""
    from metralectl.bench import records
    from metralectl.present.bench_view import render_run

    fmt = _check_format(fmt, as_json)
    directory = records.find(run_id)
    record = records.repair(directory) or {}
    from metralectl.bench.versus import KIND as VERSUS_KIND

    if record.get("kind") == VERSUS_KIND:  # a comparison, not a run
        from metralectl.present.versus_view import render_versus

        print(json.dumps({k: v for k, v in record.items() if not k.startswith("_")}, indent=2, sort_keys=True,
                         default=str) if fmt == "json" else render_versus(record))
        return
    if fmt == "json":
        if requests:
            record["requests"] = records.requests(directory)
        _dump(record)
    else:
        print(render_run(record))


# The same command as the top-level `metralectl verify` (one verifier for both names).
app.command("verify")(verify_cmd.verify)


@app.command("compare")
def compare(a: str = typer.Argument(..., metavar="RUN_A"), b: str = typer.Argument(..., metavar="RUN_B"),
            fmt: str = typer.Option("text", "--format", help="text or json."),
            as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Two runs side by side with deltas (B relative to A)."""
    from metralectl.bench import records
    from metralectl.present.bench_view import compare_rows, render_compare

    fmt = _check_format(fmt, as_json)
    ra, rb = records.load(records.find(a)) or {}, records.load(records.find(b)) or {}
    if fmt == "json":
        _dump({"a": ra.get("run_id"), "b": rb.get("run_id"),
               "metrics": [{"metric": k, "a": va, "b": vb, "delta": d, "relative": rel}
                           for k, va, vb, d, rel in compare_rows(ra, rb)]})
        return
    print(render_compare(ra, rb))


@app.command("versus")
def versus(
    recipe_a: str = typer.Argument(..., metavar="RECIPE_A", help="Served and measured first."),
    recipe_b: str = typer.Argument(..., metavar="RECIPE_B", help="Swapped to and measured second."),
    suite: str = typer.Argument("decode", metavar="[SUITE]", help="Which suite (default decode)."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Runs of the suite per recipe (the spread)."),
    param: list[str] = typer.Option(None, "--param", "-p", metavar="KEY=VALUE", help="A suite parameter (both sides)."),
    as_json: bool = typer.Option(False, "--json", help="The comparison as JSON on stdout."),
    plot: Path = typer.Option(None, "--plot", metavar="PATH", help="Also draw the comparison as an SVG file."),
) -> None:
    """Serve A, benchmark it, swap to B, benchmark it with the same prompts and seeds, put back what served
    before, and show both side by side with the spread over repeats and whether each difference is beyond noise."""
    from metralectl.cli.bench_versus import versus as compare

    compare(recipe_a, recipe_b, suite, repeats, param or [], as_json, plot, _Progress(),
            lambda name: _recipe(name, explicit=False))


@app.command("export")
def export(csv_: bool = typer.Option(False, "--csv", help="CSV on stdout (the only format for now)."),
           suite: str = typer.Option(None, "--id", help="Only this suite."),
           run_id: str = typer.Option(None, "--run", help="One run's per-request timings instead of one row per run."),
           limit: int = typer.Option(1000, "--limit", min=1)) -> None:
    """Export runs (one row each, headline metrics as columns) or one run's requests as CSV."""
    from metralectl.bench import records
    from metralectl.errors import UsageError

    if not csv_:
        raise UsageError("bench export needs --csv", "metralectl bench export --csv > runs.csv")
    if run_id:
        sys.stdout.write(records.export_requests_csv(records.requests(records.find(run_id))))
        return
    sys.stdout.write(records.export_runs_csv(records.list_runs(suite)[:limit]))


app.command("report")(bench_report.report)
app.command("startup")(bench_startup.startup)


def register(root: typer.Typer) -> None:
    from metralectl.cli import campaign_cmd
    campaign_cmd.register(app)
    root.add_typer(app, name="bench")
