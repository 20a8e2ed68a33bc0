"""`list` and `show`: the recipe catalog, no container engine needed (`run --print` is in serve_cmds)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import typer

from metralectl.cli.state import note, style
from metralectl.errors import ExitCode, NotFound

if TYPE_CHECKING:
    from metralectl.core.catalog import Catalog


def _catalog() -> Catalog:
    from metralectl.core.catalog import load_catalog

    catalog = load_catalog()
    for refused in catalog.refused:
        errors = [p for p in refused.problems if p.severity == "error"]
        note(style(f"metralectl: your recipe {refused.path} was refused ({len(errors)} problem"
                   f"{'s' if len(errors) != 1 else ''}); it is left out:", "33", sys.stderr))
        for problem in errors[:5]:
            note("  " + problem.render().replace("\n", "\n  "))
    return catalog


def _check_hardware(catalog: Any, hardware: str | None) -> None:
    if hardware and hardware not in catalog.hardware:
        from metralectl.core.schema import did_you_mean

        guess = did_you_mean(hardware, catalog.hardware)
        raise NotFound(f"unknown hardware class {hardware!r}",
                       f"did you mean `{guess}`?" if guess else f"known: {', '.join(catalog.hardware)}")


def _overridden(row: Any) -> str:
    return "synced" if "/synced/" in str(row.overrides) else "shipped"


def _yes_no(value: bool | None) -> str:
    return "?" if value is None else ("yes" if value else "no")


def list_recipes(
    hardware: str = typer.Option(None, "--hardware", help="Judge fit against this hardware class (gb10, hopper, b200)."),
    tag: list[str] = typer.Option(None, "--tag", help="Only recipes with this tag (repeatable)."),
    only_hardware: bool = typer.Option(False, "--only", help="With --hardware: list only that class's recipes."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (one object per recipe)."),
) -> None:
    """List the recipes: model, quant, hardware, MTP, validated tok/s, memory, fit, cached weights."""
    from metralectl.app import library
    catalog = _catalog()
    _check_hardware(catalog, hardware)
    target = library.choose_target(catalog, hardware)
    rows = library.rows(catalog, target, hardware=hardware if only_hardware else None, tags=tag or None)
    if as_json:
        print(json.dumps({"target": {"hardware": target.hardware, "how": target.how},
                          "recipes": [r.to_json() for r in rows]}, indent=2))
    else:
        table_rows = [[
            r.name, r.model, r.quant, r.hardware, "yes" if r.mtp else "-",
            f"{r.validated_tok_s:g}" if r.validated_tok_s is not None else "-",
            f"{r.memory_gb:.1f}" if r.memory_gb is not None else "?",
            _yes_no(r.fits), r.weights, r.source if not r.overrides else f"{r.source} (overrides {_overridden(r)})",
        ] for r in rows]
        from metralectl.present.table import render_table

        print(render_table(["RECIPE", "MODEL", "QUANT", "HW", "MTP", "TOK/S", "MEM GB", "FITS", "WEIGHTS", "SOURCE"],
                           table_rows, right=(5, 6)))
        note(f"fit judged on: {target.hardware or 'each recipe’s own class'} ({target.how})")
        built: dict[str, tuple[str, list[str]]] = {}
        for r in rows:
            if not r.image_pullable:
                built.setdefault(r.image, (r.image_availability, []))[1].append(r.name)
        for ref, (how, names) in built.items():
            note(f"{', '.join(names)}: image {ref} is not pulled: {how.split(' (')[0]} (`metralectl show "
                 f"{names[0]}` says how to build it)")
    if catalog.refused:  # a user recipe failed the checker: shown above, left out of the list
        raise typer.Exit(ExitCode.DATA)


def show(
    recipe_name: str = typer.Argument(..., metavar="RECIPE", help="Recipe name (see `metralectl list`)."),
    set_: list[str] = typer.Option(None, "--set", metavar="KEY=VALUE", help="Override a setting (checked)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show a recipe: settings, provenance, memory estimate, and the command it renders."""
    from metralectl.present import show_view
    from metralectl.core.overrides import apply_sets

    catalog = _catalog()
    recipe = apply_sets(catalog, catalog.recipe(recipe_name), set_ or [])
    if as_json:
        print(json.dumps(show_view.to_json(catalog, recipe), indent=2, default=str))
    else:
        print(show_view.as_text(catalog, recipe))


def register(app: typer.Typer) -> None:
    app.command("list")(list_recipes)
    app.command("show")(show)
