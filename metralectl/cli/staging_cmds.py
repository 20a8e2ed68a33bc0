"""`pull` and `images`: staging engine images and checkpoint weights before launch.

Progress goes to stderr (rich bars on a terminal, a few plain lines otherwise); results to stdout. What the
Hub, a mirror or the daemon says (a file name, a note, a layer's status) is escaped (safetext.clean) before it
is printed, and for a bar's description also for Rich markup (safetext.markup).
rich, docker and huggingface_hub are imported inside the commands, never at registration.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import typer

from metralectl.cli.state import note, style
from metralectl.errors import UsageError
from metralectl.safetext import clean, markup
from metralectl.wording import count

if TYPE_CHECKING:
    from metralectl.seams.docker.protocol import ContainerRuntime


class _Renderer:
    """Turns the core's events into progress on stderr."""

    PLAIN_EVERY_S = 15.0

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        from metralectl.cli.state import color_enabled

        self.console = Console(stderr=True, color_system="auto" if color_enabled(sys.stderr) else None)
        self.live = self.console.is_terminal
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(bar_width=28),
                                 TextColumn("{task.fields[size]}"), TextColumn("{task.fields[rate]}"),
                                 TextColumn("{task.fields[eta]}"), TextColumn("{task.fields[files]}"),
                                 console=self.console, disable=not self.live, transient=True)
        # transient: the live bars go when the work ends, rather than being drawn once more below the lines that
        # followed them (`✔ ready` above a stale bar); each finished bar leaves its one line (`_finish`)
        self.tasks: dict[Any, Any] = {}
        self.last_plain: dict[Any, tuple[str, float]] = {}

    def __enter__(self) -> _Renderer:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def say(self, text: str) -> None:
        if self.live:
            self.progress.console.print(text, highlight=False, markup=False)
        else:
            note(text)

    def _plain(self, key: Any, phase: str, text: str) -> None:
        last = self.last_plain.get(key)
        now = time.monotonic()
        if last is None or last[0] != phase or now - last[1] >= self.PLAIN_EVERY_S:
            self.last_plain[key] = (phase, now)
            note(text)

    def weights(self, e: Any) -> None:
        from metralectl.core.progress import human_bytes, human_duration

        repo = clean(e.repo, 200)
        if e.phase in ("note", "resolve"):
            self.say(f"{repo}: {clean(e.message, 500)}")
            return
        size = f"{human_bytes(e.done)}/{human_bytes(e.total)}"
        rate = f"{human_bytes(e.rate_bps)}/s" if e.rate_bps is not None and e.phase != "done" else ""
        eta = f"ETA {human_duration(e.eta_s)}" if e.eta_s is not None and e.phase != "done" else ""
        files = f"{e.files_done}/{count(e.files_total, 'file')}"
        label = {"download": "downloading", "verify": "verifying", "done": "verified"}.get(e.phase, e.phase)
        if not self.live:
            pct = f" ({100 * e.done / e.total:.0f}%)" if e.total else ""
            self._plain(e.repo, e.phase, f"{repo}: {label} {size}{pct} {rate} {eta} {files}".rstrip())
            return
        if e.phase == "done":  # the repo's bars end: one line says how it ended, in order with what follows
            for phase in ("download", "verify"):
                self._finish((e.repo, phase))
            self.say(f"{repo}: {label} {size} {files}")
            return
        key = (e.repo, "download" if e.phase == "download" else "verify")
        if key not in self.tasks:
            self.tasks[key] = self.progress.add_task(f"{markup(e.repo, 200)} {label}", total=e.total or None,
                                                     size="", rate="", eta="", files="")
        self.progress.update(self.tasks[key], completed=e.done, total=e.total or None, size=size, rate=rate,
                             eta=eta, files=files, description=f"{markup(e.repo, 200)} {label}")

    def layer(self, e: Any) -> None:
        from metralectl.core.progress import human_bytes

        ref, status, layer = clean(e.ref, 200), clean(e.status, 300), clean(str(e.layer), 80)
        if e.layer is None:
            self.say(f"{ref}: {status}")
            return
        finished = e.status in ("Pull complete", "Already exists", "Download complete")
        if not self.live:
            if e.status not in ("Downloading", "Extracting", "Waiting"):
                self._plain((e.ref, e.layer), e.status, f"{ref}: layer {layer}: {status}")
            return
        key = (e.ref, e.layer)
        if key not in self.tasks:
            self.tasks[key] = self.progress.add_task(f"layer {markup(str(e.layer), 80)}", total=None, size="", rate="",
                                                     eta="", files="")
        size = f"{human_bytes(e.current)}/{human_bytes(e.total)}" if e.total else ""
        fields: dict[str, Any] = {"description": f"layer {markup(str(e.layer), 80)} {markup(e.status.lower(), 300)}",
                                  "size": size}
        if e.total:
            fields.update(completed=e.current or 0, total=e.total)
        if finished:
            self._finish(key)
            return
        self.progress.update(self.tasks[key], **fields)

    def _finish(self, key: Any) -> None:
        task = self.tasks.pop(key, None)
        if task is not None:
            self.progress.remove_task(task)
            self.progress.refresh()  # else the live region keeps drawing the last frame, bar included


def _image_line(result: Any) -> str:
    s = result.status  # the revision label, platform and digest are the image's (a registry's): escaped
    rev = f"rev {clean(s.revision[:12])}" if s.revision else "no revision label"
    return (f"image {clean(s.info.ref)} {result.action} ({rev}, {clean(s.local_platform or '?', 80)}, "
            f"{clean(s.digest or 'no digest', 120)})")


def _weights_line(result: Any) -> str:
    from metralectl.core.progress import human_bytes

    how = ("already complete" if result.already_complete
           else f"{human_bytes(result.downloaded_bytes)} downloaded")
    pinned = "pinned" if result.revision else "main"
    what = f"{result.repo}:{result.quant}" if result.quant is not None else result.repo  # GGUF: that quant's files
    return (f"weights {clean(what, 200)} complete at {clean(result.commit[:12])} ({pinned}; {count(result.files, 'file')}, "
            f"{human_bytes(result.total_bytes)}, {how})")


def pull(
    recipe_names: list[str] = typer.Argument(..., metavar="RECIPE...", help="Recipes to stage (see `metralectl list`)."),
    weights_only: bool = typer.Option(False, "--weights-only", help="Only download and verify the checkpoint."),
    image_only: bool = typer.Option(False, "--image-only", help="Only pull the engine image."),
    update: bool = typer.Option(False, "--update", help="Pull images again even when present (e.g. a moved :latest)."),
    set_: list[str] = typer.Option(None, "--set", metavar="KEY=VALUE", help="Override a setting of every recipe named (e.g. image-tag=dev)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout."),
) -> None:
    """Stage recipes: pull the engine image and download + verify the checkpoint into the HF cache."""
    from metralectl.seams.docker import images as docker_images
    from metralectl.seams import machine
    from metralectl.seams.hf import weights
    from metralectl.cli.catalog_cmds import _catalog

    if weights_only and image_only:
        raise UsageError("--weights-only and --image-only exclude each other")
    catalog = _catalog()
    from metralectl.core.overrides import apply_sets

    recipes = [apply_sets(catalog, catalog.recipe(name), set_ or []) for name in dict.fromkeys(recipe_names)]
    arch = machine.cpu_arch()
    summary: dict[str, dict[str, Any]] = {r.name: {"recipe": r.name, "image": None, "weights": None} for r in recipes}
    imaged = [r for r in recipes if r.runtime != "process"]  # a host process has no image: its program is installed
    with _Renderer() as view:
        for r in recipes:
            if r.runtime == "process" and not weights_only:
                view.say(f"{clean(r.name)}: runs as a host process (runtime: process): no image to pull")
        if not weights_only and imaged:
            from metralectl.seams.docker.errors import DockerUnavailable
            from metralectl.seams.docker.runtime import open_runtime
            try:
                runtime = open_runtime()
            except DockerUnavailable as exc:
                exc.hint = f"{exc.hint}; weights alone: `metralectl pull --weights-only {' '.join(r.name for r in recipes)}`"
                raise
            pulled: dict[str, Any] = {}
            with runtime:
                for r in imaged:
                    info = catalog.image_for(r)
                    if info.ref not in pulled:
                        pulled[info.ref] = docker_images.pull(info, runtime, arch, view.layer, update=update)
                        view.say(_image_line(pulled[info.ref]))
                    summary[r.name]["image"] = {**pulled[info.ref].status.to_json(), "action": pulled[info.ref].action}
        if not image_only:
            fetched: dict[tuple[str, str | None, str | None], Any] = {}
            for r in recipes:  # one pull per checkpoint; a GGUF one per quant (each needs its own files)
                key = (r.checkpoint.repo, r.checkpoint.revision, weights.gguf_quant(r.checkpoint))
                if key not in fetched:
                    fetched[key] = weights.pull(r, view.weights)
                    view.say(_weights_line(fetched[key]))
                summary[r.name]["weights"] = fetched[key].to_json()
    if as_json:
        print(json.dumps({"recipes": list(summary.values())}, indent=2))
        return
    for name, item in summary.items():
        parts = []
        if item["image"]:
            parts.append(f"image {item['image']['action']}")
        if item["weights"]:
            parts.append(f"weights complete at {clean(item['weights']['commit'][:12])}")
        print(f"{clean(name)}: ready ({', '.join(parts)})")


def images_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """The engine images metralectl knows: which are local, their revision, platform, and the recipes using them."""
    from metralectl.core import images
    from metralectl.seams.docker import images as docker_images
    from metralectl.seams import machine
    from metralectl.cli.catalog_cmds import _catalog
    from metralectl.errors import MetralError

    catalog = _catalog()
    arch = machine.cpu_arch()
    runtime: ContainerRuntime | None = None
    docker_error: MetralError | None = None
    try:
        from metralectl.seams.docker.runtime import open_runtime
        runtime = open_runtime()
    except MetralError as exc:
        docker_error = exc
    with runtime or nullcontext():
        rows = docker_images.statuses(catalog, runtime, arch)
    if as_json:
        print(json.dumps({"machine": {"arch": arch, "platform": images.machine_platform(arch)},
                          "docker": {"reachable": runtime is not None,
                                     "error": docker_error.message if docker_error else None},
                          "images": [r.to_json() for r in rows]}, indent=2))
    else:
        from metralectl.present.table import render_table

        def local(row: Any) -> str:
            if row.present is None:
                return "?"
            return "yes" if row.present else ("no (build it)" if row.info.build else "no")

        here = images.machine_platform(arch)

        def platform(row: Any) -> str:
            other = images.normalize_platform(row.info.platform) != here
            return row.info.platform + (" (other arch)" if other else "")

        def source(row: Any) -> str:
            if row.info.build is not None:
                return "build" + (" (not certified)" if row.info.certified is False else "")
            return "pull"

        table = [[r.info.id, r.info.ref, platform(r), source(r),
                  local(r), (r.revision or "-")[:12], (r.digest.split("@")[-1][:19] if r.digest else "-"),
                  ", ".join(r.recipes) or "-"] for r in rows]
        print(render_table(["IMAGE", "REF", "PLATFORM", "SOURCE", "LOCAL", "REVISION", "DIGEST", "RECIPES"], table))
        note(f"this machine: {images.machine_platform(arch)} ({arch})")
        for r in rows:
            if r.info.build is not None:
                note(f"{r.info.id}: {r.info.availability()}")
            elif len(r.info.tags) > 1 or r.info.tag_pattern:
                note(f"{r.info.id}: tags {', '.join(r.info.tags)}" + (" or a commit / version tag" if r.info.tag_pattern
                     else "") + "; a recipe picks one with `image-tag: TAG` (or `--set image-tag=TAG`)")
        for r in rows:
            if r.problem and r.present:
                note(style(f"{r.info.id}: {clean(r.problem, 500)}", "33", sys.stderr))
    if docker_error is not None:
        note(style(f"metralectl: Docker not reachable, local state unknown: {clean(docker_error.message, 500)}", "33",
                   sys.stderr))
        if docker_error.hint:
            note(f"    hint: {clean(docker_error.hint, 500)}")


def register(app: typer.Typer) -> None:
    app.command("pull")(pull)
    app.command("images")(images_cmd)
