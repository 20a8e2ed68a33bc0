"""`run`, `logs`, `stop`, `swap` (`ps` is cli/ps_report.py): the flags become a `Change`, app/serving.py does it, this prints it.

The command does the change itself, under the machine's lifecycle lock, whether or not `metralectl agent`
runs: the lock makes whoever comes second (this command, the agent's job, the dashboard, a peer's
benchmark unit) wait its turn with exit 75 and the holder named (docs/serving.md, "One executor").

The engine's log lines (`logs`, the followed log of `run`, a failed start's last lines) go through
safetext.log_line: its colours kept only when we colour, every other control escaped; what else came from the
daemon or the engine (a label's recipe, the served model's name, an error) through safetext.clean.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import typer

from metralectl.cli.state import color_enabled, note, style
from metralectl.safetext import clean, log_line
from metralectl.wording import count


def _sigterm_as_interrupt() -> None:
    """A SIGTERM (service manager, `kill`) cleans up like Ctrl-C does (until this command's process exits)."""
    from metralectl.seams.process import sigterm_as_interrupt_until_exit

    sigterm_as_interrupt_until_exit()


@contextmanager
def _ctrl_c_cancels() -> Iterator[None]:
    """Ctrl-C or SIGTERM while the change runs cancels its token (metralectl/cancel.py), as the dashboard's
    Cancel and the agent's job cancel do: the lifecycle stops at its next phase boundary or wait tick and runs
    Ctrl-C's cleanup (Cancelled is a KeyboardInterrupt: exit 130). A second one before the work has seen the
    first (a call blocked in the daemon) leaves at once, as Ctrl-C always did; one during the cleanup is not
    allowed to cut it short. A cancel that came after the work's last check still ends the command with 130."""
    from metralectl.cancel import CancelToken
    from metralectl.seams.process import on_stop_signals

    token = CancelToken()

    def interrupted() -> None:
        if not token.cancel("interrupted") and not token.raised:
            raise KeyboardInterrupt

    with on_stop_signals(interrupted), token.bound():
        yield
    if token.cancelled:
        raise KeyboardInterrupt


def _serving(catalog: Any = None) -> Any:
    """app/serving.py's Serving, with the catalog this command already loaded (its notes about refused user
    recipes are printed once)."""
    from metralectl.app.serving import Serving
    from metralectl.cli.catalog_cmds import _catalog

    loaded = [catalog] if catalog is not None else []

    def once() -> Any:
        if not loaded:
            loaded.append(_catalog())
        return loaded[0]

    return Serving(catalog=once)


class _Progress:
    """Lifecycle events on stderr: phases always, engine log lines when following, transfer bars."""

    def __init__(self, follow_log: bool, view: Any = None) -> None:
        self.follow_log = follow_log
        self.view = view  # staging_cmds._Renderer while a launch may pull (progress bars)

    def say(self, text: str, code: str = "2") -> None:
        line = style(text, code, sys.stderr)
        if self.view is not None:
            self.view.say(line)
        else:
            note(line)

    def __call__(self, event: Any) -> None:
        from metralectl.lifecycle import events as ev

        if isinstance(event, ev.Transfer) and self.view is not None:
            (self.view.layer if event.kind == "image" else self.view.weights)(event.progress)
        elif isinstance(event, ev.Step):
            self.say(f"▸ {event.name:<10} {clean(event.detail, 600)}")
        elif isinstance(event, ev.Warning_):
            self.say(f"! {clean(event.message, 600)}", "33")
        elif isinstance(event, ev.ContainerStarted):
            self.say(f"▸ {'started':<10} {clean(event.name)} (run {clean(event.run_id)})")
        elif isinstance(event, ev.Phase):
            who = "" if event.rank is None else f"r{event.rank} "
            self.say(f"▸ {who}{event.phase:<10} {log_line(event.line.strip())}  [{event.elapsed_s:.1f} s]", "36")
        elif isinstance(event, ev.LogLine) and self.follow_log:
            line = log_line(event.line, color_enabled(sys.stderr))
            self.say(f"  {'' if event.rank is None else f'r{event.rank}'}│ {line}")
        elif isinstance(event, ev.Ready):
            self.say(f"✔ ready in {event.elapsed_s:.1f} s", "32")
        elif isinstance(event, ev.Failed) and event.last_lines and not self.follow_log:
            self.say("  last log lines:")
            for line in event.last_lines[-15:]:
                self.say(f"  │ {log_line(line)}")


def _runtime_sets(kind: str, runtime: str | None, sets: list[str]) -> list[str]:
    """The --set overrides with `--runtime R` among them (app/serving_change: it is the set `runtime=R`)."""
    from metralectl.app.serving_change import with_runtime

    return list(with_runtime(kind, runtime, tuple(sets))) if runtime is not None else sets


def hello_request(url: str, model: str) -> str:
    """A first request to try against a ready endpoint, as a shell line."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 64})
    return f"curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' -d {shlex.quote(body)}"


def print_ready(launched: Any, as_json: bool, details: list[str]) -> None:
    """What a ready launch prints: its JSON, or the endpoint, the model, `details`, and a first request."""
    if as_json:
        print(json.dumps(asdict(launched), indent=2))
        return
    # the name the engine says it serves; else the recipe's (never another engine's word)
    model = launched.model or launched.recipe
    print(f"endpoint  {clean(launched.url)}/v1")
    print(f"model     {clean(model, 200)}")
    for line in details:
        print(clean(line))
    print(clean(hello_request(launched.url, model)))


def _print_ready(launched: Any, as_json: bool) -> None:
    if launched.already_serving:  # `run` of exactly what serves: done, and said so (--json: "already_serving")
        note(style(f"✔ {clean(launched.recipe)} is already being served with these settings: nothing was started",
                   "32", sys.stderr))
    what = "process  " if launched.runtime == "process" else "container"  # a host process, by the name ps shows
    print_ready(launched, as_json, [f"{what} {launched.container} (run {launched.run_id}; "
                                    f"logs: metralectl logs -f {launched.recipe})"])


def run(
    recipe_name: str = typer.Argument(..., metavar="RECIPE", help="Recipe name (see `metralectl list`)."),
    print_only: bool = typer.Option(False, "--print", help="Print the exact `docker run` (a host process: its argv and environment) and exit (no Docker needed)."),
    runtime: str = typer.Option(None, "--runtime", metavar="docker|process", help="Run the engine in a Docker container or as a process on this host (default: the recipe's `runtime:`, else docker)."),
    set_: list[str] = typer.Option(None, "--set", metavar="KEY=VALUE", help="Override a setting (checked, shown as a deviation)."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Show boot phases only (not the engine log) until ready."),
    replace: bool = typer.Option(False, "--replace", help="Stop the models metralectl is serving first (without it, a recipe that fits the memory budget starts beside them)."),
    budget: float = typer.Option(None, "--budget", metavar="GB", min=0, help="The box's memory budget in GB that models served side by side share (default: box.yaml's `budget:`, else the GPU's memory, else the host's RAM less the OS's share)."),
    keep_failed: bool = typer.Option(False, "--keep-failed", help="Keep a container that failed to start (for inspection)."),
    stall_timeout: float = typer.Option(300.0, "--stall-timeout", help="Fail when the engine shows no progress this long: no new log line and no change in its /health answer (s)."),
    boot_timeout: float = typer.Option(None, "--boot-timeout", help="Fail when not ready after this long (s; default: the hardware class's, 900 on GB10)."),
    no_weights_check: bool = typer.Option(False, "--no-weights-check", help="Start even if the weights are not in the cache (the engine downloads them)."),
    no_pull: bool = typer.Option(False, "--no-pull", help="Refuse instead of pulling a missing image or downloading missing weights."),
    rank: int = typer.Option(0, "--rank", help="With --print, for multi-rank recipes: which rank."),
    master_addr: str = typer.Option(None, "--master-addr", help="Multi-rank: the head's IP on the RoCE link (with --print; or, with --roce-interface, instead of detecting it)."),
    roce_interface: str = typer.Option(None, "--roce-interface", help="Multi-rank: NCCL_SOCKET_IFNAME, the ConnectX port with an IPv4 address on both nodes (with --print; or, with --master-addr, instead of detecting it)."),
    worker: str = typer.Option(None, "--worker", metavar="CONTEXT|URL", help="Multi-rank: the worker node's Docker endpoint (a `docker context` name, ssh://user@host, tcp://host:2376)."),
    head: str = typer.Option(None, "--head", metavar="CONTEXT|URL", help="Multi-rank: the head node's Docker endpoint (default: this machine's, as `docker` would pick it)."),
    first_request_timeout: float = typer.Option(120.0, "--first-request-timeout", help="Multi-rank: seconds the real 1-token request to the head may take before the worker counts as absent."),
    no_rdma: bool = typer.Option(False, "--no-rdma", help="Multi-rank: no RDMA devices (/dev/infiniband); NCCL over TCP sockets on the RoCE interface (slower)."),
    rdma_device: str = typer.Option(None, "--rdma-device", metavar="DEV", help="Multi-rank: NCCL_IB_HCA on every rank (with --print; or instead of the RDMA device detected behind the RoCE interface)."),
    as_json: bool = typer.Option(False, "--json", help="JSON on stdout (the spec with --print, the endpoint otherwise)."),
    on: str = typer.Option(None, "--on", metavar="kube[:CONTEXT]", help="Serve on a Kubernetes cluster through its API (docs/kubernetes.md)."),
    namespace: str = typer.Option(None, "--namespace", "-n", help="With --on kube: the namespace (default: the context's)."),
) -> None:
    """Serve a recipe and wait until it is really ready (--print: show the `docker run` instead).

    `--runtime process` starts the engine as a process on this host instead of a container (its program from
    PATH or engines.yaml in the config dir; docs/serving.md, "Running engines without Docker").

    A multi-rank (EP=2) recipe runs on two nodes: `--worker NODE` names the worker's Docker endpoint;
    the RoCE interface and the head's address on it are detected on both nodes (docs/multinode.md).
    """
    from metralectl.cli.catalog_cmds import _catalog
    from metralectl.errors import MetralError
    from metralectl.core.overrides import apply_sets

    catalog = _catalog()
    sets = _runtime_sets("run", runtime, set_ or [])
    recipe = apply_sets(catalog, catalog.recipe(recipe_name), sets)
    for key, old, new in recipe.deviations:
        note(style(f"deviation from the validated recipe: {clean(str(key))}: {clean(str(old))} -> {clean(str(new))}",
                   "33", sys.stderr))
    if print_only:
        from metralectl.lifecycle.specs import command_text, engine_environment, spec_here

        if not 0 <= rank < recipe.resources.world_size:
            raise MetralError(f"{recipe.name} has {count(recipe.resources.world_size, 'rank')}; --rank {rank} does not exist")
        spec = spec_here(catalog, recipe, rank=rank, master_addr=master_addr, roce_interface=roce_interface,
                         rdma=not no_rdma, rdma_device=rdma_device)
        from metralectl.lifecycle.placing import place_for_print

        spec = place_for_print(catalog, recipe, spec)  # on a box of several GPUs: the ones `run` would choose now
        if as_json:  # a host process: also every variable it gets, as it gets them
            extra = {"environment": engine_environment(spec)} if spec.is_process else {}
            print(json.dumps({**asdict(spec), **extra}, indent=2))
            return
        if recipe.multi_rank and not (master_addr and roce_interface):
            note(f"rank {rank} of {recipe.resources.world_size}: pass --master-addr (the head's RoCE IP) and "
                 "--roce-interface (the ConnectX port with an IPv4 address, same on both nodes)")
        if recipe.multi_rank and not (rdma_device or no_rdma):
            note("NCCL_IB_HCA is left out (NCCL then uses any RDMA device); --rdma-device DEV sets it (the device "
                 "behind the RoCE port: `ls /sys/class/net/IF/device/infiniband/`)")
        from metralectl.present.show_view import shown

        print(shown(command_text(spec)))  # a recipe's values, escaped for the terminal (--json: exact)
        return
    if on or namespace:
        _run_on(on, namespace, catalog, recipe, boot_timeout, as_json, worker or head, roce_interface, rdma_device,
                no_rdma)
        return
    from metralectl.app.serving import Change, MultiRank
    from metralectl.lifecycle.launch import LaunchOptions

    options = LaunchOptions(replace=replace, keep_failed=keep_failed, stall_timeout_s=stall_timeout,
                            boot_timeout_s=boot_timeout, check_weights=not no_weights_check, pull=not no_pull,
                            budget_gb=budget)
    multi = None
    if recipe.multi_rank and worker:
        multi = MultiRank(worker, head, roce_interface, master_addr, first_request_timeout, not no_rdma, rdma_device)
    elif recipe.multi_rank and head:
        raise typer.BadParameter("a multi-rank launch needs --worker (the worker node's Docker endpoint)")
    elif worker or head or no_rdma or rdma_device:
        raise typer.BadParameter(f"{recipe.name} is a single-node recipe; --worker/--head/--no-rdma/--rdma-device are "
                                 "for multi-rank recipes")
    change = Change.run(recipe_name, sets, options, multi)
    serving = _serving(catalog)
    _sigterm_as_interrupt()
    from metralectl.cli.staging_cmds import _Renderer

    with _Renderer() as view, _ctrl_c_cancels():
        launched = serving.run(change, _Progress(not detach, view))
    if multi is not None:
        from metralectl.cli.multirank_cmds import print_ready_multi

        print_ready_multi(launched, as_json)
    else:
        _print_ready(launched, as_json)


def _run_on(on: str | None, namespace: str | None, catalog: Any, recipe: Any, boot_timeout: float | None,
            as_json: bool, endpoint: str | None, roce_interface: str | None, rdma_device: str | None,
            no_rdma: bool) -> None:
    if not on:
        raise typer.BadParameter("--namespace is for --on kube")
    if endpoint:
        raise typer.BadParameter("--worker/--head name Docker endpoints; with --on kube the cluster places the ranks")
    from metralectl.cli import kube_cmds
    from metralectl.lifecycle.kube_export import KubeOptions

    kube_cmds.run(on, namespace, catalog, recipe, boot_timeout, as_json,
                  KubeOptions(roce_interface=roce_interface, rdma_device=rdma_device, rdma=not no_rdma))


def logs(
    recipe_name: str = typer.Argument(None, metavar="[RECIPE]", help="Whose logs (default: the one being served)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines until the container exits."),
    tail: int = typer.Option(200, "--tail", "-n", help="Lines of history to start with."),
    rank: int = typer.Option(None, "--rank", help="Multi-rank deployments: which rank's log (0 = the head, the default)."),
    last_failed: bool = typer.Option(False, "--last-failed", help="The kept log of the last failed start (of RECIPE)."),
    on: str = typer.Option(None, "--on", metavar="kube[:CONTEXT]", help="A pod's log on a Kubernetes cluster (the last --tail lines, -f: until it exits; the head's, or --rank's)."),
    namespace: str = typer.Option(None, "--namespace", help="With --on kube: the namespace (default: the context's)."),
) -> None:
    """The engine's log (stdout). With -f, follows and returns when the container exits. With no container
    (a start that failed and was cleaned up), the log metralectl kept of that start."""
    if on or namespace:
        if not on or last_failed:
            raise typer.BadParameter("--on kube takes RECIPE, -f, --tail, --rank and --namespace (no --last-failed)")
        from metralectl.cli import kube_cmds

        kube_cmds.logs(on, namespace, recipe_name, tail, rank, follow)
        return
    if last_failed:
        from metralectl.app.serving_logs import failed_start_log

        lines = failed_start_log(recipe_name, tail)
    else:
        lines = _serving().logs(recipe_name, rank=rank, follow=follow, tail=tail)
    color = color_enabled(sys.stdout)
    for line in lines:  # the engine's own output: its colours pass when we colour, no other control does
        print(log_line(line, color), flush=follow)


def _stopped_line(r: Any) -> str:
    how = "killed after the timeout" if r.killed else f"exited {r.exit_code}"
    return clean(f"stopped {r.name} ({r.recipe}): {how} in {r.stop_s:.1f} s; removed: {'yes' if r.removed else 'no'}; "
                 f"memory: {r.memory}")  # the recipe is the container's label


def stop(
    recipe_name: str = typer.Argument(None, metavar="[RECIPE]", help="Which recipe's container (default: the one served)."),
    all_: bool = typer.Option(False, "--all", help="Every metralectl container."),
    timeout: float = typer.Option(30.0, "--timeout", help="Seconds between SIGTERM and SIGKILL (--on kube: the pods' "
                                                          "grace, 30 s, plus this to end)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    on: str = typer.Option(None, "--on", metavar="kube[:CONTEXT]", help="Delete the recipe's objects on a Kubernetes cluster (RECIPE or --all)."),
    namespace: str = typer.Option(None, "--namespace", "-n", help="With --on kube: the namespace (default: the context's)."),
) -> None:
    """Stop gracefully (kill after --timeout), verify the container is gone and memory came back."""
    if on or namespace:
        if not on:
            raise typer.BadParameter("--namespace is for --on kube")
        from metralectl.cli import kube_cmds

        kube_cmds.stop(on, namespace, recipe_name, all_, timeout)
        return
    from metralectl.app.serving import Change, StopIncomplete

    _sigterm_as_interrupt()
    try:
        with _ctrl_c_cancels():
            stopped = _serving().stop(Change.stop(recipe_name, all_=all_, timeout_s=timeout), _Progress(False))
    except StopIncomplete as exc:  # what was stopped is printed, then the failure
        _print_stopped(exc.stopped, as_json)
        raise
    _print_stopped(stopped, as_json)


def _print_stopped(stopped: Any, as_json: bool) -> None:
    if stopped.nothing:
        note(f"nothing to stop: {stopped.why_nothing}" if stopped.why_nothing else "nothing to stop")
        if as_json:  # a script reads a value either way: the same list, empty
            print("[]")
        return
    if as_json:
        out = [{"rank": r.rank, "role": r.role, "endpoint": r.endpoint, "container": r.container, "error": r.error,
                **(asdict(r.result) if r.result else {})} for r in stopped.ranks]
        print(json.dumps(out + [asdict(r) for r in stopped.containers], indent=2))
        return
    for r in stopped.ranks:
        where = f"rank {r.rank} ({r.role}) on {r.endpoint}"
        if r.result is None:
            print(clean(f"{r.container} ({r.recipe}, {where}): {'already gone' if r.error == '' else r.error}"))
            continue
        how = "killed after the timeout" if r.result.killed else f"exited {r.result.exit_code}"
        print(clean(f"stopped {r.container} ({r.recipe}, {where}): {how} in {r.result.stop_s:.1f} s; "
                    f"removed: {'yes' if r.result.removed else 'no'}; memory: {r.result.memory}"))
    for c in stopped.containers:
        print(_stopped_line(c))


def swap(
    recipe_name: str = typer.Argument(..., metavar="RECIPE", help="The recipe to serve instead."),
    set_: list[str] = typer.Option(None, "--set", metavar="KEY=VALUE", help="Override a setting (checked)."),
    runtime: str = typer.Option(None, "--runtime", metavar="docker|process", help="Start the new engine in a Docker container or as a process on this host (default: its recipe's `runtime:`, else docker)."),
    drain_timeout: float = typer.Option(60.0, "--drain-timeout", help="Max seconds to wait for in-flight requests."),
    stall_timeout: float = typer.Option(300.0, "--stall-timeout", help="Fail when the new engine shows no progress this long: no new log line and no change in its /health answer (s)."),
    boot_timeout: float = typer.Option(None, "--boot-timeout", help="Fail when the new engine is not ready after this long (s)."),
    no_weights_check: bool = typer.Option(False, "--no-weights-check", help="Do not require the new weights in the cache."),
    no_pull: bool = typer.Option(False, "--no-pull", help="Refuse instead of staging a missing image or weights."),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
) -> None:
    """Replace the served model; if the new one does not become ready, restore the previous one."""
    from metralectl.app.serving import Change
    from metralectl.lifecycle.launch import LaunchOptions

    change = Change.swap(recipe_name, set_ or [], LaunchOptions(stall_timeout_s=stall_timeout, boot_timeout_s=boot_timeout,
                                                                check_weights=not no_weights_check, pull=not no_pull),
                         drain_timeout, runtime=runtime)
    serving = _serving()
    serving.resolve(change)  # an unknown recipe or a bad --set is refused here, before anything is released
    _sigterm_as_interrupt()
    from metralectl.cli.staging_cmds import _Renderer

    from metralectl.lifecycle.swap import SwapDegraded, SwapRolledBack

    try:
        with _Renderer() as view, _ctrl_c_cancels():
            result = serving.swap(change, _Progress(False, view))
    except (SwapRolledBack, SwapDegraded) as failed:
        if as_json and failed.result is not None:
            _print_swap(failed.result, True)  # the outcome on stdout, the failure on stderr and in the exit code
        raise
    _print_swap(result, as_json)


def _print_swap(result: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(asdict(result), indent=2))
        return
    split = ", ".join(f"{k} {v:.1f} s" for k, v in result.phases.items())
    print(clean(f"swapped {result.from_recipe} -> {result.to_recipe}: downtime {result.downtime_s:.1f} s ({split})"))
    print(f"endpoint  {clean(result.url)}/v1")
    print(f"model     {clean(result.model or '-', 200)}")


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("logs")(logs)
    app.command("stop")(stop)
    app.command("swap")(swap)
