"""`metralectl bench versus RECIPE_A RECIPE_B [SUITE]`: one suite on two recipes, one after the other on this box,
and whether each difference is beyond run-to-run noise (docs/bench.md, "One model, two engines").

The lifecycle is the one `run`, `swap` and `stop` use (app.serving.Serving): A is served by a run (or a swap when
something else serves), B by a swap (a rollback is a failed comparison), and what served before is put back at the
end — swapped back to, or stopped when nothing served — also after a failure or Ctrl-C, and said either way.
Each repeat is a whole `bench run` (its record kept and signed); the comparison is a record of its own that names
them by id and digest, signed the same way.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import typer

from metralectl.errors import ExitCode, MetralError
from metralectl.cli.state import note, style


class VersusFailed(MetralError):
    """A side could not be measured cleanly: no table over a failure."""

    exit_code = ExitCode.FAILED


def versus(recipe_a: str, recipe_b: str, suite: str, repeats: int, param: list[str], as_json: bool,
           plot: Path | None, progress: Any, recipe_of: Any) -> None:
    """`bench versus` (its options: cli/bench_cmds.py). `progress`: the runner's stderr view; `recipe_of`: a
    recipe name -> the Recipe whose validated numbers a run records (both `bench run`'s own)."""
    from metralectl.app.serving import Change, Serving
    from metralectl.bench.params import parse_params
    from metralectl.bench.suites import get_suite
    from metralectl.cli.catalog_cmds import _catalog
    from metralectl.errors import UsageError
    from metralectl.seams.process import sigterm_as_interrupt

    s = get_suite(suite)
    params = parse_params(s.id, s.schema, param or [])
    if recipe_a == recipe_b:
        raise UsageError(f"{recipe_a} against itself: give two recipes", "metralectl bench versus RECIPE_A RECIPE_B")
    if plot is not None and not plot.parent.is_dir():
        raise UsageError(f"--plot {plot}: no directory {plot.parent}", "give a path in an existing directory")
    serving = Serving(catalog=_catalog, lock_note="(bench versus)")
    for name in (recipe_a, recipe_b):  # an unknown recipe is refused before anything is started
        serving.resolve(Change.run(name))
    with sigterm_as_interrupt():
        doc = _compare(serving, s.id, params, recipe_a, recipe_b, repeats, progress, recipe_of)
    _emit(doc, as_json, plot)


def _served() -> dict[str, Any] | None:
    from metralectl.bench.target import managed_container

    return managed_container(None)


def _one_at_most() -> None:
    """versus swaps the one served model between its two sides: with several served side by side, which one?"""
    from metralectl.app.chat import served_endpoints
    from metralectl.errors import UsageError

    try:
        served = sorted({name for name, _ in served_endpoints()})
    except MetralError:
        return  # nothing can be known of what serves: the run's own steps say so
    if len(served) > 1:
        raise UsageError(f"{len(served)} models are served ({', '.join(served)}); `bench versus` swaps the one served "
                         "model between its two sides", "`metralectl stop RECIPE` the others first (`metralectl ps`)")


def _compare(serving: Any, suite: str, params: dict[str, Any], recipe_a: str, recipe_b: str,
             repeats: int, progress: Any, recipe_of: Any) -> dict[str, Any]:
    from metralectl.bench import versus as V

    _one_at_most()
    before = _served()
    before_recipe = (before or {}).get("recipe")
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    sides: dict[str, dict[str, Any]] = {}
    restored = ""
    try:
        try:
            for label, recipe in (("a", recipe_a), ("b", recipe_b)):
                _serve(serving, recipe, first=label == "a", before=before_recipe)
                sides[label] = {"recipe": recipe, "records": [], "runs": [], "memory": []}
                _measure(suite, params, recipe, repeats, label.upper(), progress, recipe_of, sides[label])
                failed = [r for r in sides[label]["records"] if r.get("status") != "completed"]
                if failed:
                    r = failed[0]
                    kinds = ", ".join(f"{k.get('kind')} ×{k.get('count')}" for k in r.get("errors") or [])
                    raise VersusFailed(f"side {label.upper()} ({recipe}): run {r.get('run_id')} {r.get('status')}: "
                                       f"{r.get('error') or kinds or 'failed requests'}")
        finally:
            restored = _restore(serving, before_recipe)
    except MetralError as exc:  # no table over a failure: the record says FAILED (or interrupted), and why
        interrupted = exc.exit_code == ExitCode.INTERRUPTED
        doc = _document(suite, params, repeats, started, sides, restored, exc.message, recipe_a, recipe_b)
        doc["status"], doc["exit_code"] = ("interrupted" if interrupted else "failed"), int(exc.exit_code)
        _keep(doc)
        note(style(f"metralectl: bench versus {'interrupted' if interrupted else 'FAILED'}: {exc.message}", "31",
                   sys.stderr))
        return doc
    except KeyboardInterrupt:  # outside any run or swap (they turn it into their own error): restored above
        note(style(f"metralectl: bench versus interrupted; {restored}", "31", sys.stderr))
        raise
    doc = _document(suite, params, repeats, started, sides, restored, None, recipe_a, recipe_b)
    doc["rows"] = V.rows(sides["a"]["records"], sides["b"]["records"], sides["a"]["memory"], sides["b"]["memory"])
    _keep(doc)
    return doc


def _serve(serving: Any, recipe: str, *, first: bool, before: str | None) -> None:
    """A: run (nothing serves), swap (another recipe serves) or as it is (A serves already). B: a swap."""
    from metralectl.app.serving import Change
    from metralectl.cli.serve_cmds import _Progress as LifecycleProgress
    from metralectl.lifecycle.swap import SwapDegraded, SwapRolledBack

    progress = LifecycleProgress(False)
    if first and before == recipe:
        note(style(f"▸ {recipe} serves already: measured as it is", "2", sys.stderr))
        return
    if first and before is None:
        note(style(f"▸ serving {recipe} (A)", "36", sys.stderr))
        serving.run(Change.run(recipe), progress)
        return
    note(style(f"▸ swapping to {recipe} ({'A' if first else 'B'})", "36", sys.stderr))
    try:
        result = serving.swap(Change.swap(recipe), progress)
    except SwapRolledBack as exc:
        raise VersusFailed(f"the swap to {recipe} rolled back: {exc.message}") from None
    except SwapDegraded as exc:
        raise VersusFailed(f"the swap to {recipe} left nothing serving: {exc.message}") from None
    if result.outcome != "swapped":
        raise VersusFailed(f"the swap to {recipe} ended {result.outcome}: {result.message}")


def _measure(suite: str, params: dict[str, Any], recipe: str, repeats: int, label: str, progress: Any,
             recipe_of: Any, into: dict[str, Any]) -> None:
    """`repeats` runs of the suite against what serves now (the recipe just served), each recorded and signed, kept
    in `into` as they finish — a run that raised (interrupted, or broken) too, so the comparison names it."""
    from metralectl.bench import records as R
    from metralectl.bench import versus as V
    from metralectl.bench.runner import RunRequest
    from metralectl.bench.runner import run as run_suite

    managed = _served()
    if not managed or managed.get("recipe") != recipe:
        raise VersusFailed(f"{recipe} should serve now, but {'nothing' if not managed else managed.get('recipe')} does")
    rec = recipe_of(recipe)
    records, refs, memory = into["records"], into["runs"], into["memory"]
    for i in range(repeats):
        note(style(f"▸ {label} {recipe}: run {i + 1} of {repeats}", "36", sys.stderr))
        root = R.runs_root() / suite
        earlier = set(root.iterdir()) if root.is_dir() else set()
        try:
            outcome = run_suite(RunRequest(suite, dict(params), str(managed["url"]), "versus", [], False, rec,
                                           managed), progress)
        except MetralError:
            for directory in sorted(set(root.iterdir()) - earlier if root.is_dir() else ()):
                partial = R.load(directory)
                if partial is not None and partial.get("pid") == os.getpid():
                    refs.append(V.reference(partial, directory))
            raise
        records.append(dict(outcome.record))
        refs.append(V.reference(outcome.record, outcome.directory))
        memory.append(_peak_memory(str(managed.get("container") or "")))
        target: dict[str, Any] = dict(outcome.record.get("target") or {})
        into["engine"], into["model"] = (target.get("engine") or {}).get("name"), target.get("model")
        if outcome.record.get("status") != "completed":
            break  # the comparison has failed: no more load on a failing side


def _peak_memory(container: str) -> float | str:
    """The engine's peak resident memory since it started (VmHWM over its processes), or why there is none."""
    from metralectl.lifecycle.local_runtime import open_local
    from metralectl.seams.machine import peak_rss_mib

    try:
        with open_local(timeout=5.0) as runtime:
            pids = runtime.container_pids(container)
    except MetralError as exc:
        return f"unavailable: {exc.message}"
    value = peak_rss_mib(pids)
    return value if value is not None else "unavailable: the engine's processes could not be read"


def _restore(serving: Any, before: str | None) -> str:
    """Put back what served before the comparison; the sentence that says what was done (or what was not)."""
    from metralectl.app.serving import Change
    from metralectl.cli.serve_cmds import _Progress as LifecycleProgress

    now = (_served() or {}).get("recipe")
    try:
        if before is None:
            if now is None:
                return "nothing served before, and nothing serves now"
            serving.stop(Change.stop(now), LifecycleProgress(False))
            return f"nothing served before: {now} stopped"
        if now == before:
            return f"{before} served before and serves again"
        serving.swap(Change.swap(before), LifecycleProgress(False))
        return f"{before} served before: swapped back to it"
    except (MetralError, KeyboardInterrupt) as exc:
        why = exc.message if isinstance(exc, MetralError) else "interrupted"
        fix = f"`metralectl swap {before}` (or `metralectl ps --repair`)" if before else "`metralectl stop`"
        return f"NOT restored ({why}): {before or 'nothing'} served before, {now or 'nothing'} was serving; {fix}"


def _document(suite: str, params: dict[str, Any], repeats: int, started: str, sides: dict[str, dict[str, Any]],
              restored: str, error: str | None, recipe_a: str, recipe_b: str) -> dict[str, Any]:
    from metralectl.bench import records
    from metralectl.bench import versus as V

    def side(label: str, recipe: str) -> dict[str, Any]:
        got = sides.get(label) or {}
        return {"recipe": recipe, "engine": got.get("engine"), "model": got.get("model"), "runs": got.get("runs", []),
                "peak_memory_mib": got.get("memory", []),
                "memory_method": "VmHWM summed over the engine's processes, read after each run (peak since start)"}

    return {"schema": 1, "kind": V.KIND, "run_id": records.new_run_id(), "suite": V.SUITE_DIR, "compared_suite": suite,
            "status": "failed" if error else "completed", "error": error, "started_at": started,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "params": params, "repeats": repeats,
            "rule": "beyond noise = the min–max ranges over the repeats do not overlap (p_chance: the probability of "
                    "that by chance alone, 2/C(nA+nB, nA))",
            "a": side("a", recipe_a), "b": side("b", recipe_b), "rows": [], "restored": restored,
            "exit_code": int(ExitCode.FAILED if error else ExitCode.OK)}


def _keep(doc: dict[str, Any]) -> None:
    """The comparison's record, written and signed beside the runs (runs/versus/<id>/run.json)."""
    from metralectl.bench import records, signed
    from metralectl.seams import store

    directory = records.run_dir(doc["suite"], doc["run_id"])
    directory.mkdir(parents=True, exist_ok=True)
    store.write_json(directory / "run.json", doc)
    why = signed.sign_run(directory, doc)
    if why:
        note(style(f"! comparison {why}", "33", sys.stderr))


def _emit(doc: dict[str, Any], as_json: bool, plot: Path | None) -> None:
    from metralectl.present.versus_view import render_versus, svg

    if plot is not None and doc["status"] == "completed":
        plot.write_text(svg(doc), encoding="utf-8")
        note(style(f"plot: {plot}", "2", sys.stderr))
    if as_json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
    elif doc["status"] == "completed":
        print(render_versus(doc))
    note(style(f"comparison {doc['run_id']} {doc['status']} (signed; `metralectl bench show {doc['run_id']}`); "
               f"{doc['restored']}", "2" if doc["status"] == "completed" else "31", sys.stderr))
    if doc.get("exit_code"):
        raise typer.Exit(doc["exit_code"])
