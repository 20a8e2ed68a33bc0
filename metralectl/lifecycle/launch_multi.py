"""`run --worker`: a multi-rank (EP=2) launch, N single-rank launches on N nodes (docs/multinode.md).

The topology (which node runs which rank, the RoCE interface and master address, each rank's arguments
and environment) is lifecycle/multinode.py's; what each node must hold first, lifecycle/node_stage.py's
and lifecycle/rdma.py's. The ranks then start, are followed and waited for, and are kept or removed as
any launch's (lifecycle/ranks.py `boot`, one start, one waiting loop, one clean-up); what only a
multi-rank launch adds is its deployment record on disk (written before anything starts, so `ps` and
`stop` find every rank even if we die mid-launch) and the real first request the waiting loop sends
(a head whose worker is gone stays healthy but hangs requests).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from metralectl.core.catalog import Catalog
from metralectl.core.recipe import Recipe
from metralectl.core.render import ContainerSpec
from metralectl.lifecycle import deployment
from metralectl.lifecycle.deployment import Deployment
from metralectl.lifecycle.events import Listener, Step, ignore
from metralectl.lifecycle.launch import LaunchOptions, check_containers
from metralectl.lifecycle.multinode import (LaunchedMulti, MultiOptions, Node, RankLaunched, check_ports,
                                            choose_network, connect_nodes, head_url, probe_nodes, rank_records,
                                            rank_specs, refuse_unless_two_ranks)
from metralectl.lifecycle.node_stage import check_weights, stage_nodes
from metralectl.lifecycle.ranks import Rank, boot, new_run_id
from metralectl.lifecycle.rdma import check_rdma
from metralectl.lifecycle.stop import stop_containers, stop_deployments_on
from metralectl.seams import store
from metralectl.seams.docker.protocol import ContainerRuntime


def launch_multi(recipe: Recipe, catalog: Catalog, head: ContainerRuntime, worker: ContainerRuntime, *,
                 options: LaunchOptions = LaunchOptions(), multi: MultiOptions = MultiOptions(),
                 on_event: Listener = ignore, gpus_override: str | int | None = "recipe") -> LaunchedMulti:
    """Connect, stage and probe both nodes, render both ranks, refuse what cannot run, then start and wait."""
    refuse_unless_two_ranks(recipe, catalog)
    nodes = connect_nodes(head, worker, on_event)
    url = head_url(nodes[0].endpoint, recipe.resources.bind, recipe.resources.ranks[0].port)
    commit = stage_nodes(recipe, catalog, nodes, options, on_event)
    probes = probe_nodes(recipe, catalog, nodes, multi.probe_timeout_s, on_event)
    interface, master_addr, notes = choose_network(recipe, catalog, nodes, probes, multi, on_event)
    check_weights(recipe, nodes, commit, options, on_event)
    hcas = check_rdma(nodes, catalog.hardware[recipe.hardware].rank_profile, interface, rdma=multi.rdma,
                      given_device=multi.rdma_device, on_event=on_event)
    specs = rank_specs(recipe, catalog, nodes, interface, master_addr, hcas, multi, on_event, gpus_override)
    replacing = []
    for node, spec in zip(nodes, specs):
        replacing += [(node, c) for c in check_containers(recipe, node.runtime, spec, options, where=f" on {node.label}")]
    master_port = recipe.resources.master_port or 29500
    if not replacing:
        check_ports(nodes, specs, master_addr, master_port)
    if options.replace:
        for node in nodes:
            stop_deployments_on(node.runtime, on_event)
        for node, container in replacing:
            if node.runtime.inspect(container.id) is None:
                continue  # went with its deployment
            for result in stop_containers(node.runtime, [container], on_event=on_event):
                on_event(Step("replaced", f"{result.name} on {node.label}"))
        deployment.forget_gone({n.endpoint.url: n.runtime for n in nodes})
    for node, spec in zip(nodes, specs):
        stale = node.runtime.inspect(spec.name)
        if stale is not None:  # ours, not running: a leftover of an earlier failed run
            node.runtime.remove(stale.id, force=True)
    return start_and_wait_multi(recipe, catalog, nodes, specs, url, interface, master_addr, master_port, options,
                                multi, on_event, tuple(notes))


def start_and_wait_multi(recipe: Recipe, catalog: Catalog, nodes: Sequence[Node], specs: Sequence[ContainerSpec],
                         url: str, interface: str, master_addr: str, master_port: int, options: LaunchOptions,
                         multi: MultiOptions, on_event: Listener, notes: tuple[str, ...] = ()) -> LaunchedMulti:
    """Every rank on its node, as lifecycle/ranks.py starts any launch's ranks (the head first), with the
    deployment record written before anything starts, so ps/stop find every rank even if we die mid-launch."""
    run_id = new_run_id()
    ranks = [Rank(n.rank, n.runtime, s, store.logs_dir() / f"{run_id}-{recipe.name}-r{n.rank}.log", n.role, n.where)
             for n, s in zip(nodes, specs)]
    records = rank_records(nodes, specs, interface, master_addr)
    record = _Record(Deployment(run_id, recipe.name, "starting", url, interface, master_addr, master_port, records,
                                time.time(), tuple(options.sets), notes))
    booted = boot(recipe, catalog, ranks, run_id, url, options, on_event, record=record,
                  answer_timeout_s=multi.first_request_timeout_s, network=interface, run_entry={
                      "ranks": [{"rank": r.rank, "endpoint": r.endpoint, "container": r.container} for r in records],
                      "roce_interface": interface, "master_addr": master_addr})
    launched = tuple(RankLaunched(n.rank, n.role, n.endpoint.url, n.host, r.spec.name,
                                  r.container.id if r.container else "", str(r.log_path)) for n, r in zip(nodes, ranks))
    return LaunchedMulti(run_id, recipe.name, url, booted.model, booted.ready_s, interface, master_addr, master_port,
                         launched, booted.phases, notes)


class _Record:
    """The deployment record of a launch: saved before anything starts, each container's id as it starts,
    "ready" once serving, "failed" when containers were kept (or left), forgotten once every rank is gone."""

    def __init__(self, record: Deployment) -> None:
        self.record = record
        deployment.save(record)

    def started(self, rank: int, container_id: str) -> None:
        self.record = replace(self.record, ranks=tuple(replace(r, container_id=container_id) if r.rank == rank else r
                                                       for r in self.record.ranks))
        deployment.save(self.record)

    def settled(self, state: str) -> None:
        if state == "gone":
            deployment.forget(self.record.recipe, self.record.run_id)
        else:
            deployment.save(self.record.with_state(state))
