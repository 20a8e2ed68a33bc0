"""`list` (and its alias `ls`): a plain Click command and its body, and the catalog loading every command
shares. No Typer here: `list`'s start is timed (benchmarks/cold_start.py), and Typer's import alone would
take most of its budget.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from metralectl.cli.state import SHOWN_PROBLEMS, note, style
from metralectl.wording import count

if TYPE_CHECKING:
    from metralectl.core.catalog import Catalog
    from metralectl.errors import ExitCode


def _catalog() -> Catalog:
    from metralectl.core.catalog import load_catalog

    from metralectl.safetext import printable

    catalog = load_catalog()
    for refused in catalog.refused:
        errors = [p for p in refused.problems if p.severity == "error"]
        note(style(f"metralectl: your recipe {printable(str(refused.path))} was refused "
                   f"({count(len(errors), 'problem')}); it is left out:", "33", sys.stderr))
        for problem in errors[:5]:
            note("  " + printable(problem.render()).replace("\n", "\n  "))  # it may quote the file
            SHOWN_PROBLEMS.add(id(problem))
    return catalog


def _check_hardware(catalog: Any, hardware: str | None) -> None:
    if hardware and hardware not in catalog.hardware:
        from metralectl.core.schema import did_you_mean
        from metralectl.errors import NotFound

        guess = did_you_mean(hardware, catalog.hardware)
        raise NotFound(f"unknown hardware class {hardware!r}",
                       f"did you mean `{guess}`?" if guess else f"known: {', '.join(catalog.hardware)}")


def _of_engine(every: list[dict[str, Any]], rows: list[dict[str, Any]], engine: str) -> list[dict[str, Any]]:
    """`--engine`: the rows of one engine; an engine no recipe uses is a usage error naming those that are."""
    engines = sorted({str(r["engine"]) for r in every})
    if engine not in engines:
        from metralectl.core.schema import did_you_mean
        from metralectl.errors import NotFound
        from metralectl.safetext import printable

        guess = did_you_mean(engine, engines)
        raise NotFound(f"no recipe is for engine {printable(engine)!r}",
                       f"did you mean `{guess}`?" if guess else f"engines with recipes: {', '.join(engines)}")
    return [r for r in rows if r["engine"] == engine]


def _overridden(row: dict[str, Any]) -> str:
    return "synced" if "/synced/" in str(row["overrides"]) else "shipped"


HEADERS = ("RECIPE", "ENGINE", "MODEL", "QUANT", "HW", "NODES", "MTP", "TOK/S", "MEM GB", "FITS", "WEIGHTS",
           "SOURCE")
# What a narrow terminal leaves out first: the model is in the recipe's name, the source in `show`, MTP, the
# nodes and the memory behind FITS (which judges both, its reason in a footnote), then the hardware class (FITS
# judges it) and the validated tok/s; RECIPE, ENGINE, QUANT, FITS and WEIGHTS always stay (the shipped recipes
# then fit 80 columns).
OPTIONAL = ("MODEL", "SOURCE", "MTP", "NODES", "MEM GB", "HW", "TOK/S")


def matches(row: dict[str, Any], words: list[str]) -> bool:
    """`search`: every word (case-insensitive) somewhere in the recipe's name, model, repo, description or tags."""
    haystack = " ".join([row["name"], row["model"], row["repo"], row["description"], *row["tags"]]).casefold()
    return all(word.casefold() in haystack for word in words)


def list_recipes(hardware: str | None, tag: list[str] | None, only_hardware: bool, as_json: bool,
                 words: list[str] | None = None, engine: str | None = None) -> ExitCode | None:
    """The `list` command (and `search`, with words); returns its exit code (None: OK; DATA when a user recipe
    was refused; FAILED when words matched nothing: no table then, `--json` an empty list). The rows come from
    app/library_cache.py when stored for this catalog and target, else from the catalog (and are stored)."""
    from metralectl.app import library_cache

    view, key = library_cache.read(hardware)
    refused = False
    if view is None:
        catalog = _catalog()
        _check_hardware(catalog, hardware)
        view = library_cache.build(catalog, hardware, key)
        refused = bool(catalog.refused)
    target = view["target"]
    rows = library_cache.select(view["rows"], hardware if only_hardware else None, tag or None)
    if engine is not None:
        rows = _of_engine(view["rows"], rows, engine)
    missed = False
    if words:
        rows = [r for r in rows if matches(r, words)]
        missed = not rows
    if as_json:
        import json  # only here: the table needs none of it

        print(json.dumps({"target": target, "recipes": rows}, indent=2))
    elif missed:  # like grep: no table, a line on stderr and exit 1 (below)
        pass
    else:
        from metralectl.app.library_words import footnote_block, footnotes

        # FITS `no`/`?` carries the mark of its reason; each distinct reason is one footnote below the table
        fits, notes = footnotes((r["fits"], r["fits_reason"]) for r in rows)
        table_rows = [[
            r["name"], r["engine"], r["model"], r["quant"], r["hardware"], str(r.get("nodes", 1)),
            "yes" if r["mtp"] else "-",
            f"{r['validated_tok_s']:g}" if r["validated_tok_s"] is not None else "-",
            f"{r['memory_gb']:.1f}" if r["memory_gb"] is not None else "?",
            fit, r["weights"],
            r["source"] if not r["overrides"] else f"{r['source']} (overrides {_overridden(r)})",
        ] for r, fit in zip(rows, fits)]
        from metralectl.present.table import render_table, terminal_width, to_fit

        width = terminal_width()
        hidden = to_fit(HEADERS, table_rows, width, OPTIONAL)
        print(render_table(HEADERS, table_rows, right=(5, 7, 8), hide=hidden))
        for line in footnote_block(notes):
            note(line)
        if hidden:
            note(f"{', '.join(hidden)} left out to fit {width} columns; a wider terminal, or `--json`, shows "
                 f"{'them' if len(hidden) > 1 else 'it'}")
        note(f"fit judged on: {target['hardware'] or 'this box'} ({target['how']}), one node"
             + ("" if target["hardware"] else "; `--hardware CLASS` judges a class instead"))
        built: dict[str, tuple[str, list[str]]] = {}
        for r in rows:
            if not r["image_pullable"]:
                built.setdefault(r["image"], (r["image_availability"], []))[1].append(r["name"])
        for ref, (how, names) in built.items():
            note(f"{', '.join(names)}: image {ref} is not pulled: {how.split(' (')[0]} (`metralectl show "
                 f"{names[0]}` says how to build it)")
    from metralectl.errors import ExitCode

    if refused:  # a user recipe failed the checker: shown above, left out of the list
        return ExitCode.DATA
    if missed:  # search ran, and what was asked for is not there
        note(f"no recipe matches all of: {' '.join(words or ())} (`metralectl list` shows every recipe)")
        return ExitCode.FAILED
    return None


@click.command("list")
@click.option("--hardware", help="Judge fit against this hardware class (gb10, hopper, b200).")
@click.option("--tag", multiple=True, help="Only recipes with this tag (repeatable).")
@click.option("--engine", metavar="ENGINE", help="Only recipes of this engine (llama-cpp, vllm, ...).")
@click.option("--only", "only_hardware", is_flag=True, help="With --hardware: list only that class's recipes.")
@click.option("--json", "as_json", is_flag=True,
              help='Print JSON: {"target": {"hardware", "how"}, "recipes": [one object per recipe]}.')
def list_command(hardware: str | None, tag: tuple[str, ...], engine: str | None, only_hardware: bool,
                 as_json: bool) -> None:
    """List the recipes: engine, model, quant, hardware, MTP, validated tok/s, memory, fit, cached weights (alias: ls)."""
    code = list_recipes(hardware, list(tag), only_hardware, as_json, engine=engine)
    if code is not None:
        raise click.exceptions.Exit(code)


ls_command = click.Command("ls", params=list_command.params, callback=list_command.callback, help="Same as `list`.",
                           hidden=True)
