"""The multi-rank (EP=2) side of `run`, `logs` and `stop`: both ranks, each on its node's Docker daemon
(docs/multinode.md). Always direct: the worker's daemon is reached through the Docker SDK, not the agent."""

from __future__ import annotations

from typing import Any

from metralectl.cli.serve_cmds import _Progress, _runtime, print_ready


def print_ready_multi(launched: Any, as_json: bool) -> None:
    print_ready(launched, as_json, [
        f"roce      NCCL_SOCKET_IFNAME={launched.roce_interface}; master {launched.master_addr}:{launched.master_port}",
        *(f"rank {rank.rank}    {rank.container} ({rank.role}) on {rank.endpoint} [{rank.node}]"
          for rank in launched.ranks),
        f"run       {launched.run_id}; logs: metralectl logs -f {launched.recipe} --rank N"])


def run_multi(recipe: Any, catalog: Any, options: Any, *, worker: str, head: str | None, roce_interface: str | None,
               master_addr: str | None, first_request_timeout: float, detach: bool, as_json: bool,
               rdma: bool = True, rdma_device: str | None = None) -> None:
    """`run RECIPE --worker NODE`: both ranks of a multi-rank recipe, each on its node's Docker daemon."""
    from metralectl.cli.staging_cmds import _Renderer
    from metralectl.lifecycle.multinode import MultiOptions, launch_multi
    from metralectl.seams.docker_runtime import endpoint_for, open_runtime
    from metralectl.seams.process import sigterm_as_interrupt
    from metralectl.seams.store import lifecycle_lock

    multi = MultiOptions(roce_interface=roce_interface, master_addr=master_addr,
                         first_request_timeout_s=first_request_timeout, rdma=rdma, rdma_device=rdma_device)
    # SIGTERM takes the Ctrl-C path (the same cleanup as an interrupted start)
    with sigterm_as_interrupt(), (open_runtime(endpoint_for(head, "head")) if head else _runtime()) as head_rt, \
            open_runtime(endpoint_for(worker, "worker")) as worker_rt, \
            lifecycle_lock(f"run {recipe.name}"), _Renderer() as view:
        if not head:
            from metralectl.lifecycle.swap import repair_if_needed

            repair_if_needed(head_rt, catalog, on_event=_Progress(False, view))
        launched = launch_multi(recipe, catalog, head_rt, worker_rt, options=options, multi=multi,
                                on_event=_Progress(not detach, view))
    print_ready_multi(launched, as_json)


def rank_logs(recipe_name: str | None, rank: int | None, follow: bool, tail: int) -> bool:
    """One rank's log of a recorded multi-rank deployment; False when none is meant (the single-node path)."""
    from metralectl.errors import MetralError
    from metralectl.lifecycle import deployment

    if recipe_name is not None:
        dep = deployment.find(recipe_name)
    else:
        found = deployment.load_all()
        if len(found) > 1:
            raise MetralError(f"several multi-rank deployments ({', '.join(d.recipe for d in found)}); name one",
                              "`metralectl logs RECIPE --rank N`")
        dep = found[0] if found else None
    if dep is None:
        if rank not in (None, 0):
            raise MetralError("--rank is for multi-rank deployments (`run RECIPE --worker NODE`); none is recorded"
                              + (f" for {recipe_name}" if recipe_name else ""), "`metralectl ps` lists what runs")
        return False
    record = dep.rank(rank or 0)
    with deployment.Runtimes() as runtimes:
        runtime = runtimes.require(record)
        container = (runtime.inspect(record.container_id) if record.container_id else None) or runtime.inspect(record.container)
        if container is None:
            raise MetralError(f"rank {record.rank} of {dep.recipe} ({record.container} on {record.endpoint}) is gone",
                              f"`metralectl stop {dep.recipe}` cleans up; its start-up log is under $METRALE_HOME/logs/")
        if not follow:
            for line in runtime.log_tail(container.id, tail):
                print(line)
        else:
            for line in runtime.follow_logs(container.id, tail=tail):
                print(line, flush=True)
    return True


def stop_deployments(runtime: Any, recipe_name: str | None, all_: bool, timeout: float) -> tuple[list[Any], set[str]]:
    """Stop the multi-rank deployments this `stop` names, every rank on its node; (results, recipes stopped)."""
    from metralectl.lifecycle import deployment
    from metralectl.lifecycle.memory import NvmlMemoryWatch
    from metralectl.lifecycle.multinode import RemoteMemory, stop_deployment

    found = deployment.load_all()
    if all_:
        chosen = found
    elif recipe_name is not None:
        chosen = [d for d in found if d.recipe == recipe_name]
    else:  # no name: the deployment, when it is all that runs here
        running = [c.name for c in runtime.containers() if c.running]
        ours = {r.container for d in found for r in d.ranks if r.endpoint == runtime.endpoint.url}
        chosen = found if len(found) == 1 and all(name in ours for name in running) else []
    results = []
    local_url = runtime.endpoint.url
    with deployment.Runtimes(runtime) as runtimes:
        for dep in chosen:
            results += [(dep, r) for r in stop_deployment(
                dep, runtimes, timeout_s=timeout, on_event=_Progress(False),
                memory_for=lambda rt: NvmlMemoryWatch(rt) if rt.endpoint.url == local_url else RemoteMemory())]
    return results, {d.recipe for d in chosen}
