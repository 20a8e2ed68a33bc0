"""Choosing the RoCE interface of an EP=2 launch from what each node's probe saw (seams.netprobe). Pure.

The hardware class names the candidate ports; the one every node has an IPv4 address on wins (the
class's order breaks ties), its head address is the rendezvous's master address. A node with none, nodes
that disagree, or two nodes reporting one address are refused with what each node has; an operator's own
`--roce-interface`/`--master-addr` is only warned about.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from metralectl.errors import ExitCode, MetralError
from metralectl.seams.netprobe import IfAddr, NodeNet
from metralectl.wording import noun


@dataclass(frozen=True)
class NodeView:
    label: str  # "rank 0 (head) on unix:///var/run/docker.sock"
    net: NodeNet


@dataclass(frozen=True)
class RoceChoice:
    interface: str
    addresses: tuple[IfAddr, ...]  # per node, in the order given (head first)
    notes: tuple[str, ...] = ()

    @property
    def master_addr(self) -> str:
        return self.addresses[0].address


class RoceRefused(MetralError):
    """The nodes' networks do not allow a RoCE launch as they are."""

    exit_code = ExitCode.FAILED


DETECT_HINT = ("or, if you know better, pass `--roce-interface IF --master-addr IP` (IF: the ConnectX port with an "
               "IPv4 address on both nodes; IP: the head's address on it)")


def describe(net: NodeNet, roce: Sequence[str], chosen: str | None = None) -> str:
    """One line per node: every IPv4 interface, the RoCE candidates marked, the management one named."""
    parts = []
    for iface in sorted(net.interfaces, key=lambda i: (i not in roce, i)):
        addrs = ", ".join(str(a) for a in net.interfaces[iface])
        tags = []
        if iface == chosen:
            tags.append("RoCE, chosen")
        elif iface in roce:
            tags.append("RoCE")
        if iface in net.default_ifaces:
            tags.append("management: default route")
        parts.append(f"{iface} {addrs}" + (f" ({'; '.join(tags)})" if tags else ""))
    missing = [i for i in roce if not net.ipv4(i)]
    if missing:
        parts.append(f"no IPv4 on {', '.join(missing)}")
    return " · ".join(parts) if parts else "no IPv4 address besides loopback"


def _only_management(net: NodeNet, roce: Sequence[str]) -> str:
    others = [f"{i} {', '.join(str(a) for a in net.interfaces[i])}" for i in net.interfaces]
    if not others:
        return "it has no IPv4 address besides loopback"
    mgmt = [i for i in net.interfaces if i in net.default_ifaces]
    if mgmt and len(mgmt) == len(net.interfaces):
        return (f"only the management interface ({'; '.join(others)}) has one: NCCL would fall back to it "
                "(about 10× slower)")
    return f"only {'; '.join(others)} {noun(len(others), 'has', 'have')} one, none of them a RoCE port"


def choose_roce(roce: Sequence[str], nodes: Sequence[NodeView]) -> RoceChoice:
    """The RoCE port every node has an IPv4 address on (the class's order breaks ties), or a refusal."""
    if not roce:
        raise RoceRefused("this hardware class names no RoCE interfaces (no multi-node settings)")
    wanted = " or ".join(roce)
    lacking = [n for n in nodes if not any(n.net.ipv4(i) for i in roce)]
    if lacking:
        detail = "; ".join(f"{n.label}: no IPv4 address on {wanted}; {_only_management(n.net, roce)}" for n in lacking)
        raise RoceRefused(f"the RoCE link is not configured: {detail}",
                          f"give a ConnectX port an IPv4 address on each node (the same port on both, e.g. "
                          f"`sudo ip addr add 10.0.0.1/24 dev {roce[0]}` on the head and .2 on the worker, made "
                          f"persistent with netplan/NetworkManager) and check the cable; {DETECT_HINT}")
    common = [i for i in roce if all(n.net.ipv4(i) for n in nodes)]
    if not common:
        have = "; ".join(f"{n.label} has {', '.join(i for i in roce if n.net.ipv4(i))}" for n in nodes)
        raise RoceRefused(f"the nodes disagree on the RoCE interface: {have}; NCCL_SOCKET_IFNAME must be the same "
                          "on every rank (else NCCL is stuck at \"all ranks ready\")",
                          f"address the same ConnectX port on both nodes (cable them port to port); {DETECT_HINT}")
    chosen = common[0]
    notes = []
    if len(common) > 1:
        notes.append(f"{' and '.join(common)} both have IPv4 addresses on every node; using {chosen} "
                     "(the hardware class's first)")
    addresses = tuple(n.net.ipv4(chosen)[0] for n in nodes)
    if len({a.address for a in addresses}) < len(addresses):
        raise RoceRefused(f"the nodes report the same address {addresses[0].address} on {chosen}: head and worker "
                          "look like the same machine", "name the worker node's own Docker endpoint with --worker")
    for node, address in zip(nodes, addresses):
        if node.net.default_ifaces and chosen in node.net.default_ifaces:
            notes.append(f"{node.label}: {chosen} also carries the default route (is it the management network?)")
    head_network = addresses[0].network()
    for node, address in zip(nodes[1:], addresses[1:]):
        network = address.network()
        if network is not None and ipaddress.IPv4Address(addresses[0].address) not in network:
            notes.append(f"the head's {addresses[0].address} is not in {node.label}'s {chosen} network {network}: "
                         "the rendezvous needs a route between them")
        elif head_network is not None and network is not None and head_network != network:
            notes.append(f"{chosen} networks differ: head {head_network}, {node.label} {network}")
    return RoceChoice(chosen, addresses, tuple(notes))


def check_given(roce_interface: str, master_addr: str, nodes: Sequence[NodeView]) -> list[str]:
    """Warnings about an operator's --roce-interface/--master-addr, from what the probe saw (never a refusal)."""
    notes = []
    if nodes:
        head = nodes[0]
        if master_addr not in {a.address for a in head.net.ipv4(roce_interface)}:
            notes.append(f"--master-addr {master_addr} is not {head.label}'s address on {roce_interface} "
                         f"({describe(head.net, [roce_interface])})")
    for node in nodes[1:]:
        if not node.net.ipv4(roce_interface):
            notes.append(f"{node.label} has no IPv4 address on {roce_interface}")
    return notes
