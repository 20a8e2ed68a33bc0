"""`list` and `show`: the recipe catalog, no container engine needed (`run --print` is in serve_cmds)."""

from __future__ import annotations

import json

import typer

from metralectl.cli import catalog_list
from metralectl.cli.catalog_list import _catalog  # noqa: F401  (other commands load the catalog from here)


def list_recipes(
    hardware: str = typer.Option(None, "--hardware", help="Judge fit against this hardware class (gb10, hopper, b200)."),
    tag: list[str] = typer.Option(None, "--tag", help="Only recipes with this tag (repeatable)."),
    only_hardware: bool = typer.Option(False, "--only", help="With --hardware: list only that class's recipes."),
    as_json: bool = typer.Option(False, "--json", help='Print JSON: {"target": {"hardware", "how"}, "recipes": [one object per recipe]}.'),
) -> None:
    """List the recipes: engine, model, quant, hardware, MTP, validated tok/s, memory, fit, cached weights (alias: ls)."""
    code = catalog_list.list_recipes(hardware, tag, only_hardware, as_json)
    if code is not None:
        raise typer.Exit(code)


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
    app.command("ls", hidden=True, help="Same as `list`.")(list_recipes)
    app.command("show")(show)
