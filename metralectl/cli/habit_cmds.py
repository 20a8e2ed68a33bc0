"""Commands users of other tools type by habit: `version`, `search WORDS`, `completion SHELL`.

(`ls` is `list`'s alias, declared in cli/catalog_list.py; `--version` is the root group's option,
cli/main.py.)
"""

from __future__ import annotations

from typing import Any

import typer

from metralectl import DISTRIBUTION, __version__

SHELLS = ("bash", "zsh", "fish")
COMPLETE_VAR = "_METRALECTL_COMPLETE"  # what Click derives from the program's name; the scripts set it


def version(as_json: bool = typer.Option(False, "--json", help="Print JSON: the version and the distribution name.")) -> None:
    """Print the version (same as --version)."""
    if as_json:
        import json

        print(json.dumps({"command": "metralectl", "version": __version__, "distribution": DISTRIBUTION}))
        return
    print(f"metralectl {__version__}")


def search(
    words: list[str] = typer.Argument(..., metavar="WORDS...",
                                      help="Words that must all appear (any case) in the recipe's name, model, "
                                           "repo, description or tags."),
    hardware: str = typer.Option(None, "--hardware", help="Judge fit against this hardware class (gb10, hopper, b200)."),
    engine: str = typer.Option(None, "--engine", metavar="ENGINE", help="Only recipes of this engine."),
    as_json: bool = typer.Option(False, "--json", help='Print JSON, the shape of `list --json`: {"target": {...}, '
                                                       '"recipes": [...]} (an empty list when nothing matches).'),
) -> None:
    """Find recipes by words: the table of `list`, only the recipes every word matches."""
    from metralectl.cli import catalog_list

    code = catalog_list.list_recipes(hardware, None, False, as_json, words=words, engine=engine)
    if code is not None:
        raise typer.Exit(code)


def completion(shell: str = typer.Argument(..., metavar="SHELL", help="bash, zsh or fish.")) -> None:
    """Print the shell completion script for SHELL. Load it with, for bash:
    `source <(metralectl completion bash)`; zsh: `source <(metralectl completion zsh)` (after compinit);
    fish: `metralectl completion fish | source`. install/install.sh installs it for your login shell."""
    if shell not in SHELLS:
        from metralectl.errors import UsageError

        raise UsageError(f"completion {shell!r}: expected one of {', '.join(SHELLS)}",
                         f"e.g. `metralectl completion {SHELLS[0]}`")
    # Typer's own scripts: its completion handler (run on each TAB, through Click) reads the order of words
    # they set ("complete_bash"), which Click's scripts do not.
    from typer.completion import get_completion_script

    print(get_completion_script(prog_name="metralectl", complete_var=COMPLETE_VAR, shell=shell))


def _recipe_names(ctx: object, param: object, incomplete: str) -> list[str]:
    """The recipes whose names start with what was typed, from `list`'s stored rows (else the catalog)."""
    from metralectl.app.library_cache import engines_by_recipe

    return sorted(name for name in engines_by_recipe() if name.startswith(incomplete))


def complete_recipes(command: Any) -> None:
    """On a TAB only: every RECIPE argument in the tree (run, show, stop, swap, logs, pull, ...) completes
    to recipe names. Done here, over the built tree, so the command modules stay as they are."""
    import click

    todo = [command]
    while todo:
        current = todo.pop()
        for param in getattr(current, "params", ()):
            if isinstance(param, click.Argument) and (param.metavar or "").strip("[].") in ("RECIPE", "RECIPES"):
                param._custom_shell_complete = _recipe_names
        if isinstance(current, click.Group):
            todo.extend(current.commands.values())


def register(app: typer.Typer) -> None:
    app.command("version")(version)
    app.command("search")(search)
    app.command("completion")(completion)
