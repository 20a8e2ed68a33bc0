"""Multi-rank (EP=2) launches across two nodes: one recipe, each rank on its node's Docker daemon.

Each node is reached the way the Docker CLI reaches it (a context, ssh://, tcp:// with TLS) through
the same ContainerRuntime seam a single-node launch uses; nothing new runs on the nodes but the
engine's own image. The flow (docs/multinode.md):

1. connect to both daemons (distinct daemons, or refuse);
2. stage: the image on each node (pulled there when missing), the same image revision on both;
   the weights verified in each node's HF cache;
3. probe each node with a short-lived container of its engine image (host network, the HF cache
   read-only): its IPv4 interfaces, listening ports and verified snapshots (`netprobe`); choose
   the RoCE interface both nodes have an address on; the head's address there is --master-addr;
4. render both ranks from the one recipe and refuse unless they agree on the rank-symmetric flags
   and the NCCL environment;
5. start the head, then the worker at once (each waits for the other at the rendezvous), follow
   both logs, poll the head's /health from the start, and call it ready only when /health is 200
   AND a real 1-token request was answered (a head whose worker is gone stays healthy but hangs
   requests); log lines are hints for phases and failure causes;
6. any rank failing (exit, rendezvous timeout, flags mismatch, stuck at "all ranks ready", hung
   request) tears both down and says which rank and why; Ctrl-C does too.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from metralectl.seams import machine, netprobe, store
from metralectl.seams.hf import cache as hfcache, state as hfstate

from metralectl.seams.docker import images as docker_images

from metralectl import paths
from metralectl.core.catalog import Catalog
from metralectl.seams.endpoint import EngineClient, Health, base_url
from metralectl.errors import MetralError
from metralectl.lifecycle import deployment
from metralectl.core.contract import EngineContract, Readiness
from metralectl.lifecycle.boot import REMEDIES, BootLog, Diagnosis, diagnose_exit, message_of
from metralectl.lifecycle.deployment import Deployment, RankRecord, Runtimes
from metralectl.lifecycle.events import (ContainerStarted, Failed, Listener, LogLine, Phase, Ready, Step, Transfer,
                                         Warning_, ignore)
from metralectl.lifecycle.launch import (DRAIN_S, HOLD_S, POLL_WAIT_S, LaunchFailed,
                                         LaunchOptions, check_containers)
from metralectl.lifecycle.memory import MemoryWatch, NoMemoryWatch
from metralectl.lifecycle.rdma import check_rdma
from metralectl.lifecycle.readiness import (BootClock, HealthPoller, fault_diagnosis, stall_diagnosis, timeout_diagnosis,
                                            warnings_at_ready)
from metralectl.lifecycle.stop import StopResult, stop_containers
from metralectl.core.recipe import Recipe
from metralectl.core.labels import LABEL_ENDPOINT, LABEL_OWNER, LABEL_RUN_ID, LABEL_SETS
from metralectl.core.render import ContainerSpec, owner, spec_for
from metralectl.seams.docker.containers import ContainerInfo
from metralectl.seams.docker.endpoints import Endpoint
from metralectl.seams.docker.errors import GPU_CAUSES, RuntimeCause, RuntimeFailure
from metralectl.seams.docker.protocol import ContainerRuntime
from metralectl.wording import count

ARCH_NAMES = {"arm64": "aarch64", "aarch64": "aarch64", "amd64": "x86_64", "x86_64": "x86_64"}
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class MultiOptions:
    roce_interface: str | None = None  # skip detection (with master_addr)
    master_addr: str | None = None
    first_request_timeout_s: float = 120.0  # the real 1-token request after /health is 200
    probe_timeout_s: float = 60.0
    rdma: bool = True  # False (`--no-rdma`): no RDMA devices, NCCL over TCP sockets
    rdma_device: str | None = None  # NCCL_IB_HCA on every rank, instead of the detected one


@dataclass
class Node:
    rank: int
    role: str
    runtime: ContainerRuntime
    daemon_id: str
    host: str  # the daemon's host name
    arch: str  # aarch64 | x86_64 | ...
    probe: netprobe.ProbeReport | None = None

    @property
    def endpoint(self) -> Endpoint:
        return self.runtime.endpoint

    @property
    def label(self) -> str:
        where = "this machine" if self.endpoint.is_local else self.endpoint.describe()
        return f"rank {self.rank} ({self.role}) on {where}"


@dataclass(frozen=True)
class RankLaunched:
    rank: int
    role: str
    endpoint: str
    node: str
    container: str
    container_id: str
    log_path: str


@dataclass(frozen=True)
class LaunchedMulti:
    run_id: str
    recipe: str
    url: str
    model: str | None
    ready_s: float
    roce_interface: str
    master_addr: str
    master_port: int
    ranks: tuple[RankLaunched, ...]
    phases: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


# --- pure checks -----------------------------------------------------------------------------------
def flag_value(command: Sequence[str], name: str) -> str | bool | None:
    """A flag's value in a rendered command: its word, True for a presence-only flag, None when absent."""
    words = list(command)
    for i, word in enumerate(words):
        if word == f"--{name}":
            following = words[i + 1] if i + 1 < len(words) else None
            return True if following is None or following.startswith("--") else following
        if word.startswith(f"--{name}="):
            return word.split("=", 1)[1]
    return None


def symmetry_problems(specs: Sequence[ContainerSpec], contract: EngineContract) -> list[str]:
    """Why these rendered ranks may not run together (empty: they may). The book's rules:
    identical --speculative/--mtp-quantization/--num-drafts and NCCL settings, one image and
    checkpoint, one world size and rendezvous address, distinct ranks."""
    problems: list[str] = []
    if len(specs) < 2:
        return problems
    head = specs[0]
    for name in contract.rank_symmetric:
        values = [flag_value(s.command, name) for s in specs]
        if len({repr(v) for v in values}) > 1:
            shown = ", ".join(f"rank {s.rank}: {_shown(v)}" for s, v in zip(specs, values))
            problems.append(f"--{name} differs between ranks ({shown}); the worker would crash with an SSM "
                            "intermediate-buffer error")
    # NCCL_IB_HCA names each node's own RDMA device (detected per node), so it may differ between ranks
    nccl = [{k: v for k, v in s.env.items() if k.startswith("NCCL_") and k != "NCCL_IB_HCA"} for s in specs]
    for spec, env in zip(specs[1:], nccl[1:]):
        differ = sorted(k for k in set(env) | set(nccl[0]) if env.get(k) != nccl[0].get(k))
        if differ:
            problems.append(f"the NCCL environment differs between rank 0 and rank {spec.rank} ({', '.join(differ)})")
    for spec in specs[1:]:
        if spec.image != head.image:
            problems.append(f"rank {spec.rank} runs {spec.image}, the head {head.image}")
        if spec.command[:2] != head.command[:2]:
            problems.append(f"rank {spec.rank} serves {' '.join(spec.command[:2])}, the head {' '.join(head.command[:2])}")
    for name in ("world-size", "master-addr", "master-port"):
        if len({repr(flag_value(s.command, name)) for s in specs}) > 1:
            problems.append(f"--{name} differs between ranks")
    ranks = [flag_value(s.command, "rank") for s in specs]
    if ranks != [str(i) for i in range(len(specs))]:
        problems.append(f"ranks must be 0..{len(specs) - 1} in order, not {', '.join(map(str, ranks))}")
    ports = [s.port for s in specs]
    if len(set(ports)) != len(ports):
        problems.append(f"each rank needs its own port, not {', '.join(map(str, ports))}")
    if any(s.env.get("NCCL_NVLS_ENABLE", "0") != "0" for s in specs) and "NCCL_NVLS_ENABLE" in nccl[0]:
        problems.append("NCCL_NVLS_ENABLE must be 0 (NVLink-SHARP crashes aarch64 Blackwell: NaN after the first request)")
    return problems


def _shown(value: str | bool | None) -> str:
    return "absent" if value is None else ("present" if value is True else str(value))


def head_url(endpoint: Endpoint, bind: str, port: int) -> str:
    """Where this machine reaches the head's HTTP server."""
    if endpoint.is_local:
        return base_url(bind, port)
    if bind in LOOPBACK:
        raise MetralError(f"the head would serve on {bind}:{port} of {endpoint.describe()}, which this machine cannot "
                          "reach to check it",
                          "run metralectl on the head node (the head is then the local Docker daemon), or serve on an "
                          "address this machine reaches (`--set resources.bind=<head's LAN IP>`)")
    host = endpoint.host if bind in ("0.0.0.0", "::", "") else bind
    return base_url(host, port)


# --- nodes ------------------------------------------------------------------------------------------
def connect_nodes(head: ContainerRuntime, worker: ContainerRuntime, on_event: Listener = ignore) -> list[Node]:
    nodes = []
    for rank, (role, runtime) in enumerate((("head", head), ("worker", worker))):
        daemon_id, host, arch = runtime.daemon_identity()
        node = Node(rank, role, runtime, daemon_id, host, ARCH_NAMES.get(arch.lower(), arch.lower()))
        nodes.append(node)
        on_event(Step("node", f"{node.label}: Docker {runtime.server_version()} on host {host} ({node.arch})"))
    if nodes[0].daemon_id and nodes[0].daemon_id == nodes[1].daemon_id:
        raise MetralError(f"the head and the worker are the same Docker daemon ({head.endpoint.describe()} and "
                          f"{worker.endpoint.describe()}); EP=2 needs two nodes",
                          "name the worker node's own daemon with --worker (a context or ssh://user@worker)")
    return nodes


def _image_on(node: Node, recipe: Recipe, catalog: Catalog, options: LaunchOptions, on_event: Listener) -> None:
    info = catalog.image_for(recipe)
    try:
        state = node.runtime.image_state(info.ref, info.revision_label)
        if not state.present and options.pull:
            on_event(Step("image", f"{info.ref} is not on {node.label}: pulling it there"))
            docker_images.pull(info, node.runtime, node.arch, lambda layer: on_event(Transfer("image", layer)))
        docker_images.image_preflight(info, node.runtime, node.arch, recipe.name)
    except MetralError as exc:
        raise MetralError(f"{node.label}: {exc.message}",
                          f"on that node: `docker pull {info.ref}` (or `metralectl pull {recipe.name}` there)"
                          + (f"; {exc.hint}" if exc.hint else "")) from None


def stage_nodes(recipe: Recipe, catalog: Catalog, nodes: Sequence[Node], options: LaunchOptions,
                on_event: Listener) -> str | None:
    """The image on every node, one revision everywhere; the weights on a local head. Returns the
    checkpoint commit the head will serve (None when it cannot be known here)."""
    from metralectl.lifecycle.launch import stage

    info = catalog.image_for(recipe)
    commit: str | None = recipe.checkpoint.revision
    for node in nodes:
        if node.rank == 0 and node.endpoint.is_local and node.arch == machine.cpu_arch():
            stage(recipe, catalog, node.runtime, options, on_event)  # image and weights, as a single-node run
            cache = hfstate.checkpoint_state(recipe.checkpoint)
            commit = commit or cache.commit
        else:
            on_event(Step("image", f"{info.ref} on {node.label}"))
            _image_on(node, recipe, catalog, options, on_event)
    states = [n.runtime.image_state(info.ref, info.revision_label) for n in nodes]
    revisions = {s.revision for s in states}
    if len(revisions) > 1:
        shown = "; ".join(f"{n.label}: {s.revision or 'no revision label'}" for n, s in zip(nodes, states))
        raise MetralError(f"the nodes hold different builds of {info.ref} ({shown}); both ranks must run the same engine",
                          f"pull the same image on both nodes (`docker pull {info.ref}` on each), then run again")
    if len({s.image_id for s in states}) > 1:
        on_event(Warning_(f"{info.ref} has the same revision ({states[0].revision}) but different image IDs on the nodes "
                          "(built or pulled separately)"))
    return commit


def _probe(node: Node, image: str, repo_dir: str, timeout_s: float) -> netprobe.ProbeReport:
    script = netprobe.probe_script(repo_dir)
    hub = str(paths.hf_hub_cache())
    try:
        code, output = node.runtime.run_probe(image, script, read_only={hub: netprobe.HUB_MOUNT}, timeout_s=timeout_s)
    except RuntimeFailure as exc:
        if exc.cause is not RuntimeCause.MOUNT_SOURCE_MISSING:
            raise
        code, output = node.runtime.run_probe(image, script, timeout_s=timeout_s)  # no HF cache there at all
    if code is None:
        raise MetralError(f"the probe container on {node.label} did not finish within {timeout_s:g} s")
    return netprobe.parse_probe(output)


def probe_nodes(recipe: Recipe, catalog: Catalog, nodes: Sequence[Node], timeout_s: float,
                on_event: Listener) -> dict[int, netprobe.ProbeReport | MetralError]:
    """Probe every node at once; each answer is a report or the error that kept it from running."""
    image = catalog.image_for(recipe).ref
    repo_dir = hfcache.repo_dir(recipe.checkpoint.repo).name
    on_event(Step("probe", f"network and HF cache of {len(nodes)} nodes (a short-lived {image} container on each, "
                           "host network)"))

    def one(node: Node) -> netprobe.ProbeReport | MetralError:
        try:
            return _probe(node, image, repo_dir, timeout_s)
        except MetralError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        answers = list(pool.map(one, nodes))
    return {node.rank: answer for node, answer in zip(nodes, answers)}


def choose_network(recipe: Recipe, catalog: Catalog, nodes: Sequence[Node],
                   probes: dict[int, netprobe.ProbeReport | MetralError], multi: MultiOptions,
                   on_event: Listener) -> tuple[str, str, list[str]]:
    """(RoCE interface, master address, notes): detected, or the operator's, checked against what was seen."""
    hardware = catalog.hardware[recipe.hardware]
    roce = [str(i) for i in (hardware.multi_node or {}).get("roce-interfaces") or []]
    failed = {rank: answer for rank, answer in probes.items() if isinstance(answer, MetralError)}
    views = []
    for node in nodes:
        answer = probes[node.rank]
        if isinstance(answer, netprobe.ProbeReport):
            node.probe = answer
            views.append(netprobe.NodeView(node.label, answer.net))
    given = multi.roce_interface and multi.master_addr
    if failed and not given:
        detail = "; ".join(f"{nodes[r].label}: {e.message}" for r, e in failed.items())
        raise MetralError(f"cannot detect the RoCE interface: {detail}",
                          "pass `--roce-interface IF --master-addr IP` (IF: the ConnectX port with an IPv4 address on "
                          "both nodes, e.g. enp1s0f0np0; IP: the head's address on it)")
    if given:
        assert multi.roce_interface is not None and multi.master_addr is not None
        for rank, error in failed.items():
            on_event(Warning_(f"{nodes[rank].label}: detection could not run ({error.message}); using the given "
                              f"--roce-interface {multi.roce_interface} --master-addr {multi.master_addr}"))
        notes = netprobe.check_given(multi.roce_interface, multi.master_addr, views) if not failed else []
        for view in views:
            on_event(Step("network", f"{view.label}: {netprobe.describe(view.net, roce, multi.roce_interface)}"))
        for note in notes:
            on_event(Warning_(note))
        on_event(Step("roce", f"NCCL_SOCKET_IFNAME={multi.roce_interface} (given), master {multi.master_addr}"))
        return multi.roce_interface, multi.master_addr, notes
    if multi.roce_interface or multi.master_addr:
        raise MetralError("--roce-interface and --master-addr go together (or neither: metralectl detects both)")
    try:
        choice = netprobe.choose_roce(roce, views)
    except netprobe.RoceRefused:
        for view in views:
            on_event(Step("network", f"{view.label}: {netprobe.describe(view.net, roce)}"))
        raise
    for view in views:
        on_event(Step("network", f"{view.label}: {netprobe.describe(view.net, roce, choice.interface)}"))
    for note in choice.notes:
        on_event(Warning_(note))
    on_event(Step("roce", f"NCCL_SOCKET_IFNAME={choice.interface} on both nodes; --master-addr {choice.master_addr} "
                          f"(the head's address on {choice.interface})"))
    return choice.interface, choice.master_addr, list(choice.notes)


def check_weights(recipe: Recipe, nodes: Sequence[Node], head_commit: str | None, options: LaunchOptions,
                  on_event: Listener) -> None:
    """The checkpoint verified (by `metralectl pull`) in each remote node's HF cache, at the head's commit."""
    if not options.check_weights:
        return
    repo = recipe.checkpoint.repo
    hub = paths.display(paths.hf_hub_cache())
    for node in nodes:
        if node.rank == 0 and node.endpoint.is_local:
            continue  # staged from this machine's own cache
        view = node.probe.hub if node.probe is not None else None
        if view is None:
            on_event(Warning_(f"{node.label}: the weights could not be checked (the probe did not run)"))
            continue
        wanted = head_commit or (nodes[0].probe.hub.ref_main if nodes[0].probe and nodes[0].probe.hub else None)
        found = netprobe.hub_summary(view)
        ok = (wanted in view.verified) if wanted else bool(view.verified)
        on_event(Step("weights", f"{repo} on {node.label}: {found}"))
        if not ok:
            at = f" at {wanted[:12]}" if wanted else ""
            raise MetralError(f"weights on {node.label}: {repo}{at} is not verified in {hub} there ({found})",
                              f"on that node, run `metralectl pull {recipe.name}` (the HF cache must be at the same "
                              f"path, {hub}, on both nodes); --no-weights-check lets the engine fetch them itself")


def check_ports(nodes: Sequence[Node], specs: Sequence[ContainerSpec], master_addr: str, master_port: int) -> None:
    for node, spec in zip(nodes, specs):
        if node.probe is None:
            continue
        wanted = [(spec.bind, spec.port, "HTTP" if node.rank == 0 else "rank")]
        if node.rank == 0:
            wanted.append((master_addr, master_port, "rendezvous (master-port)"))
        for bind, port, what in wanted:
            holders = node.probe.net.port_holders(bind, port)
            if holders:
                raise MetralError(f"port {port} ({what}) on {node.label} is already in use ({', '.join(holders)})",
                                  f"free it (on that node: `ss -ltnp 'sport = :{port}'`) or "
                                  f"`--set resources.{'master-port' if 'master' in what else 'port'}=N`")


# --- launch ------------------------------------------------------------------------------------------
def launch_multi(recipe: Recipe, catalog: Catalog, head: ContainerRuntime, worker: ContainerRuntime, *,
                 options: LaunchOptions = LaunchOptions(), multi: MultiOptions = MultiOptions(),
                 on_event: Listener = ignore, gpus_override: str | int | None = "recipe") -> LaunchedMulti:
    hardware = catalog.hardware[recipe.hardware]
    if not recipe.multi_rank:
        raise MetralError(f"{recipe.name} is a single-node recipe; --worker is for multi-rank recipes")
    if recipe.resources.world_size != 2:
        raise MetralError(f"{recipe.name} has {recipe.resources.world_size} ranks; metralectl launches two-node "
                          "(EP=2) deployments: one head and one worker")
    if not (hardware.multi_node or {}).get("roce-interfaces"):
        raise MetralError(f"hardware class {hardware.id} has no multi-node settings (RoCE interfaces, NCCL environment)",
                          "multi-node launches are described for GB10 only")
    nodes = connect_nodes(head, worker, on_event)
    url = head_url(nodes[0].endpoint, recipe.resources.bind, recipe.resources.ranks[0].port)
    commit = stage_nodes(recipe, catalog, nodes, options, on_event)
    probes = probe_nodes(recipe, catalog, nodes, multi.probe_timeout_s, on_event)
    interface, master_addr, notes = choose_network(recipe, catalog, nodes, probes, multi, on_event)
    check_weights(recipe, nodes, commit, options, on_event)
    hcas = check_rdma(nodes, hardware.rank_profile, interface, rdma=multi.rdma, given_device=multi.rdma_device,
                      on_event=on_event)
    specs = [spec_for(catalog, recipe, rank=n.rank, master_addr=master_addr, roce_interface=interface,
                      gpus_override=gpus_override, rdma=multi.rdma, rdma_device=hcas[n.rank]) for n in nodes]
    problems = symmetry_problems(specs, catalog.engines[recipe.engine])
    if problems:
        raise MetralError(f"the two ranks of {recipe.name} do not agree: " + "; ".join(problems),
                          "head and worker are rendered from one recipe; remove per-rank overrides of these settings")
    on_event(Step("symmetry", "both ranks: " + ", ".join(
        f"--{k} {_shown(flag_value(specs[0].command, k))}" for k in catalog.engines[recipe.engine].rank_symmetric)
        + f"; identical NCCL environment ({count(len([k for k in specs[0].env if k.startswith('NCCL_')]), 'variable')})"
        + (f"; {', '.join(specs[0].devices + tuple('--cap-add ' + c for c in specs[0].cap_add))}"
           if specs[0].devices or specs[0].cap_add else "")))
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
        _forget_gone(nodes)
    for node, spec in zip(nodes, specs):
        stale = node.runtime.inspect(spec.name)
        if stale is not None:  # ours, not running: a leftover of an earlier failed run
            node.runtime.remove(stale.id, force=True)
    return start_and_wait_multi(recipe, catalog, nodes, specs, url, interface, master_addr, master_port, options,
                                multi, on_event, tuple(notes))


def _forget_gone(nodes: Sequence[Node]) -> None:
    """Drop deployment records whose containers on these nodes are all gone (after a --replace)."""
    by_url = {n.endpoint.url: n.runtime for n in nodes}
    for dep in deployment.load_all():
        if all(r.endpoint in by_url and by_url[r.endpoint].inspect(r.container_id or r.container) is None
               for r in dep.ranks):
            deployment.forget(dep.recipe, dep.run_id)


def start_and_wait_multi(recipe: Recipe, catalog: Catalog, nodes: Sequence[Node], specs: Sequence[ContainerSpec],
                         url: str, interface: str, master_addr: str, master_port: int, options: LaunchOptions,
                         multi: MultiOptions, on_event: Listener, notes: tuple[str, ...] = ()) -> LaunchedMulti:
    run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    log_paths = {n.rank: store.logs_dir() / f"{run_id}-{recipe.name}-r{n.rank}.log" for n in nodes}
    boot_timeout = options.boot_timeout_s or catalog.hardware[recipe.hardware].boot_timeout_s
    contract = catalog.engines[recipe.engine]
    records = tuple(RankRecord(n.rank, n.role, n.endpoint.url, n.endpoint.source, n.endpoint.spec, n.host, s.name,
                               "", s.port, master_addr if n.rank == 0 else _address_on(n, interface))
                    for n, s in zip(nodes, specs))
    record = Deployment(run_id, recipe.name, "starting", url, interface, master_addr, master_port, records, time.time(),
                        tuple(options.sets), notes)
    deployment.save(record)  # before anything starts: ps/stop can find every rank even if we die mid-launch
    containers: dict[int, ContainerInfo] = {}
    started = time.monotonic()
    try:
        for node, spec in zip(nodes, specs):  # head first: it binds the rendezvous; the worker retries until then
            labels = {LABEL_RUN_ID: run_id, LABEL_SETS: "\x1f".join(options.sets)}
            if node.rank == 0:
                labels[LABEL_ENDPOINT] = url
            on_event(Step("starting", f"{spec.name} ({node.label})"))
            try:
                containers[node.rank] = node.runtime.create_and_start(spec, labels)
            except RuntimeFailure as exc:
                cause = "gpu-runtime-missing" if exc.cause in GPU_CAUSES else "start-refused"
                raise LaunchFailed(Diagnosis(cause, f"{node.label}: {exc.message}", exc.hint or REMEDIES.get(cause, "")),
                                   [], str(log_paths[node.rank])) from None
            on_event(ContainerStarted(spec.name, containers[node.rank].id, run_id))
            record = replace(record, ranks=tuple(replace(r, container_id=containers[r.rank].id)
                                                 if r.rank in containers else r for r in record.ranks))
            deployment.save(record)
        boots = {n.rank: BootLog(contract, s.bind, s.port) for n, s in zip(nodes, specs)}
        phases = _wait_ready(nodes, containers, boots, log_paths, url, boot_timeout, options.stall_timeout_s,
                             multi.first_request_timeout_s, started, interface, on_event, contract.readiness)
        with EngineClient(url) as client:
            model = client.served_model()
        elapsed = time.monotonic() - started
        on_event(Ready(url, model, elapsed))
        deployment.save(record.with_state("ready"))
        store.append_jsonl(store.state_dir() / "runs.jsonl", {
            "run_id": run_id, "recipe": recipe.name, "outcome": "ready", "container": specs[0].name,
            "ranks": [{"rank": r.rank, "endpoint": r.endpoint, "container": r.container} for r in record.ranks],
            "roce_interface": interface, "master_addr": master_addr, "ready_s": round(elapsed, 3), "at": time.time(),
            "sets": list(options.sets)})
        ranks = tuple(RankLaunched(n.rank, n.role, n.endpoint.url, n.host, s.name, containers[n.rank].id,
                                   str(log_paths[n.rank])) for n, s in zip(nodes, specs))
        return LaunchedMulti(run_id, recipe.name, url, model, elapsed, interface, master_addr, master_port, ranks,
                             phases, notes)
    except LaunchFailed as failure:
        kept = None
        if options.keep_failed and containers:
            kept = " and ".join(specs[r].name for r in sorted(containers))
            deployment.save(record.with_state("failed"))
        else:
            left = _teardown(nodes, containers)
            if left:
                on_event(Warning_(f"could not remove {', '.join(left)}; `metralectl stop {recipe.name}` retries"))
                deployment.save(record.with_state("failed"))
            else:
                deployment.forget(recipe.name, run_id)
        on_event(Failed(failure.diagnosis.cause, failure.diagnosis.message, failure.diagnosis.remedy,
                        tuple(failure.last_lines)))
        store.append_jsonl(store.state_dir() / "runs.jsonl", {"run_id": run_id, "recipe": recipe.name, "outcome": "failed",
                                                             "cause": failure.diagnosis.cause, "at": time.time()})
        raise LaunchFailed(failure.diagnosis, failure.last_lines, failure.log_path, kept) from None
    except BaseException:
        # Ctrl-C, a crash, a lost daemon: nothing half-started may stay behind, on either node — including a
        # rank whose create/start was interrupted before we learnt its container's id (found by name + run id).
        left = _teardown(nodes, containers)
        for node, spec in zip(nodes, specs):
            if node.rank not in containers:
                try:
                    node.runtime.remove_if_labelled(spec.name, {LABEL_RUN_ID: run_id})
                except MetralError:
                    left.append(f"{spec.name} ({node.label})")
        if not left:
            deployment.forget(recipe.name, run_id)
        raise


def _address_on(node: Node, interface: str) -> str:
    if node.probe is None:
        return ""
    found = node.probe.net.ipv4(interface)
    return found[0].address if found else ""


def _teardown(nodes: Sequence[Node], containers: dict[int, ContainerInfo]) -> list[str]:
    """Remove every started rank's container; return the ones that could not be removed."""
    left = []
    for node in nodes:
        container = containers.get(node.rank)
        if container is None:
            continue
        try:
            node.runtime.remove(container.id, force=True)
        except MetralError:
            left.append(f"{container.name} ({node.label})")
    return left


class _RequestCheck(threading.Thread):
    """The real request, off the watching loop (a hung request must not stop us noticing a dead rank)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        super().__init__(daemon=True, name="first-request")
        self.url = url
        self.timeout_s = timeout_s
        self.result: Health | None = None
        self.finished = threading.Event()

    def run(self) -> None:
        try:
            with EngineClient(self.url, timeout=5.0) as client:
                self.result = client.answer_one(self.timeout_s)
        finally:
            self.finished.set()


def _tail(boots: dict[int, BootLog], first: int, n: int = 30) -> list[str]:
    """The failing rank's last lines, then a few of every other rank's, each marked with its rank."""
    out = [f"r{first}│ {line}" for line in list(boots[first].tail)[-n:]]
    for rank, boot in sorted(boots.items()):
        if rank != first and boot.tail:
            out += [f"r{rank}│ {line}" for line in list(boot.tail)[-5:]]
    return out


def _paths_text(log_paths: dict[int, Path], first: int) -> str:
    ordered = [first] + [r for r in sorted(log_paths) if r != first]
    return "; ".join(f"{log_paths[r]} (rank {r})" for r in ordered)


def _wait_ready(nodes: Sequence[Node], containers: dict[int, ContainerInfo], boots: dict[int, BootLog],
                log_paths: dict[int, Path], url: str, boot_timeout: float, stall_timeout: float,
                request_timeout: float, started: float, interface: str, on_event: Listener,
                readiness: Readiness) -> dict[str, float]:
    lines: queue.Queue[tuple[int, str | None]] = queue.Queue()
    stop = threading.Event()
    for node in nodes:
        threading.Thread(target=_follow, args=(node.runtime, containers[node.rank].id, node.rank, lines, stop),
                         daemon=True).start()
    poller = HealthPoller(url, readiness)  # only the head serves HTTP
    poller.start()
    fds = {rank: os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) for rank, path in log_paths.items()}
    phases: dict[str, float] = {}
    clock = BootClock(started, boot_timeout, stall_timeout)
    seen_changes = 0
    hold_until: float | None = None
    next_check = 0.0
    request: _RequestCheck | None = None
    by_rank = {n.rank: n for n in nodes}
    ended: set[int] = set()  # ranks whose log followers have reached the end of the log

    def fail(rank: int, diagnosis: Diagnosis) -> LaunchFailed:
        message = diagnosis.message if diagnosis.message.startswith("rank ") else f"{by_rank[rank].label}: {diagnosis.message}"
        return LaunchFailed(Diagnosis(diagnosis.cause, message, diagnosis.remedy), _tail(boots, rank),
                            _paths_text(log_paths, rank))

    try:
        while True:
            try:
                rank, line = lines.get(timeout=POLL_WAIT_S)
            except queue.Empty:
                rank, line = -1, ""
            now = time.monotonic()
            if line is None:
                ended.add(rank)
            if line:
                phase = boots[rank].feed(line)
                clean = boots[rank].tail[-1]
                os.write(fds[rank], (clean + "\n").encode())
                clock.progressed(now)
                on_event(LogLine(clean, rank))
                key = (phase or "") if rank == 0 else f"rank{rank}:{phase}"
                if phase is not None and key not in phases:
                    phases[key] = now - started
                    on_event(Phase(phase, message_of(clean, boots[rank].contract.log_prefix), now - started, rank))
            health = poller.state
            if poller.changes != seen_changes:
                seen_changes = poller.changes
                clock.progressed(now)
                if health.kind != "down":
                    on_event(Step("health", f"head: GET {readiness.health_path}: {health.describe()}"))
            if health.kind == "faulted":
                raise fail(0, fault_diagnosis(health, url))
            if now >= next_check or line is None:
                next_check = now + 0.5
                down = []
                for node in nodes:
                    info = node.runtime.inspect(containers[node.rank].id)
                    if info is None or not info.running:
                        down.append((node, info))
                if down:
                    _drain(lines, fds, boots, on_event, {d[0].rank for d in down}, ended)
                    down.sort(key=lambda d: (boots[d[0].rank].failure is None, -d[0].rank))
                    node, info = down[0]
                    diagnosis = diagnose_exit(info.exit_code if info else None, bool(info and info.oom_killed),
                                              boots[node.rank])
                    if diagnosis.cause == "exited":
                        others = [n for n in nodes if n is not node and all(n is not d[0] for d in down)]
                        waiting = f" while {others[0].label} kept running" if others else ""
                        diagnosis = Diagnosis("rank-exited", f"exited with code {info.exit_code if info else '?'} while "
                                              f"starting{waiting}", REMEDIES["rank-exited"])
                    raise fail(node.rank, diagnosis)
            if request is None and health.kind == "ready":
                phases.setdefault("healthy", now - started)
                if not boots[0].ready_line_seen:  # a silent head: its readiness is its /health answer
                    on_event(Phase("ready", f"GET {readiness.health_path}: {health.describe()}", now - started, 0))
                on_event(Step("request", f"a real request to the head ({url}, max_tokens 1, up to "
                                         f"{request_timeout:g} s): the worker must take part"))
                request = _RequestCheck(url, request_timeout)
                request.start()
            if request is not None and request.finished.is_set():
                answer = request.result or Health(None, "", "no result")
                if answer.status in (200, 401, 403) and hold_until is None:
                    if answer.status != 200:
                        on_event(Warning_(f"the head wants credentials (HTTP {answer.status}): a real request could "
                                          "not be sent, so whether the worker takes part is unchecked"))
                    phases["ready"] = now - started
                    flagged = [(r, b.failure) for r, b in sorted(boots.items()) if b.failure is not None]
                    if not flagged:
                        return phases
                    hold_until = now + HOLD_S  # a rank that logged e.g. an OOM-watchdog reading may still exit
                    who, signature = flagged[0]
                    on_event(Step("holding", f"rank {who} logged `{signature.message}` while starting: checking "
                                             f"both ranks stay up for {HOLD_S:g} s"))
                if hold_until is not None:
                    if now >= hold_until:
                        _warn_at_ready(boots, on_event)
                        return phases
                    continue  # ready already; only a rank's exit (checked above) can still fail the start
                if answer.status is None:
                    worker = nodes[-1]
                    raise fail(worker.rank, Diagnosis(
                        "requests-hang", f"rank {worker.rank} ({worker.role} on "
                        f"{'this machine' if worker.endpoint.is_local else worker.endpoint.describe()}) is not taking "
                        f"part: the head answers /health 200, but a 1-token request got no answer ({answer.error})",
                        REMEDIES["requests-hang"]))
                raise fail(0, Diagnosis("request-failed", f"the head answered a 1-token request with HTTP "
                                        f"{answer.status}: {answer.body[:200]}", "see the head's log lines above"))
            if clock.timed_out(now):
                raise fail(0, timeout_diagnosis(boots[0], health, url, boot_timeout, label="head phase"))
            if request is None and clock.stalled(now):
                stuck = [r for r, b in boots.items() if b.phase == "rendezvous"]
                if stuck and not boots[0].ready_line_seen and health.kind != "ready":
                    raise fail(0, Diagnosis(
                        "nccl-stuck", f"stuck at \"all ranks ready\" for {stall_timeout:g} s: NCCL never finished "
                        f"initialising over {interface} (the ranks disagree on the interface, or the link is down)",
                        REMEDIES["nccl-stuck"]))
                raise fail(0, stall_diagnosis(boots[0], health, url, stall_timeout, where=" on any rank"))
    finally:
        stop.set()
        poller.stop()
        for fd in fds.values():
            os.close(fd)


def _warn_at_ready(boots: dict[int, BootLog], on_event: Listener) -> None:
    for rank, boot in sorted(boots.items()):
        for warning in warnings_at_ready(boot, HOLD_S):
            on_event(Warning_(f"rank {rank}: {warning}"))


def _follow(runtime: ContainerRuntime, container_id: str, rank: int, lines: queue.Queue[tuple[int, str | None]],
            stop: threading.Event) -> None:
    try:
        for line in runtime.follow_logs(container_id, stop=stop):
            lines.put((rank, line))
            if stop.is_set():
                break
    except MetralError:
        pass
    finally:
        lines.put((rank, None))


def _drain(lines: queue.Queue[tuple[int, str | None]], fds: dict[int, int], boots: dict[int, BootLog],
           on_event: Listener, down: set[int], ended: set[int]) -> None:
    """Take the lines the followers still hold, so the diagnosis sees every rank's last words: until the
    followers of the ranks that are down have reached the end of their logs (a remote daemon's stream can
    lag the container's exit by more than a second on a loaded machine), at most DRAIN_S."""
    deadline = time.monotonic() + DRAIN_S
    while time.monotonic() < deadline:
        try:
            rank, line = lines.get(timeout=0.05)
        except queue.Empty:
            if down <= ended:
                return
            continue
        if line is None:
            ended.add(rank)
            continue
        if not line:
            continue
        boots[rank].feed(line)
        os.write(fds[rank], (boots[rank].tail[-1] + "\n").encode())
        on_event(LogLine(boots[rank].tail[-1], rank))


# --- after the launch: stop ------------------------------------------------------------------------------
class RemoteMemory:
    """NVML is read on this machine only: another node's GPU memory is not checked from here."""

    def before(self, container: ContainerInfo) -> None:
        pass

    def after(self, container: ContainerInfo) -> str:
        return "not checked (another node; `metralectl doctor` there checks it)"


@dataclass(frozen=True)
class RankStop:
    rank: int
    role: str
    endpoint: str
    container: str
    result: StopResult | None
    error: str | None  # why it could not be stopped ("" when it was already gone)


def stop_deployment(dep: Deployment, runtimes: Runtimes, *, timeout_s: float = 30.0, on_event: Listener = ignore,
                    memory_for: Callable[[ContainerRuntime], MemoryWatch] | None = None) -> list[RankStop]:
    """Stop every rank, the head first (clients then get refused connections rather than hung requests);
    forget the deployment once no rank is left anywhere."""
    out = []
    for record in sorted(dep.ranks, key=lambda r: r.rank):
        runtime = runtimes.get(record)
        if runtime is None:
            error = runtimes.errors[record.endpoint]
            out.append(RankStop(record.rank, record.role, record.endpoint, record.container, None,
                                f"unreachable: {error.message}"))
            continue
        info = runtime.inspect(record.container_id) if record.container_id else None
        if info is None:
            info = runtime.inspect(record.container)
            if info is not None and info.labels.get(LABEL_RUN_ID) not in (dep.run_id, None):
                info = None  # a newer run's container of the same name: not this deployment's
        if info is None:
            out.append(RankStop(record.rank, record.role, record.endpoint, record.container, None, ""))
            continue
        if info.labels.get(LABEL_OWNER) != owner():
            out.append(RankStop(record.rank, record.role, record.endpoint, record.container, None,
                                f"belongs to {info.labels.get(LABEL_OWNER)}; not touched"))
            continue
        watch = memory_for(runtime) if memory_for is not None else NoMemoryWatch()
        [result] = stop_containers(runtime, [info], timeout_s=timeout_s, on_event=on_event, memory=watch)
        out.append(RankStop(record.rank, record.role, record.endpoint, record.container, result, None))
    if all(s.error == "" or (s.result is not None and s.result.removed) for s in out):
        deployment.forget(dep.recipe, dep.run_id)
    return out


def stop_deployments_on(runtime: ContainerRuntime, on_event: Listener = ignore) -> None:
    """Before a --replace on this daemon: stop, on every node, the recorded deployments that have a rank here."""
    found = [d for d in deployment.load_all() if any(r.endpoint == runtime.endpoint.url for r in d.ranks)]
    if not found:
        return
    with Runtimes(runtime) as runtimes:
        for dep in found:
            for stopped in stop_deployment(dep, runtimes, on_event=on_event):
                if stopped.error:
                    on_event(Warning_(f"rank {stopped.rank} of {dep.recipe} on {stopped.endpoint}: {stopped.error}"))
                elif stopped.result is not None:
                    on_event(Step("replaced", f"{stopped.container} (rank {stopped.rank} of {dep.recipe})"))
