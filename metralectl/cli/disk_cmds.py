"""`rm` and `prune`: give disk back — recipes' weights in the HF cache, and catalog images on the Docker daemon.

Everything is planned first and shown with the bytes it frees (stderr, or `--json` on stdout); a terminal asks
before anything goes (`--yes` skips it, `--dry-run` stops there). A refused item (a running container uses it,
another user's files, not a catalog image) is said, with why, and never removed; a removal that fails is said,
the rest still goes, and the exit is non-zero. docker is imported only when images are involved.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from metralectl.cli.state import note, style
from metralectl.errors import MetralError, UsageError
from metralectl.wording import count

if TYPE_CHECKING:
    from metralectl.app.disk_weights import Removal


def _catalog() -> Any:
    from metralectl.cli.catalog_cmds import _catalog as load

    return load()


def _named(catalog: Any) -> dict[str, tuple[str, ...]]:
    """Repository -> the recipes naming it (shipped, synced and yours)."""
    out: dict[str, list[str]] = {}
    for recipe in catalog.recipes.values():
        out.setdefault(recipe.checkpoint.repo, []).append(recipe.name)
    return {repo: tuple(sorted(names)) for repo, names in out.items()}


class _Docker:
    """The daemon, opened once, only when an image is involved or running containers must be asked."""

    def __init__(self) -> None:
        self.runtime: Any = None
        self.error: str | None = None
        self._used: dict[str, str] | None = None

    def open(self) -> Any:
        """This machine's engines (containers and host processes: both may use weights); None when neither can be
        asked. Docker unreachable beside host processes: `error` says why, and images() is None."""
        if self.runtime is None and self.error is None:
            from metralectl.lifecycle.local_runtime import open_local
            from metralectl.seams.docker.errors import DockerUnavailable
            try:
                self.runtime = open_local()
            except DockerUnavailable as exc:
                self.error = exc.message
            else:
                if self.runtime.docker is None:
                    self.error = getattr(self.runtime.docker_error, "message", None) or "Docker is not reachable"
        return self.runtime

    def images(self) -> Any:
        """The Docker daemon's runtime, which holds the images (None when it cannot be reached: `error` says why)."""
        runtime = self.open()
        return runtime.docker if runtime is not None else None

    def used(self) -> dict[str, str]:
        from metralectl.app.disk_images import in_use

        if self._used is None:
            daemon = self.images()
            self._used = in_use(daemon) if daemon is not None else {}
        return self._used

    def users(self, catalog: Any, repos: set[str], hub: Path) -> list[Any]:
        """What runs and uses weights (app/disk_users.py): a lifecycle change in progress, running containers."""
        from metralectl.app import disk_users

        found = disk_users.lifecycle_users()
        runtime = self.open()
        if runtime is not None:
            found += disk_users.container_users(runtime, catalog, repos, hub)
        return found


def _weights_of(catalog: Any, recipe: Any, hub: Path, named: dict[str, tuple[str, ...]]) -> Removal | None:
    from metralectl.app import disk_weights

    ck = recipe.checkpoint
    if ck.format == "gguf":
        users = tuple(r.name for r in catalog.recipes.values()
                      if r.checkpoint.repo == ck.repo and r.checkpoint.quant.upper() == ck.quant.upper())
        return disk_weights.plan_quant(ck.repo, ck.quant, hub, users)
    return disk_weights.plan_repo(ck.repo, hub, named.get(ck.repo, ()))


def _show(items: list[Removal], verb: str) -> None:
    from metralectl.core.progress import human_bytes
    from metralectl.safetext import clean  # a cache entry's name is whatever is on disk

    for item in items:
        used = f"  (recipes: {', '.join(item.recipes)})" if item.recipes else ""
        if item.kind == "left-alone":
            note(style(f"  left alone: {clean(item.name)}: {clean(item.blocked or '')}", "33", sys.stderr))
        elif item.blocked:
            note(style(f"  kept     {item.kind:8} {clean(item.name)}: {clean(item.blocked)}", "33", sys.stderr))
        else:
            note(f"  {verb:8} {item.kind:8} {clean(item.name)}  {human_bytes(item.bytes)}{clean(used)}")
        for line in item.left_alone:
            note(style(f"           {clean(line)}", "33", sys.stderr))
    total = sum(i.bytes for i in items if not i.blocked)
    note(f"{count(len([i for i in items if not i.blocked]), 'item')}, {human_bytes(total)} to free")


def _confirm(yes: bool, dry_run: bool, items: list[Removal]) -> bool:
    if dry_run or not any(not i.blocked for i in items):
        return False
    if yes:
        return True
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise UsageError("refusing to remove without a confirmation: not at a terminal",
                         "pass --yes to remove, or --dry-run to see what would go")
    return bool(typer.confirm("Remove these?", default=False, err=True))


def _execute(items: list[Removal], hub: Path, docker: _Docker) -> None:
    from metralectl.app import disk_images, disk_weights

    for item in items:
        if item.blocked or item.kind == "left-alone":
            continue
        if item.kind == "image":
            disk_images.remove_image(docker.images(), item)
        else:
            disk_weights.remove_item(item, hub)


def _finish(items: list[Removal], as_json: bool, dry_run: bool, went: bool) -> None:
    from metralectl.core.progress import human_bytes
    from metralectl.safetext import clean

    removed = [i for i in items if i.done]
    failed = [i for i in items if i.error]
    if as_json:
        print(json.dumps({"dry_run": dry_run, "items": [i.to_json() for i in items],
                          "freed_bytes": sum(i.bytes for i in removed),
                          "would_free_bytes": sum(i.bytes for i in items if not i.blocked)}, indent=2))
    if went:
        if not as_json:
            for item in removed:
                print(f"removed {item.kind} {clean(item.name)} ({human_bytes(item.bytes)})")
        note(f"freed {human_bytes(sum(i.bytes for i in removed))} ({len(removed)} removed)")
    if failed:
        for item in failed:
            note(style(f"  NOT removed {item.kind} {clean(item.name)}: {clean(str(item.error))}", "31", sys.stderr))
        raise MetralError(f"{len(failed)} of {count(len(removed) + len(failed), 'removal')} failed; {len(removed)} "
                          "succeeded (listed above)", "fix the cause named above and run the command again")


def rm(
    recipe_names: list[str] = typer.Argument(None, metavar="[RECIPE...]",
                                             help="Recipes whose weights go (see `list`)."),
    weights: list[str] = typer.Option(None, "--weights", metavar="REPO[:QUANT]",
                                      help="A repository a recipe names (a GGUF one: only QUANT's files)."),
    image: list[str] = typer.Option(None, "--image", metavar="REF", help="A catalog image on the Docker daemon."),
    with_image: bool = typer.Option(False, "--with-image", help="Also remove each RECIPE's image."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would go, and the bytes; remove nothing."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
    as_json: bool = typer.Option(False, "--json", help="The plan and the outcome as JSON on stdout."),
) -> None:
    """Remove recipes' weights from the HF cache (a GGUF recipe: only its quant) and/or catalog images."""
    from metralectl import paths
    from metralectl.app import disk_images

    if not (recipe_names or weights or image):
        raise UsageError("nothing to remove", "name RECIPE..., --weights REPO[:QUANT] or --image REF")
    catalog = _catalog()
    hub, named, docker = paths.hf_hub_cache(), _named(catalog), _Docker()
    items: list[Removal] = []
    refs: dict[str, tuple[str, ...]] = {}
    for name in dict.fromkeys(recipe_names or []):
        recipe = catalog.recipe(name)
        found = _weights_of(catalog, recipe, hub, named)
        if found is None:
            note(f"{name}: no weights of {recipe.checkpoint.repo} in {paths.display(hub)}")
        elif found.name not in {i.name for i in items}:
            items.append(found)
        if with_image:
            refs.setdefault(disk_images.with_tag(catalog.image_for(recipe).ref), ())
    for spec in dict.fromkeys(weights or []):
        repo, _, quant = spec.partition(":")
        if repo not in named:
            raise UsageError(f"no recipe names the repository {repo!r}: metralectl removes only its recipes' weights",
                             "`hf cache ls` / `hf cache rm` manage the rest of the cache")
        from metralectl.app import disk_weights

        found = (disk_weights.plan_quant(repo, quant, hub, named[repo]) if quant
                 else disk_weights.plan_repo(repo, hub, named[repo]))
        if found is None:
            note(f"{spec}: nothing of it in {paths.display(hub)}")
        elif found.name not in {i.name for i in items}:
            items.append(found)
    refs.update({disk_images.with_tag(r): () for r in image or []})
    if refs:
        runtime = docker.images()
        if runtime is None:
            raise MetralError(f"cannot reach the Docker daemon to remove images: {docker.error}",
                              "start it, or leave the images out")
        repositories = {disk_images.repository(i.ref) for i in catalog.images.values()}
        for ref in refs:
            users = tuple(sorted(r.name for r in catalog.recipes.values()
                                 if disk_images.with_tag(catalog.image_for(r).ref) == ref))
            found_image = disk_images.plan_image(runtime, ref, repositories, users, docker.used())
            if found_image is None:
                note(f"{ref}: no such image on the daemon")
            else:
                items.append(found_image)
    _run(items, catalog, hub, docker, dry_run, yes, as_json)


def _run(items: list[Removal], catalog: Any, hub: Path, docker: _Docker, dry_run: bool, yes: bool,
         as_json: bool) -> None:
    if any(i.kind in ("weights", "quant") for i in items):
        from metralectl.app import disk_users

        disk_users.block(items, docker.users(catalog, {i.repo for i in items if i.repo}, hub), hub)
        if docker.error:
            note(f"(Docker not reachable — {docker.error} — so no container of it can be serving these weights)")
    if not items:
        note("nothing to remove")
        if as_json:
            print(json.dumps({"dry_run": dry_run, "items": [], "freed_bytes": 0, "would_free_bytes": 0}, indent=2))
        return
    _show(items, "would go" if dry_run else "remove")
    went = _confirm(yes, dry_run, items)
    if went:
        _execute(items, hub, docker)
    _finish(items, as_json, dry_run, went)
    kept = [i for i in items if i.blocked and i.kind != "left-alone"]  # a link merely said is no failure
    if kept and not dry_run:
        raise MetralError(f"{count(len(kept), 'item')} kept (the reasons are above)")


def prune(
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would go, and the bytes; remove nothing."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
    no_images: bool = typer.Option(False, "--no-images", help="Leave the Docker daemon alone."),
    as_json: bool = typer.Option(False, "--json", help="The plan and the outcome as JSON on stdout."),
) -> None:
    """Remove weights metralectl pulled that no recipe names, dead downloads, and catalog images no recipe runs."""
    from metralectl import paths
    from metralectl.app import disk_images, disk_weights

    catalog = _catalog()
    hub, docker = paths.hf_hub_cache(), _Docker()
    items = disk_weights.plan_prune(hub, _named(catalog))
    if not no_images:
        runtime = docker.images()
        if runtime is None:
            note(f"images left alone: {docker.error}")
        else:
            repositories = {disk_images.repository(i.ref) for i in catalog.images.values()}
            wanted = {disk_images.with_tag(catalog.image_for(r).ref) for r in catalog.recipes.values()}
            items.extend(disk_images.plan_image_prune(runtime, repositories, wanted, docker.used()))
    _run(items, catalog, hub, docker, dry_run, yes, as_json)


def register(app: typer.Typer) -> None:
    app.command("rm")(rm)
    app.command("prune")(prune)
