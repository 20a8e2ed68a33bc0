"""What a node's network and HF cache look like, from a probe container's output. Pure.

An EP=2 launch needs, on each node, the IPv4 address of the RoCE port (the hardware class names the
candidates: on GB10 `enp1s0f0np0` or `enp1s0f1np1`, "whichever has an IPv4 address"). metralectl
reads it without any new remote-execution channel: a short-lived container from the node's own
engine image, with host networking, prints a few /proc files (`PROBE_SCRIPT`) and this module
turns them into facts:

- /proc/net/fib_trie lists the node's own IPv4 addresses ("/32 host LOCAL" leaves) but not their
  interfaces; /proc/net/route lists each interface's connected networks and the default route.
  An address belongs to the interface whose connected network contains it (longest prefix); the
  interface holding the default route is the management network.
- /proc/net/tcp and tcp6 list listening sockets (state 0A): a port an rank needs that something
  already listens on is refused before anything starts.
- the HF cache, mounted read-only, shows which snapshots of the checkpoint carry metralectl's
  verified manifest.

Which RoCE interface the nodes' facts allow is seams.roce's.

/proc/net/route and /proc/net/tcp print IPv4 addresses as the kernel's __be32 read in host byte
order; every node this targets (aarch64 GB10, x86_64 Hopper/B200) is little-endian.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field

from metralectl.errors import ExitCode, MetralError

HUB_MOUNT = "/metralectl-hub"
_MARK = "@@metralectl-probe "


def probe_script(repo_dir: str | None = None, sys_root: str = "/sys") -> str:
    """The sh script the probe container runs (busybox or any POSIX sh; only cat, ls and echo)."""
    lines = [
        f"echo '{_MARK}route'; cat /proc/net/route",
        f"echo '{_MARK}fib_trie'; cat /proc/net/fib_trie",
        f"echo '{_MARK}tcp'; cat /proc/net/tcp 2>/dev/null",
        f"echo '{_MARK}tcp6'; cat /proc/net/tcp6 2>/dev/null",
        # RDMA: the device behind each interface (what NCCL_IB_HCA names) and whether verbs devices exist
        # (/dev/infiniband/uverbsN; the container cannot see the host's /dev, but sysfs shows the classes)
        f"echo '{_MARK}rdma'; for d in {sys_root}/class/net/*/device/infiniband/*; do [ -e \"$d\" ] || continue; "
        f"i=${{d#{sys_root}/class/net/}}; echo \"link ${{i%%/*}} ${{d##*/}}\"; done; "
        f"for v in {sys_root}/class/infiniband_verbs/uverbs*; do [ -e \"$v\" ] && echo \"verbs ${{v##*/}}\"; done; "
        "echo scanned",
    ]
    if repo_dir:
        base = f"{HUB_MOUNT}/{repo_dir}"
        lines.append(
            f"echo '{_MARK}hf'; if [ -d '{HUB_MOUNT}' ]; then echo 'hub present'; else echo 'hub absent'; fi; "
            f"if [ -d '{base}' ]; then echo 'repo present'; "
            f"if [ -f '{base}/refs/main' ]; then echo \"ref main $(cat '{base}/refs/main')\"; fi; "
            f"for s in '{base}'/snapshots/*/; do [ -d \"$s\" ] || continue; "
            f"if [ -f \"$s.metralectl-verified.json\" ]; then echo \"verified $s\"; else echo \"snapshot $s\"; fi; "
            "done; else echo 'repo absent'; fi")
    lines.append(f"echo '{_MARK}end'")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class IfAddr:
    address: str
    prefix: int | None  # length of the connected network, None when no route names one

    def __str__(self) -> str:
        return f"{self.address}/{self.prefix}" if self.prefix is not None else self.address

    def network(self) -> ipaddress.IPv4Network | None:
        if self.prefix is None:
            return None
        return ipaddress.IPv4Network(f"{self.address}/{self.prefix}", strict=False)


@dataclass(frozen=True)
class Route:
    iface: str
    destination: str
    gateway: str
    mask: str
    flags: int
    metric: int = 0  # between routes of one prefix, the kernel takes the lowest

    @property
    def prefix(self) -> int:
        return ipaddress.IPv4Network(f"0.0.0.0/{self.mask}").prefixlen

    @property
    def is_default(self) -> bool:
        return self.destination == "0.0.0.0" and self.mask == "0.0.0.0"


@dataclass(frozen=True)
class NodeNet:
    """A node's IPv4 interfaces (loopback left out), its default-route interfaces, its listeners."""

    interfaces: dict[str, tuple[IfAddr, ...]] = field(default_factory=dict)
    default_ifaces: tuple[str, ...] = ()
    listeners: tuple[tuple[str, int], ...] = ()

    def ipv4(self, iface: str) -> tuple[IfAddr, ...]:
        return self.interfaces.get(iface, ())

    def port_holders(self, bind: str, port: int) -> list[str]:
        """Listening sockets that would keep `bind:port` from being bound."""
        wildcard = {"0.0.0.0", "::", ""}
        out = []
        for address, listening in self.listeners:
            if listening != port:
                continue
            if bind in wildcard or address in wildcard or address == bind:
                out.append(f"{address}:{port}" if ":" not in address else f"[{address}]:{port}")
        return out


@dataclass(frozen=True)
class HubView:
    """What the probe saw of one checkpoint in the node's HF cache."""

    hub_present: bool
    repo_present: bool
    ref_main: str | None
    verified: tuple[str, ...]  # commits whose snapshot carries .metralectl-verified.json
    unverified: tuple[str, ...]


@dataclass(frozen=True)
class RdmaView:
    """What the probe saw of the node's RDMA devices (sysfs)."""

    links: dict[str, tuple[str, ...]]  # interface -> RDMA devices behind it (e.g. enp1s0f0np0 -> rocep1s0f0)
    verbs: tuple[str, ...]  # uverbs devices: present iff /dev/infiniband/uverbsN exists on the node

    def device_for(self, interface: str) -> str | None:
        """The one RDMA device behind interface (None: none, or more than one to choose from)."""
        found = self.links.get(interface, ())
        return found[0] if len(found) == 1 else None


@dataclass(frozen=True)
class ProbeReport:
    net: NodeNet
    hub: HubView | None
    rdma: RdmaView | None = None


class ProbeUnreadable(MetralError):
    """The probe's output is not what the script prints (an image without sh or /proc?)."""

    exit_code = ExitCode.FAILED


def _le_ipv4(hex_text: str) -> str:
    raw = bytes.fromhex(hex_text.strip())
    if len(raw) != 4:
        raise ValueError(hex_text)
    return str(ipaddress.IPv4Address(raw[::-1]))


def _le_ipv6(hex_text: str) -> str:
    raw = bytes.fromhex(hex_text.strip())
    if len(raw) != 16:
        raise ValueError(hex_text)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))  # four host-order 32-bit words
    address = ipaddress.IPv6Address(words)
    return str(address.ipv4_mapped) if address.ipv4_mapped else str(address)


def parse_routes(text: str) -> list[Route]:
    """/proc/net/route: Iface Destination Gateway Flags RefCnt Use Metric Mask ..."""
    routes = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 8:
            continue
        try:
            routes.append(Route(cols[0], _le_ipv4(cols[1]), _le_ipv4(cols[2]), _le_ipv4(cols[7]), int(cols[3], 16),
                                int(cols[6]) if cols[6].isascii() and cols[6].isdigit() else 0))
        except ValueError:
            continue
    return routes


def parse_local_addresses(text: str) -> list[str]:
    """The node's own IPv4 addresses: the "/32 host LOCAL" leaves of /proc/net/fib_trie."""
    found: list[str] = []
    last: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("|--"):
            last = stripped[3:].strip()
        elif stripped.startswith("/32") and "host LOCAL" in stripped and last is not None and last not in found:
            found.append(last)
    return found


def parse_listeners(tcp_text: str, tcp6_text: str = "") -> list[tuple[str, int]]:
    """(address, port) of every LISTEN socket in /proc/net/tcp and tcp6."""
    out: list[tuple[str, int]] = []
    for text, decode in ((tcp_text, _le_ipv4), (tcp6_text, _le_ipv6)):
        for line in text.splitlines()[1:]:
            cols = line.split()
            if len(cols) < 4 or cols[3] != "0A":
                continue
            address, _, port = cols[1].partition(":")
            try:
                entry = (decode(address), int(port, 16))
            except ValueError:
                continue
            if entry not in out:
                out.append(entry)
    return out


def interfaces_of(routes: Sequence[Route], addresses: Sequence[str]) -> dict[str, tuple[IfAddr, ...]]:
    """Map each local address to the interface whose connected network holds it (longest prefix)."""
    connected = [r for r in routes if not r.is_default and r.gateway == "0.0.0.0" and r.iface != "*"]
    out: dict[str, list[IfAddr]] = {}
    for address in addresses:
        ip = ipaddress.IPv4Address(address)
        if ip.is_loopback:
            continue
        best: Route | None = None
        for route in connected:
            network = ipaddress.IPv4Network(f"{route.destination}/{route.mask}", strict=False)
            if ip in network and (best is None or route.prefix > best.prefix):
                best = route
        if best is None:
            out.setdefault("?", []).append(IfAddr(address, None))
        else:
            out.setdefault(best.iface, []).append(IfAddr(address, best.prefix))
    return {k: tuple(v) for k, v in out.items()}


def node_net(route_text: str, fib_text: str, tcp_text: str = "", tcp6_text: str = "") -> NodeNet:
    routes = parse_routes(route_text)
    defaults = tuple(dict.fromkeys(r.iface for r in routes if r.is_default and r.iface != "*"))
    return NodeNet(interfaces_of(routes, parse_local_addresses(fib_text)), defaults,
                   tuple(parse_listeners(tcp_text, tcp6_text)))


def _sections(text: str) -> dict[str, str]:
    out: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        if line.startswith(_MARK):
            current = line[len(_MARK):].strip()
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def _hub(text: str) -> HubView:
    hub_present = repo_present = False
    ref = None
    verified: list[str] = []
    unverified: list[str] = []
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if line.strip() == "hub present":
            hub_present = True
        elif line.strip() == "repo present":
            repo_present = True
        elif word == "ref" and rest.startswith("main "):
            ref = rest[5:].strip() or None
        elif word in ("verified", "snapshot"):
            commit = rest.rstrip("/").rsplit("/", 1)[-1]
            (verified if word == "verified" else unverified).append(commit)
    return HubView(hub_present, repo_present, ref, tuple(verified), tuple(unverified))


def parse_probe(text: str) -> ProbeReport:
    sections = _sections(text)
    if "route" not in sections or "fib_trie" not in sections or "end" not in sections:
        tail = " | ".join(text.strip().splitlines()[-3:]) or "no output"
        raise ProbeUnreadable(f"the probe printed no network tables ({tail})")
    net = node_net(sections["route"], sections["fib_trie"], sections.get("tcp", ""), sections.get("tcp6", ""))
    hub = _hub(sections["hf"]) if "hf" in sections else None
    return ProbeReport(net, hub, _rdma(sections["rdma"]) if "rdma" in sections else None)


def _rdma(text: str) -> RdmaView | None:
    links: dict[str, list[str]] = {}
    verbs: list[str] = []
    scanned = False
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["link"] and len(words) == 3:
            links.setdefault(words[1], []).append(words[2])
        elif words[:1] == ["verbs"] and len(words) == 2:
            verbs.append(words[1])
        elif words == ["scanned"]:
            scanned = True
    return RdmaView({k: tuple(v) for k, v in links.items()}, tuple(verbs)) if scanned else None


def hub_summary(hub: HubView | None) -> str:
    if hub is None:
        return "not checked"
    if not hub.hub_present:
        return "no HF cache"
    if not hub.repo_present:
        return "checkpoint absent"
    if hub.verified:
        return "verified " + ", ".join(c[:12] for c in hub.verified)
    return "present, not verified" if hub.unverified else "no snapshot"

