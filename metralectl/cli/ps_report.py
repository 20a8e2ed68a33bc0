"""`ps`: a plain Click command and its report, printed. No Typer here: `ps`'s start is timed
(benchmarks/cold_start.py); without --repair it reads the daemon through the default runtime and
lifecycle/status.py, never importing the use-case layer (it loads the launch machinery).
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from metralectl.cli.state import note, style

if TYPE_CHECKING:
    from metralectl.lifecycle.status import StatusReport
    from metralectl.seams.docker.protocol import ContainerRuntime


@click.command("ps")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--repair", is_flag=True, help="Repair an interrupted swap (restore a serving model).")
@click.option("--on", "on", metavar="kube[:CONTEXT]", help="metralectl's pods on a Kubernetes cluster (docs/kubernetes.md).")
@click.option("--namespace", "-n", "namespace", help="With --on kube: the namespace (default: the context's).")
def ps_command(as_json: bool, repair: bool, on: str | None = None, namespace: str | None = None) -> None:
    """What metralectl is serving: recipe, state, health, uptime, endpoint, image revision."""
    if on or namespace:
        if not on or repair:
            raise click.UsageError("--namespace goes with --on kube; --repair is for this machine")
        from metralectl.cli import kube_cmds

        kube_cmds.ps(on, namespace, as_json)
        return
    if not repair:
        ps(as_json)
        return
    from metralectl.cli.serve_cmds import _Progress, _serving  # the serving commands' use case and printer

    show(_serving().ps(repair=True, on_event=_Progress(False)), as_json)


def ps(as_json: bool) -> None:
    """The `ps` command without --repair: what app/serving.py's Serving.ps() does then (this machine's runtime:
    its containers and host processes, status.collect), without importing the use-case layer (it loads the launch
    machinery)."""
    from metralectl.errors import MetralError
    from metralectl.lifecycle.local_runtime import open_local
    try:
        with open_local() as runtime:
            report = collect(runtime)
    except MetralError:
        if not as_json:  # no engine can be listed (Docker unreachable), but a gateway on this box still can
            _note_gateways(_gateways())
        raise
    show(report, as_json)


def collect(runtime: ContainerRuntime) -> StatusReport:
    from metralectl.lifecycle import status

    return status.collect(runtime)


def show(report: StatusReport, as_json: bool, memory: list[tuple[float | None, str | None]] | None = None) -> None:
    """What the daemon's labelled containers say is served, as a table (stderr: notes) or JSON. The engine is the
    one the recipe named on the container's label runs on, from the catalog (`?` / null: a recipe it lacks). The
    memory: measured per container through NVML, else the recipe's estimate (labelled), else `?` / null. An engine
    run as a host process reads `process` where a container's image revision goes (`runtime` in JSON).
    Labels are anyone's on a shared daemon: the table escapes every cell, the notes are escaped here."""
    from metralectl.safetext import clean
    from metralectl.wording import count

    engines = _engines() if report.serving else {}
    if memory is None:
        memory = _memory(report) if report.serving else []
    gateways = _gateways()
    if as_json:
        data = report.to_json()
        for entry, serving, (gb, source) in zip(data["serving"], report.serving, memory):
            entry["engine"] = engines.get(entry["recipe"])
            entry["runtime"] = "process" if serving.host_process else "docker"
            entry["memory_gb"], entry["memory_source"] = gb, source
        data["gateways"] = gateways
        print(json.dumps(data, indent=2))
        return
    from metralectl.lifecycle.ps_memory import label
    from metralectl.present.table import render_table

    rows = [[s.recipe, engines.get(s.recipe, "?"), s.name, s.owner, s.state, s.health, s.uptime,
             label(*mem), s.endpoint, "process" if s.host_process else (s.image_revision or "-")[:24]]
            for s, mem in zip(report.serving, memory)]
    headers = ["RECIPE", "ENGINE", "CONTAINER", "OWNER", "STATE", "HEALTH", "UPTIME", "MEM GB", "ENDPOINT",
               "IMAGE REVISION"]
    if any(s.gpu_ids is not None for s in report.serving):  # a box of several GPUs: which each engine is on
        from metralectl.core.placement import ids_text

        at = headers.index("ENDPOINT")
        headers.insert(at, "GPUS")
        for row, s in zip(rows, report.serving):
            row.insert(at, "-" if s.gpu_ids is None else ids_text(s.gpu_ids))
    if any(s.rank is not None for s in report.serving):  # a multi-rank deployment: say which rank runs where
        headers[3:3] = ["RANK", "NODE"]
        for row, s in zip(rows, report.serving):
            row[3:3] = ["-" if s.rank is None else str(s.rank), s.node or "local"]
    if rows:
        print(render_table(headers, rows, right=(headers.index("MEM GB"),)))
        if any(source == "estimate" for _, source in memory):
            note("MEM GB: `est.` is the recipe's estimate (NVML did not report the container's processes)")
    else:
        from metralectl.errors import NOTHING_SERVED

        note(NOTHING_SERVED)
    for line in report.notes:
        note(style(f"! {clean(line, 600)}", "33", sys.stderr))
    if report.degraded:
        note(style(f"DEGRADED: {clean(report.degraded, 600)}", "31", sys.stderr))
        note("    hint: `metralectl ps --repair` restores a serving model")
    if report.last_swap:
        note(f"last swap: {clean(report.last_swap, 600)}")
    _note_gateways(gateways)


def _note_gateways(gateways: list[dict[str, Any]]) -> None:
    from metralectl.safetext import clean
    from metralectl.wording import count

    for g in gateways:
        live = (f"routes {count(g['models'] or 0, 'name')}" + (f", {g['waiting']} waiting" if g["waiting"] else "")
                if g["answering"] else style("not answering", "33", sys.stderr) if g["here"] else
                style("not asked: its record names an address that is not this machine's", "33", sys.stderr))
        keys = count(g["keys"], "API key") if g["keys"] else "no API key"
        cpus = f"; on CPUs {g['cpus']}" if g.get("cpus") else ""
        busy = f"; busy-polling {g['busy_poll_ms']:g} ms after each read" if g.get("busy_poll_ms") else ""
        note(f"gateway {clean(g['url'], 80)} (pid {g['pid']}): {live}; {keys}{cpus}{busy}")


def _gateways() -> list[dict[str, Any]]:
    """The gateways running on this box (gateway/state.py), each asked its /health (0.5 s at most)."""
    from metralectl.gateway import state

    out: list[dict[str, Any]] = []
    for g in state.running():
        answer = (state.health(g["url"]) if g["here"] else None) or {}
        models, waiting = answer.get("models"), answer.get("waiting")
        out.append({**g, "answering": bool(answer),
                    "models": models if isinstance(models, int) and not isinstance(models, bool) else None,
                    "waiting": waiting if isinstance(waiting, int) and not isinstance(waiting, bool) else 0})
    return out


def _memory(report: StatusReport) -> list[tuple[float | None, str | None]]:
    """Each container's memory (lifecycle/ps_memory.py): the running ones on this host are measured when NVML can."""
    from metralectl.errors import MetralError
    from metralectl.lifecycle import ps_memory

    local = [s.name for s in report.serving if ps_memory.is_local(s) and s.state.startswith("running")]
    measured: dict[str, int] = {}
    if local:
        try:
            from metralectl.lifecycle.local_runtime import open_local
            with open_local() as runtime:
                measured = ps_memory.measured_bytes(local, runtime.container_pids)
        except MetralError:
            measured = {}
    return ps_memory.per_model(report.serving, measured, _estimates())


def _estimates() -> dict[str, float | None]:
    """Each recipe's memory estimate (GB), as `list` shows it; empty when the catalog cannot be read."""
    from metralectl.errors import MetralError

    try:
        from metralectl.app import library_cache

        view, key = library_cache.read(None)
        if view is None:
            from metralectl.core.catalog import load_catalog

            view = library_cache.build(load_catalog(), None, key)
        return {str(r["name"]): r["memory_gb"] for r in view["rows"]}
    except MetralError:
        return {}


def _engines() -> dict[str, str]:
    from metralectl.app.library_cache import engines_by_recipe

    return engines_by_recipe()
