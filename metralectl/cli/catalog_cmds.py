"""`show`: a recipe of the catalog, no container engine needed (`list` is in catalog_list, `run --print` in
serve_cmds)."""

from __future__ import annotations

import json

import typer

from metralectl.cli.catalog_list import _catalog  # noqa: F401  (other commands load the catalog from here)


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
    app.command("show")(show)
