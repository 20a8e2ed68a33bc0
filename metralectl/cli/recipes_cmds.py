"""`metralectl recipes check [PATH...]`: the recipe checker on files (or on every known recipe)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from metralectl.cli.state import note, style
from metralectl.errors import Problem

app = typer.Typer(help="Check and inspect recipe files.", no_args_is_help=True, rich_markup_mode=None)


@app.command("check")
def check(
    files: list[Path] = typer.Argument(None, metavar="[PATH]...", help="Recipe files (default: every shipped and user recipe)."),
    as_json: bool = typer.Option(False, "--json", help="Print the findings as JSON."),
) -> None:
    """Check recipes; exit 1 if any is refused. Problems name file:line:column, key, why and the fix."""
    import sys

    from metralectl.catalog import check_files, load_catalog

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
                note(style(problem.render(), color, sys.stderr))
            print(f"{'ok     ' if ok else 'REFUSED'}  {path}")
        note(f"{len(results) - len(refused)} ok, {len(refused)} refused")
    if refused:
        raise typer.Exit(1)
