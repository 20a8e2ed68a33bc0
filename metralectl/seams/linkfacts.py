"""This node's links as the fabric preflight sees them (`doctor --peer`): sysfs and /proc, read under a root path.

    links = read_links("/sys")                 # {name: Link}: MTU, speed, duplex, state, virtual, RDMA devices
    net = read_net("/proc")                    # seams.netprobe.NodeNet: IPv4 interfaces, default-route interfaces
    route = route_to(net_routes, "10.0.0.2")   # which interface the main table sends a packet to that address through
    source = source_address("10.0.0.2")        # the kernel's own source address for it (a UDP connect: nothing is sent)

Every reader takes its root, so tests give a fake sysfs (tests/unit/test_fabric_sysfs.py); every value from the
kernel is read capped (a sysfs attribute is a line) and an unreadable one is None, never a guess:
- speed: /sys/class/net/IF/speed in Mb/s. A virtual interface (veth, bridge, bond of virtual links: its
  /sys/class/net/IF is under devices/virtual) reports a nominal figure (veth: 10000) or EINVAL; both are
  "unknown" here, and so is -1 (no link).
- RDMA: /sys/class/infiniband/DEV/device/net/IF names the interfaces of the RDMA device's PCI function
  (what NCCL_IB_HCA names); the device's first port's state and rate come with it.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metralectl.seams.netprobe import NodeNet, Route, node_net, parse_routes

ATTR_LIMIT = 4096  # a sysfs attribute is one short line
PROC_LIMIT = 4 << 20  # /proc/net/route and fib_trie of a busy router stay well below this
MAX_LINKS = 256  # interfaces read (a box with more is not a GB10 node)


def _read(path: Path, limit: int = ATTR_LIMIT) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return os.read(fd, limit).decode("utf-8", "replace").strip()
    except OSError:  # EINVAL: a veth that is down, an interface without a link
        return None
    finally:
        os.close(fd)


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class RdmaDevice:
    name: str  # e.g. rocep1s0f1 (what NCCL_IB_HCA names)
    port_state: str | None = None  # "4: ACTIVE"
    rate: str | None = None  # "200 Gb/sec (4X HDR)"
    link_layer: str | None = None  # "Ethernet" for RoCE

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "port_state": self.port_state, "rate": self.rate, "link_layer": self.link_layer}


@dataclass(frozen=True)
class Link:
    name: str
    mtu: int | None
    speed_mbps: int | None  # None: unknown (virtual, no link, not reported)
    duplex: str | None  # "full", "half"; None when unknown
    operstate: str | None  # "up", "down", "unknown", ...
    virtual: bool  # under /sys/devices/virtual: a veth, a bridge, a tunnel: no physical port
    reported_speed: int | None = None  # what the kernel said, even when it means nothing (veth: 10000)
    driver: str | None = None
    rdma: tuple[RdmaDevice, ...] = field(default_factory=tuple)
    ifindex: int | None = None  # the kernel's order (NCCL, left to itself, takes the first fitting interface)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ifindex": self.ifindex, "mtu": self.mtu, "speed_mbps": self.speed_mbps, "duplex": self.duplex,
                "operstate": self.operstate, "virtual": self.virtual, "reported_speed": self.reported_speed,
                "driver": self.driver, "rdma": [d.to_json() for d in self.rdma]}


def rdma_devices(sys_root: str | Path = "/sys") -> dict[str, tuple[RdmaDevice, ...]]:
    """interface -> the RDMA devices behind it, from /sys/class/infiniband/*/device/net/*."""
    base = Path(sys_root) / "class" / "infiniband"
    out: dict[str, list[RdmaDevice]] = {}
    try:
        names = sorted(os.listdir(base))[:MAX_LINKS]
    except OSError:
        return {}
    for dev in names:
        port = base / dev / "ports" / "1"
        device = RdmaDevice(dev, _read(port / "state"), _read(port / "rate"), _read(port / "link_layer"))
        try:
            ifaces = sorted(os.listdir(base / dev / "device" / "net"))[:MAX_LINKS]
        except OSError:
            continue
        for iface in ifaces:
            out.setdefault(iface, []).append(device)
    return {k: tuple(v) for k, v in out.items()}


def read_link(name: str, sys_root: str | Path = "/sys",
              rdma: dict[str, tuple[RdmaDevice, ...]] | None = None) -> Link:
    here = Path(sys_root) / "class" / "net" / name
    try:
        target = os.readlink(here)
    except OSError:
        target = ""
    virtual = "/devices/virtual/" in target or not (here / "device").exists()
    reported = _int(_read(here / "speed"))
    speed = None if virtual or reported is None or reported <= 0 else reported
    duplex = _read(here / "duplex")
    driver = None
    try:
        driver = os.path.basename(os.readlink(here / "device" / "driver"))
    except OSError:
        pass
    return Link(name, _int(_read(here / "mtu")), speed,
                None if virtual or duplex in (None, "unknown") else duplex, _read(here / "operstate"), virtual,
                reported, driver, (rdma if rdma is not None else rdma_devices(sys_root)).get(name, ()),
                _int(_read(here / "ifindex")))


def read_links(sys_root: str | Path = "/sys") -> dict[str, Link]:
    """Every interface but loopback."""
    try:
        names = sorted(n for n in os.listdir(Path(sys_root) / "class" / "net") if n != "lo")[:MAX_LINKS]
    except OSError:
        return {}
    rdma = rdma_devices(sys_root)
    return {n: read_link(n, sys_root, rdma) for n in names}


def _proc(proc_root: str | Path, name: str) -> str:
    return _read(Path(proc_root) / "net" / name, PROC_LIMIT) or ""


def read_routes(proc_root: str | Path = "/proc") -> list[Route]:
    return parse_routes(_proc(proc_root, "route"))


def read_net(proc_root: str | Path = "/proc") -> NodeNet:
    """This node's IPv4 interfaces and default-route interfaces (seams.netprobe's reading of /proc/net)."""
    return node_net(_proc(proc_root, "route"), _proc(proc_root, "fib_trie"))


@dataclass(frozen=True)
class RouteChoice:
    interface: str
    gateway: str | None  # None: on-link (the address is in a connected network)
    prefix: int  # the route's prefix length (0: the default route)

    @property
    def is_default(self) -> bool:
        return self.prefix == 0


def route_to(routes: list[Route], address: str) -> RouteChoice | None:
    """The main table's answer for `address`: the longest matching prefix, then the lowest metric (the kernel's rule
    without policy routing; /proc/net/route lists the main table only). None: no route (or not an IPv4 address)."""
    try:
        ip = ipaddress.IPv4Address(address)
    except ValueError:
        return None
    best: Route | None = None
    for route in routes:
        if route.iface == "*" or not route.flags & 0x1:  # RTF_UP
            continue
        network = ipaddress.IPv4Network(f"{route.destination}/{route.mask}", strict=False)
        if ip in network and (best is None or route.prefix > best.prefix
                              or (route.prefix == best.prefix and route.metric < best.metric)):
            best = route
    if best is None:
        return None
    return RouteChoice(best.iface, None if best.gateway == "0.0.0.0" else best.gateway, best.prefix)


def source_address(address: str, port: int = 9) -> str | None:
    """The source address the kernel would use towards `address` (a UDP socket's connect sends nothing)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((address, port))
            return str(sock.getsockname()[0])
    except OSError:
        return None


def ipv4_of(host: str, timeout_s: float = 2.0) -> str | None:
    """`host` as an IPv4 address: itself, or its name resolved (getaddrinfo has no timeout of its own: it runs in a
    daemon thread, given up after timeout_s). None: IPv6, unresolvable, or too slow."""
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        pass
    if ":" in host:
        return None
    found: list[str] = []

    def lookup() -> None:
        try:
            found.extend(str(info[4][0]) for info in socket.getaddrinfo(host, None, socket.AF_INET))
        except OSError:
            pass
    worker = threading.Thread(target=lookup, name="fabric-resolve", daemon=True)
    worker.start()
    worker.join(timeout_s)
    return found[0] if found else None


def local_report(sys_root: str | Path = "/sys", proc_root: str | Path = "/proc") -> dict[str, Any]:
    """What a node tells its peer about its links (`GET /peer/v1/fabric`): JSON-ready, bounded by MAX_LINKS."""
    links = read_links(sys_root)
    net = read_net(proc_root)
    out = []
    for name, link in links.items():
        entry = link.to_json()
        entry["ipv4"] = [str(a) for a in net.ipv4(name)]
        out.append(entry)
    return {"links": out, "default_ifaces": list(net.default_ifaces)}
