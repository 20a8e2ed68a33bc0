"""`metralectl recipes check [PATH...]`: the recipe checker on files (or on every known recipe)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from metralectl.cli.state import note, style
from metralectl.errors import ExitCode, Problem
from metralectl.wording import count

app = typer.Typer(help="Check and inspect recipe files.", no_args_is_help=True, rich_markup_mode=None)


@app.command("check")
def check(
    files: list[Path] = typer.Argument(None, metavar="[PATH]...", help="Recipe files (default: every shipped and user recipe)."),
    as_json: bool = typer.Option(False, "--json", help="Print the findings as JSON."),
) -> None:
    """Check recipes; exit 1 if any is refused. Problems name file:line:column, key, why and the fix."""
    import sys

    from metralectl.core.catalog import check_files, load_catalog
    from metralectl.safetext import clean, printable

    catalog = load_catalog()
    results: list[tuple[str, bool, list[Problem]]] = []
    if files:
        for target in files:
            batch = sorted(q for q in target.iterdir() if q.suffix in (".yaml", ".yml")) if target.is_dir() else [target]
            results += [(name, recipe is not None, problems) for name, recipe, problems in check_files(catalog, batch)]
    else:
        results += [(r.origin.path, True, []) for r in catalog.recipes.values()]
        results += [(r.path, False, r.problems) for r in catalog.refused]
    refused = [r for r in results if not r[1]]
    if as_json:
        print(json.dumps([{"file": f, "ok": ok, "problems": [p.__dict__ for p in probs]} for f, ok, probs in results],
                         indent=2))
    else:
        for path, ok, problems in results:
            for problem in problems:
                color = "31" if problem.severity == "error" else "33"
                note(style(printable(problem.render()), color, sys.stderr))  # it may quote the file
            print(f"{'ok     ' if ok else 'REFUSED'}  {clean(str(path))}")
        note(f"{len(results) - len(refused)} ok, {len(refused)} refused")
    if refused:
        raise typer.Exit(ExitCode.DATA)


@app.command("sync")
def sync(
    source: str = typer.Option(None, "--from", metavar="URL|DIR",
                               help="An engine release's download base (http/https) or a directory with its assets "
                                    "(default: $METRALECTL_RECIPES_URL, else <config>/recipes-sync-source, else "
                                    "engine release b34)."),
    as_json: bool = typer.Option(False, "--json", help="Print what changed as JSON."),
    allow_http: bool = typer.Option(False, "--allow-http",
                                    help="Allow plain http to a host other than this machine (https is the rule)."),
    skip_refused: bool = typer.Option(False, "--skip-refused",
                                      help="Install the release without the recipes it refuses (still exits 65)."),
) -> None:
    """Fetch an engine release's recipes, verify every sha256, convert them, and install them as one set.

    All or nothing: a failed or interrupted sync, or one refused recipe, changes nothing (each refusal is
    listed with file:line; exit 65). --skip-refused installs the others and still exits 65.
    """
    import sys

    from metralectl.app import recipe_sync

    from metralectl.seams import sync_fetch
    from metralectl.core.catalog import load_catalog
    from metralectl.safetext import clean

    where = "--from"
    if source is None:
        source, where = sync_fetch.default_source()
    note(f"syncing engine recipes from {clean(source)} ({clean(where)})")
    last: dict[str, float] = {}

    def progress(asset: str, done: int, total: int | None) -> None:
        import time

        now = time.monotonic()
        if now - last.get(asset, 0.0) >= 1.0 or done == total:  # at most once a second per file
            last[asset] = now
            note(f"  {clean(asset)}: {done / 1e6:.1f}" + (f" of {total / 1e6:.1f} MB" if total else " MB"))

    catalog = load_catalog(use_cache=False)
    try:
        report = recipe_sync.sync(catalog, sync_fetch.Source(source, allow_http=allow_http), progress=progress,
                                  skip_refused=skip_refused)
    except recipe_sync.RecipesRefused as exc:
        _show_sync(exc.report, as_json)
        raise  # the boundary says what it means: nothing installed, exit 65
    _show_sync(report, as_json)
    counts = ", ".join(f"{report.count(s)} {s}" for s in ("added", "changed", "removed", "unchanged", "refused"))
    if report.refused:  # --skip-refused: installed without them, said loudly
        note(style(f"synced set installed WITHOUT {count(len(report.refused), 'refused recipe')} ({counts}): "
                   f"{clean(report.installed)}", "31", sys.stderr))
        raise typer.Exit(ExitCode.DATA)
    note(f"synced set installed ({counts}): {clean(report.installed)}")


def _show_sync(report: object, as_json: bool) -> None:
    """What changed (stdout), then each refusal and warning (stderr); text from the release escaped."""
    import sys

    from metralectl.app.recipe_sync import SyncReport
    from metralectl.safetext import clean

    assert isinstance(report, SyncReport)
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(f"engine release {clean(report.release)} (commit {clean(report.commit[:12])}, engine "
              f"{clean(report.engine_version) or '?'}), checked against revision {clean(report.revision)}")
        for change in report.changes:  # when nothing was installed, only what refused it
            if change.status != "unchanged" and (report.installed or change.status == "refused"):
                print(f"  {change.status:<9} {clean(change.name):<40} {clean(change.id)}")
    for change in report.refused:
        for problem in change.problems:  # text from the release: escaped line by line
            note(style("\n".join(clean(line) for line in problem.render().splitlines()), "31", sys.stderr))
    for warning in report.warnings:
        note(style(f"warning: {clean(warning)}", "33", sys.stderr))


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="recipes")
