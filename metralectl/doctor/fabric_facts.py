"""What the fabric preflight (`doctor --peer HOST`) judges: both ends' links, the route, the probe. Pure values.

A node's report (seams.linkfacts.local_report, and the same JSON from the peer's agent) is read by
`parse_report`, which trusts none of it: names are checked against the kernel's interface-name grammar,
numbers are ints in range, text is escaped (safetext.clean) and capped, lists are bounded. This node's own
report goes through the same reader, so both ends are one type.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

from metralectl.safetext import clean
from metralectl.seams.netprobe import IfAddr, NodeNet

MAX_LINKS = 64  # interfaces taken from one report
MAX_ADDRS = 16  # IPv4 addresses per interface
MAX_RDMA = 8  # RDMA devices behind one interface
TEXT_LIMIT = 40  # a port state, a rate, a driver
_IFNAME = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")  # IFNAMSIZ - 1; no '/' and no whitespace


def ifname(value: object) -> str | None:
    return value if isinstance(value, str) and _IFNAME.fullmatch(value) else None


def _int(value: object, low: int, high: int) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high else None


def _first(value: object, count: int) -> list[object]:
    """The first `count` entries of a list; anything else a report puts there (a dict, a string, a number) is none."""
    return value[:count] if isinstance(value, list) else []


def _text(value: object) -> str | None:
    return clean(value, TEXT_LIMIT) if isinstance(value, str) and value else None


def _ifaddr(value: object) -> IfAddr | None:
    if not isinstance(value, str):
        return None
    address, _, prefix = value.partition("/")
    try:
        ip = ipaddress.IPv4Address(address)
    except ValueError:
        return None
    length = int(prefix) if prefix.isascii() and prefix.isdigit() and int(prefix) <= 32 else None
    return IfAddr(str(ip), length)


@dataclass(frozen=True)
class Rdma:
    name: str
    port_state: str | None = None
    rate: str | None = None
    link_layer: str | None = None

    @property
    def active(self) -> bool | None:
        return None if self.port_state is None else "ACTIVE" in self.port_state.upper()


@dataclass(frozen=True)
class End:
    """One interface of one node."""

    name: str
    mtu: int | None = None
    speed_mbps: int | None = None
    reported_speed: int | None = None
    duplex: str | None = None
    operstate: str | None = None
    virtual: bool = False
    driver: str | None = None
    rdma: tuple[Rdma, ...] = ()
    ipv4: tuple[IfAddr, ...] = ()
    ifindex: int | None = None


@dataclass(frozen=True)
class Report:
    links: dict[str, End] = field(default_factory=dict)
    default_ifaces: tuple[str, ...] = ()
    dropped: int = 0  # entries of the report that were malformed and left out

    def net(self) -> NodeNet:
        """As seams.roce wants it: the same choice `run --worker` makes from a probe container's /proc."""
        return NodeNet({n: e.ipv4 for n, e in self.links.items() if e.ipv4}, self.default_ifaces)

    def owner_of(self, address: str) -> End | None:
        return next((e for e in self.links.values() if any(a.address == address for a in e.ipv4)), None)


def _rdma(value: object) -> Rdma | None:
    if not isinstance(value, dict):
        return None
    name = ifname(value.get("name"))
    if name is None:
        return None
    return Rdma(name, _text(value.get("port_state")), _text(value.get("rate")), _text(value.get("link_layer")))


def _end(value: object) -> End | None:
    if not isinstance(value, dict):
        return None
    name = ifname(value.get("name"))
    if name is None:
        return None
    rdma = [r for r in (_rdma(v) for v in _first(value.get("rdma"), MAX_RDMA)) if r is not None]
    addrs = [a for a in (_ifaddr(v) for v in _first(value.get("ipv4"), MAX_ADDRS)) if a is not None]
    duplex = value.get("duplex")
    return End(name, _int(value.get("mtu"), 68, 1 << 20), _int(value.get("speed_mbps"), 1, 10_000_000),
               _int(value.get("reported_speed"), -1, 10_000_000),
               duplex if duplex in ("full", "half") else None, _text(value.get("operstate")),
               value.get("virtual") is True, _text(value.get("driver")), tuple(rdma), tuple(addrs),
               _int(value.get("ifindex"), 1, 1 << 31))


def parse_report(value: object) -> Report:
    """A node's report, trusted in nothing: malformed entries are left out (and counted)."""
    if not isinstance(value, dict):
        return Report(dropped=1)
    raw_links = _first(value.get("links"), MAX_LINKS)
    links: dict[str, End] = {}
    dropped = 0
    for item in raw_links:
        end = _end(item)
        if end is None or end.name in links:
            dropped += 1
            continue
        links[end.name] = end
    default_ifaces = tuple(n for n in (ifname(d) for d in _first(value.get("default_ifaces"), 8)) if n)
    return Report(links, default_ifaces, dropped)


@dataclass(frozen=True)
class Probe:
    """One direction of the throughput probe: bytes moved in seconds, or why not."""

    direction: str  # "from the peer" (its source endpoint to here), "to the peer" (here to its sink)
    bytes: int = 0
    seconds: float = 0.0
    error: str | None = None

    @property
    def mbps(self) -> float | None:
        return self.bytes * 8 / self.seconds / 1e6 if self.seconds > 0 and self.bytes and not self.error else None


@dataclass(frozen=True)
class FabricFacts:
    """Everything the fabric checks judge, gathered once (peers.fabric.gather)."""

    peer: str  # how the operator named it (name or address), escaped
    peer_host: str  # the paired address's host
    local: Report
    remote: Report | None  # None: the peer's agent did not answer (remote_error says why)
    remote_error: str | None = None
    route_iface: str | None = None  # the main table's interface towards peer_host
    route_gateway: str | None = None  # None: on-link
    route_prefix: int | None = None
    source: str | None = None  # the kernel's source address towards peer_host
    hardware_class: str | None = None
    roce_candidates: tuple[str, ...] = ()
    rated_mbps: int | None = None  # the class's NIC rating (multi-node.link-mbps)
    expected_mtu: int | None = None  # the class's expectation (multi-node.mtu)
    environ: dict[str, str] = field(default_factory=dict)  # NCCL_SOCKET_IFNAME / NCCL_IB_HCA of this shell
    probes: tuple[Probe, ...] = ()
    probe_address: str | None = None  # where the probe went (the peer's address on the chosen link)

    def to_json(self) -> dict[str, Any]:
        return {"peer": self.peer, "peer_host": self.peer_host, "route_iface": self.route_iface,
                "route_gateway": self.route_gateway, "source": self.source}
