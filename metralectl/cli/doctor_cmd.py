"""`doctor`: check the machine, one line per check; exit non-zero if and only if a check found a problem.

The checks live in metralectl.doctor (imported inside the command, so other commands never load it).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import typer

from metralectl.cli.state import color_enabled
from metralectl.wording import count

if TYPE_CHECKING:
    from metralectl.doctor.model import CheckResult

MARKS = {"ok": ("[ ok ]", "32"), "warn": ("[warn]", "33"), "problem": ("[FAIL]", "31"), "skipped": ("[skip]", "2")}
INDENT = " " * 7


def render_text(results: list[CheckResult], elapsed_s: float, *, color: bool = False) -> str:
    """The human report: a status mark, the title and detail per check, the remedy indented below."""
    from metralectl.doctor.model import counts, exit_code
    from metralectl.safetext import clean

    lines = []
    for r in results:  # a detail quotes what the machine said: a process's name, the daemon's info, a server
        mark, code = MARKS[r.status]
        if color:
            mark = f"\033[{code}m{mark}\033[0m"
        lines.append(f"{mark} {clean(r.title)}: {clean(r.detail)}")
        if r.remedy:
            lines.append(f"{INDENT}→ {clean(r.remedy)}")
    n = counts(results)
    parts = [count(n["problem"], "problem"), count(n["warn"], "warning"), f"{n['ok']} ok", f"{n['skipped']} skipped"]
    verdict = "problems found" if exit_code(results) else "no problems"
    lines.append(f"{', '.join(parts)} in {elapsed_s:.2f} s: {verdict}")
    return "\n".join(lines)


def to_json(results: list[CheckResult], elapsed_s: float, options: dict[str, Any]) -> dict[str, Any]:
    from metralectl.doctor.model import counts, exit_code

    return {"schema": 1, "ok": exit_code(results) == 0, "exit_code": exit_code(results), "counts": counts(results),
            "elapsed_s": round(elapsed_s, 3), "options": options, "checks": [r.to_json() for r in results]}


def doctor(
    as_json_: bool = typer.Option(False, "--json", help="Print the checks as one JSON document."),
    recipe: str = typer.Option(None, "--recipe", metavar="RECIPE",
                               help="Narrow to what this recipe needs: image present, weights cached, fits memory."),
    port: int = typer.Option(None, "--port", min=1, max=65535, help="The port to test (default: the recipe's, or 8888)."),
    runtime: str = typer.Option(None, "--runtime", metavar="docker|process",
                                help="With --recipe: judge it run that way (process: its program, not Docker)."),
    peer: str = typer.Option(None, "--peer", metavar="HOST",
                             help="The fabric preflight for EP=2 with this paired peer (name or address): the link "
                                  "that reaches it, MTU, speed, RDMA device, NCCL interface, a throughput probe."),
) -> None:
    """Check this machine for everything that stops a model from being served, with the fix for each.

    Exits 1 if any check found a problem (warnings do not count), so it is safe in scripts. With --peer HOST,
    the fabric checks for an EP=2 launch with that node (and only those, unless --recipe is given too).
    """
    from metralectl.core.catalog import load_catalog
    from metralectl.doctor import Context, diagnose
    from metralectl.doctor.model import exit_code

    catalog_loader: Callable[[], Any] = load_catalog
    sets: tuple[str, ...] = ()
    if runtime is not None:
        from metralectl.app.serving_change import with_runtime
        from metralectl.errors import UsageError

        if recipe is None:
            raise UsageError("--runtime judges a recipe: name it with --recipe RECIPE")
        sets = with_runtime("run", runtime, ())
    if recipe is not None:
        from metralectl.core.overrides import apply_sets

        catalog = load_catalog()
        apply_sets(catalog, catalog.recipe(recipe), list(sets))  # an unknown recipe is a usage error, before any check
        catalog_loader = lambda: catalog  # the one already loaded
    ctx = Context(port=port, recipe=recipe, catalog_loader=catalog_loader, recipe_sets=sets)
    started = time.monotonic()
    if peer is None:
        results = diagnose(ctx)
    else:
        from metralectl.doctor import run_checks, select

        checks = select(recipe) if recipe is not None else ()
        results = run_checks(ctx, checks + _fabric_checks(peer, recipe, catalog_loader))
    elapsed = time.monotonic() - started
    try:
        if as_json_:
            print(json.dumps(to_json(results, elapsed, {"recipe": recipe, "port": ctx.port_and_bind()[0],
                                                        **({"runtime": runtime} if runtime else {}),
                                                        **({"peer": peer} if peer else {})}), indent=2))
        else:
            print(render_text(results, elapsed, color=color_enabled(sys.stdout)))
        sys.stdout.flush()
    finally:
        ctx.close()
    raise typer.Exit(exit_code(results))


def _fabric_checks(peer: str, recipe: str | None, catalog_loader: Callable[[], Any]) -> tuple[Any, ...]:
    """doctor --peer's checks (metralectl.peers.fabric): an unpaired HOST is a usage error before any check."""
    from metralectl.peers.fabric import Session, profile_of, resolve
    from metralectl.seams import identity

    ref = resolve(peer)
    return Session(ref, identity.load(), profile_of(catalog_loader(), recipe), label=peer).checks()


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
