"""Multi-rank (EP=2) deployments across two nodes: the topology, and nothing that starts or waits.

Which nodes there are (two distinct Docker daemons, the head first), what each node's probe found (a
short-lived container of its engine image on the host network: IPv4 interfaces, listening ports,
verified snapshots), the RoCE interface both nodes have an address on and the head's address there
(--master-addr), each rank's arguments and environment rendered from the one recipe and checked to
agree, the ports each rank needs, where this machine reaches the head, and where each rank runs as
the deployment record keeps it. Each node is reached the way the Docker CLI reaches it (a context,
ssh://, tcp:// with TLS) through the same ContainerRuntime seam a single-node launch uses.

The launch built on it is lifecycle/launch_multi.py: N single-rank launches over one start, one
readiness loop and one clean-up (lifecycle/ranks.py, lifecycle/readiness.py); docs/multinode.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from metralectl import paths
from metralectl.core.catalog import Catalog
from metralectl.core.contract import EngineContract
from metralectl.core.recipe import Recipe
from metralectl.core.render import ContainerSpec, spec_for
from metralectl.errors import MetralError
from metralectl.lifecycle.deployment import RankRecord
from metralectl.lifecycle.events import Listener, Step, Warning_, ignore
from metralectl.seams import netprobe
from metralectl.seams.hf import cache as hfcache
from metralectl.seams.roce import NodeView, RoceRefused, check_given, choose_roce, describe
from metralectl.seams.docker.protocol import ContainerRuntime
from metralectl.seams.docker.endpoints import Endpoint
from metralectl.seams.docker.errors import RuntimeCause, RuntimeFailure
from metralectl.seams.endpoint import base_url
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
    def where(self) -> str:
        return "this machine" if self.endpoint.is_local else self.endpoint.describe()

    @property
    def label(self) -> str:
        return f"rank {self.rank} ({self.role}) on {self.where}"


# The deployment as launched (lifecycle/launch_multi.py returns it): which rank runs where, in which container.
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
            views.append(NodeView(node.label, answer.net))
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
        notes = check_given(multi.roce_interface, multi.master_addr, views) if not failed else []
        for view in views:
            on_event(Step("network", f"{view.label}: {describe(view.net, roce, multi.roce_interface)}"))
        for note in notes:
            on_event(Warning_(note))
        on_event(Step("roce", f"NCCL_SOCKET_IFNAME={multi.roce_interface} (given), master {multi.master_addr}"))
        return multi.roce_interface, multi.master_addr, notes
    if multi.roce_interface or multi.master_addr:
        raise MetralError("--roce-interface and --master-addr go together (or neither: metralectl detects both)")
    try:
        choice = choose_roce(roce, views)
    except RoceRefused:
        for view in views:
            on_event(Step("network", f"{view.label}: {describe(view.net, roce)}"))
        raise
    for view in views:
        on_event(Step("network", f"{view.label}: {describe(view.net, roce, choice.interface)}"))
    for note in choice.notes:
        on_event(Warning_(note))
    on_event(Step("roce", f"NCCL_SOCKET_IFNAME={choice.interface} on both nodes; --master-addr {choice.master_addr} "
                          f"(the head's address on {choice.interface})"))
    return choice.interface, choice.master_addr, list(choice.notes)


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


# --- the ranks ----------------------------------------------------------------------------------------
def refuse_unless_two_ranks(recipe: Recipe, catalog: Catalog) -> None:
    """metralectl launches two-rank (EP=2) recipes across two nodes, on hardware with multi-node settings."""
    hardware = catalog.hardware[recipe.hardware]
    if not recipe.multi_rank:
        raise MetralError(f"{recipe.name} is a single-node recipe; --worker is for multi-rank recipes")
    if recipe.resources.world_size != 2:
        raise MetralError(f"{recipe.name} has {recipe.resources.world_size} ranks; metralectl launches two-node "
                          "(EP=2) deployments: one head and one worker")
    if not (hardware.multi_node or {}).get("roce-interfaces"):
        raise MetralError(f"hardware class {hardware.id} has no multi-node settings (RoCE interfaces, NCCL environment)",
                          "multi-node launches are described for GB10 only")


def rank_specs(recipe: Recipe, catalog: Catalog, nodes: Sequence[Node], interface: str, master_addr: str,
               hcas: dict[int, str | None], multi: MultiOptions, on_event: Listener,
               gpus_override: str | int | None = "recipe") -> list[ContainerSpec]:
    """Each rank rendered from the one recipe for its node (rank, master address, RoCE interface, RDMA device),
    the head first; refused unless they agree on the rank-symmetric flags and the NCCL environment."""
    specs = [spec_for(catalog, recipe, rank=n.rank, master_addr=master_addr, roce_interface=interface,
                      gpus_override=gpus_override, rdma=multi.rdma, rdma_device=hcas[n.rank]) for n in nodes]
    symmetric = catalog.engines[recipe.engine].rank_symmetric
    problems = symmetry_problems(specs, catalog.engines[recipe.engine])
    if problems:
        raise MetralError(f"the two ranks of {recipe.name} do not agree: " + "; ".join(problems),
                          "head and worker are rendered from one recipe; remove per-rank overrides of these settings")
    on_event(Step("symmetry", "both ranks: " + ", ".join(
        f"--{k} {_shown(flag_value(specs[0].command, k))}" for k in symmetric)
        + f"; identical NCCL environment ({count(len([k for k in specs[0].env if k.startswith('NCCL_')]), 'variable')})"
        + (f"; {', '.join(specs[0].devices + tuple('--cap-add ' + c for c in specs[0].cap_add))}"
           if specs[0].devices or specs[0].cap_add else "")))
    return specs


def rank_records(nodes: Sequence[Node], specs: Sequence[ContainerSpec], interface: str,
                 master_addr: str) -> tuple[RankRecord, ...]:
    """Where each rank runs, as the deployment record keeps it (its container's id comes once it starts)."""
    return tuple(RankRecord(n.rank, n.role, n.endpoint.url, n.endpoint.source, n.endpoint.spec, n.host, s.name, "",
                            s.port, master_addr if n.rank == 0 else _address_on(n, interface))
                 for n, s in zip(nodes, specs))


def _address_on(node: Node, interface: str) -> str:
    if node.probe is None:
        return ""
    found = node.probe.net.ipv4(interface)
    return found[0].address if found else ""
