"""The fabric preflight's verdicts (`doctor --peer HOST`), judged from FabricFacts. Pure: nothing is read here.

    fabric.peer        the peer's agent answered with its links (else only this end is judged)
    fabric.route       the interface and address that reach the peer; a direct cable's /30 (/31) preferred over a
                       route through a switch or a gateway, and said so when the kernel's route differs
    fabric.mtu         both ends of that link; a mismatch, or the class's jumbo-frame expectation unmet
    fabric.speed       link speed and duplex from sysfs, against the class's NIC rating; a virtual link: unknown
    fabric.rdma        the RDMA device behind the interface on each end (what NCCL_IB_HCA names), or none
    fabric.nccl        NCCL_SOCKET_IFNAME / NCCL_IB_HCA as the EP=2 profile would set them vs NCCL's own pick
    fabric.throughput  the agents' bounded probe over that link, both directions
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

from metralectl.doctor.fabric_facts import End, FabricFacts, Report
from metralectl.doctor.model import Finding, ok, problem, skipped, warn
from metralectl.seams.netprobe import IfAddr

IB_MTUS = (4096, 2048, 1024, 512, 256)
ROCE_OVERHEAD = 100  # Ethernet + IP + UDP + BTH + ICRC (+ RETH) headers, rounded up: 4096 needs an MTU of 4200
SLOW_PROBE_MBPS = 1000.0  # below this on a link of 10 Gb/s or more, the probe says so


def roce_path_mtu(mtu: int) -> int | None:
    """RoCE's path MTU over an Ethernet MTU: the largest IB MTU whose packets fit (1500 -> 1024, 9000 -> 4096)."""
    return next((m for m in IB_MTUS if m + ROCE_OVERHEAD <= mtu), None)


@dataclass(frozen=True)
class Pair:
    """A network both nodes have an address on: here `local` at `local_addr`, the peer at `remote_addr`."""

    local: End
    local_addr: IfAddr
    remote: End | None
    remote_addr: str
    prefix: int

    @property
    def direct(self) -> bool:
        return self.prefix >= 30

    @property
    def why(self) -> str:
        if self.direct:
            return f"the /{self.prefix} of a direct cable"
        return f"a shared /{self.prefix} (a switch, or a cable with a wide netmask)"


def shared_links(facts: FabricFacts) -> list[Pair]:
    """Every (local interface, peer address) on one IPv4 network, best first: point-to-point (/30, /31) before a
    wider network, the class's RoCE ports before others (in its order), never the default-route interface first."""
    found: list[Pair] = []
    for end in facts.local.links.values():
        for addr in end.ipv4:
            network = addr.network()
            if network is None:
                continue
            remote_addrs: list[tuple[End | None, str]] = []
            if facts.remote is not None:
                remote_addrs = [(r, a.address) for r in facts.remote.links.values() for a in r.ipv4]
            else:
                remote_addrs = [(None, facts.peer_host)]
            for remote, address in remote_addrs:
                try:
                    inside = ipaddress.IPv4Address(address) in network
                except ValueError:
                    continue
                if inside and address != addr.address:
                    found.append(Pair(end, addr, remote, address, network.prefixlen))
    order = {name: i for i, name in enumerate(facts.roce_candidates)}

    def key(p: Pair) -> tuple[bool, int, int, bool, str]:
        return (not p.direct, -p.prefix, order.get(p.local.name, len(order)),
                p.local.name in facts.local.default_ifaces, p.local.name)
    return sorted(found, key=key)


def chosen(facts: FabricFacts) -> Pair | None:
    pairs = shared_links(facts)
    return pairs[0] if pairs else None


def check_peer(facts: FabricFacts) -> Finding:
    if facts.remote is None:
        return warn(f"{facts.peer}'s agent did not answer with its links ({facts.remote_error}): only this end is "
                    "judged (its MTU, speed and RDMA device unknown; no throughput probe)",
                    f"on {facts.peer}: `metralectl agent start --peers` (the peer listener), this box trusted there "
                    "(`metralectl peer grant-bench FINGERPRINT` with this box's `metralectl id`); a 404 means an older "
                    "metralectl there: update it", error=facts.remote_error)
    names = sorted(facts.remote.links)
    extra = f"; {facts.remote.dropped} malformed entries left out" if facts.remote.dropped else ""
    return ok(f"{facts.peer}'s agent answered: {len(names)} interfaces ({', '.join(names) or 'none'}){extra}",
              None, interfaces=names, dropped=facts.remote.dropped)


def _route_text(facts: FabricFacts) -> str:
    if facts.route_gateway:
        kind = "the default route" if facts.route_prefix == 0 else f"a /{facts.route_prefix} route"
        return f"{facts.route_iface} ({kind} via {facts.route_gateway})"
    return f"{facts.route_iface} (on-link /{facts.route_prefix})"


def check_route(facts: FabricFacts) -> Finding:
    pair = chosen(facts)
    data = {"route_iface": facts.route_iface, "route_gateway": facts.route_gateway, "route_prefix": facts.route_prefix,
            "source": facts.source}
    try:
        loopback = ipaddress.IPv4Address(facts.peer_host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return problem(f"{facts.peer} is paired at {facts.peer_host}, a loopback address: this machine, not a second "
                       "node", f"pair the other node at its own address (`metralectl peer pair ADDRESS`)", **data)
    if facts.route_iface is None and pair is not None:  # an IPv6 or unresolvable paired address: no route lookup
        return ok(f"{facts.peer} shares {pair.why} with this machine on {pair.local.name} (here {pair.local_addr}, "
                  f"{facts.peer} {pair.remote_addr}); the route to {facts.peer_host} itself was not looked up "
                  "(not an IPv4 address)", None, interface=pair.local.name, local_addr=str(pair.local_addr),
                  peer_addr=pair.remote_addr, prefix=pair.prefix, direct=pair.direct, **data)
    if facts.route_iface is None:
        return problem(f"no route from this machine to {facts.peer} ({facts.peer_host})",
                       "check the cable and the addresses (`ip route get ADDRESS`)", **data)
    if pair is None:
        return problem(f"{facts.peer} ({facts.peer_host}) is reached only through {_route_text(facts)}: no network of "
                       f"this machine holds one of its addresses, so there is no direct link for NCCL",
                       "cable a ConnectX port of each node to the other and give both ends one network, e.g. "
                       "`sudo ip addr add 10.0.0.1/30 dev IF` here and 10.0.0.2/30 there (persistent: netplan)", **data)
    data.update(interface=pair.local.name, local_addr=str(pair.local_addr), peer_addr=pair.remote_addr,
                peer_interface=pair.remote.name if pair.remote else None, prefix=pair.prefix, direct=pair.direct)
    ends = f"here {pair.local_addr}, {facts.peer} {pair.remote_addr}" + (
        f" on its {pair.remote.name}" if pair.remote else "")
    if pair.local.name == facts.route_iface:
        return ok(f"{facts.peer} is reached through {pair.local.name} ({ends}): {pair.why}", None, **data)
    return warn(f"{facts.peer} ({facts.peer_host}) is reached through {_route_text(facts)}, but {pair.local.name} has "
                f"{pair.why} to it ({ends})",
                f"set NCCL_SOCKET_IFNAME={pair.local.name} (an EP=2 launch: `--roce-interface {pair.local.name} "
                f"--master-addr {pair.local_addr.address}` when it is not one of the class's RoCE ports); the peer's "
                f"address on the cable is {pair.remote_addr}", **data)


def _need_pair(fn: Callable[[FabricFacts, Pair], Finding]) -> Callable[[FabricFacts], Finding]:
    def judged(facts: FabricFacts) -> Finding:
        pair = chosen(facts)
        if pair is None:
            return skipped("no link to the peer was found (fabric.route)")
        return fn(facts, pair)
    return judged


def _mtu(facts: FabricFacts, pair: Pair) -> Finding:
    here, there = pair.local.mtu, pair.remote.mtu if pair.remote else None
    name, far = pair.local.name, pair.remote.name if pair.remote else "?"
    data = {"interface": name, "mtu": here, "peer_interface": far, "peer_mtu": there, "expected": facts.expected_mtu}
    if here is None:
        return skipped(f"the MTU of {name} could not be read", None, **data)
    if there is not None and there != here:
        target = max(here, there, facts.expected_mtu or 0)
        fixes = [f"here `sudo ip link set {name} mtu {target}`"] if here != target else []
        fixes += [f"on {facts.peer} `sudo ip link set {far} mtu {target}`"] if there != target else []
        return problem(f"the MTU differs across the link: {name} here {here}, {far} on {facts.peer} {there}: frames "
                       f"larger than {min(here, there)} are dropped (RoCE does not fragment; NCCL hangs or crawls)",
                       f"the same MTU on both ends: {' and '.join(fixes)} (persistent: `mtu: {target}` in netplan)",
                       **data)
    both = f"{here} on both ends" if there is not None else f"{here} here ({facts.peer}'s end unknown)"
    path = roce_path_mtu(here)
    data["roce_path_mtu"] = path
    if facts.expected_mtu and here < facts.expected_mtu:
        return warn(f"{name} runs an MTU of {both}; the {facts.hardware_class} class expects jumbo frames "
                    f"({facts.expected_mtu}): RoCE's path MTU is then {path or 'below 256'} instead of 4096, "
                    "so every message takes more packets",
                    f"`sudo ip link set {name} mtu {facts.expected_mtu}` here and on {facts.peer} "
                    f"(persistent: `mtu: {facts.expected_mtu}` in netplan)", **data)
    return ok(f"{name}: MTU {both} (RoCE path MTU {path or '?'})", None, **data)


def _speed_of(end: End | None, who: str) -> str:
    if end is None:
        return f"{who}: unknown (its agent did not say)"
    if end.virtual:
        nominal = f"; the kernel's {end.reported_speed} Mb/s is nominal" if end.reported_speed else ""
        return f"{who} {end.name}: unknown (a virtual interface{nominal})"
    if end.speed_mbps is None:
        return f"{who} {end.name}: unknown (no link, or the driver reports none)"
    return f"{who} {end.name}: {end.speed_mbps} Mb/s, {end.duplex or 'duplex unknown'}"


def _speed(facts: FabricFacts, pair: Pair) -> Finding:
    ends = [(pair.local, "here"), (pair.remote, facts.peer)] if facts.remote is not None else [(pair.local, "here")]
    detail = "; ".join(_speed_of(e, w) for e, w in ends)
    data = {"speed_mbps": pair.local.speed_mbps, "duplex": pair.local.duplex, "virtual": pair.local.virtual,
            "peer_speed_mbps": pair.remote.speed_mbps if pair.remote else None, "rated_mbps": facts.rated_mbps}
    for end, who in ends:
        if end is not None and end.operstate == "down":
            return problem(f"{detail}: {end.name} is down ({who})", f"`sudo ip link set {end.name} up`; check the cable",
                           **data)
        if end is not None and end.duplex == "half":
            return problem(f"{detail}: half duplex ({who})",
                           f"check `ethtool {end.name}`; re-enable autonegotiation: `sudo ethtool -s {end.name} autoneg on`",
                           **data)
    known = [(e, w) for e, w in ends if e is not None and e.speed_mbps is not None]
    slow = [(e, w) for e, w in known if facts.rated_mbps and e.speed_mbps is not None and e.speed_mbps < facts.rated_mbps]
    if slow:
        end, who = slow[0]
        return warn(f"the link runs at {end.speed_mbps} Mb/s ({who}), the card is rated {facts.rated_mbps} "
                    f"({facts.hardware_class}); {detail}",
                    f"`ethtool {end.name}` on both ends (speed, advertised modes): a cable or transceiver rated lower, "
                    f"or a port forced down (`sudo ethtool -s {end.name} autoneg on`)", **data)
    if len(known) == 2 and known[0][0].speed_mbps != known[1][0].speed_mbps:
        return warn(f"the two ends report different speeds: {detail}", "check the cable and `ethtool` on both ends",
                    **data)
    if not known:
        return skipped(detail, None, **data)
    return ok(detail, None, **data)


def _rdma_of(end: End | None, who: str) -> str:
    if end is None:
        return f"{who}: unknown"
    if not end.rdma:
        return f"{who} {end.name}: none: NCCL will fall back to sockets"
    return f"{who} {end.name}: " + ", ".join(
        f"{d.name}" + (f" ({d.port_state}" + (f", {d.rate})" if d.rate else ")") if d.port_state else "") for d in end.rdma)


def _rdma(facts: FabricFacts, pair: Pair) -> Finding:
    ends = [(pair.local, "here"), (pair.remote, facts.peer)] if facts.remote is not None else [(pair.local, "here")]
    detail = "; ".join(_rdma_of(e, w) for e, w in ends)
    data = {"rdma": [d.name for d in pair.local.rdma],
            "peer_rdma": [d.name for d in pair.remote.rdma] if pair.remote else None}
    for end, who in ends:
        if end is not None and any(d.active is False for d in end.rdma):
            return problem(f"{detail}: an RDMA port is not ACTIVE ({who})",
                           f"`ibv_devinfo` / `rdma link` ({who}); the link must be up on both ends", **data)
    missing = [(e, w) for e, w in ends if e is not None and not e.rdma]
    if missing:
        where = " and ".join("here" if w == "here" else f"on {w}" for _, w in missing)
        return warn(detail, f"load the ConnectX RDMA drivers {where} (`sudo modprobe mlx5_ib ib_uverbs rdma_ucm`; "
                    "an EP=2 launch without /dev/infiniband is refused), or launch with `run --no-rdma` (NCCL over "
                    "TCP sockets)", **data)
    several = [(e, w) for e, w in ends if e is not None and len(e.rdma) > 1]
    if several:
        return warn(f"{detail}: several devices, so NCCL_IB_HCA is not guessed",
                    "name one with `run --rdma-device DEV`", **data)
    return ok(detail, None, **data)


def nccl_default(report: Report) -> str | None:
    """NCCL's own pick without NCCL_SOCKET_IFNAME: an ib* interface first, else the first (in the kernel's
    order) that is neither lo nor docker*; only interfaces with an address count."""
    ordered = sorted((e for e in report.links.values() if e.ipv4), key=lambda e: (e.ifindex or 1 << 31, e.name))
    usable = [e.name for e in ordered if e.name != "lo" and not e.name.startswith("docker")]
    return next((n for n in usable if n.startswith("ib")), usable[0] if usable else None)


def _nccl(facts: FabricFacts, pair: Pair) -> Finding:
    from metralectl.seams.roce import NodeView, RoceRefused, choose_roce

    left_alone = nccl_default(facts.local)
    data: dict[str, object] = {"link": pair.local.name, "nccl_default": left_alone, "environ": facts.environ,
                               "candidates": list(facts.roce_candidates), "hardware_class": facts.hardware_class}
    alone = (f"left to itself NCCL would take {left_alone} (an ib* interface first, else the first not lo or "
             "docker*)") if left_alone else "left to itself NCCL finds no interface"
    shell = [f"{k}={v}" for k, v in facts.environ.items() if v]
    notes = f"; this shell sets {', '.join(shell)} (a launch by hand from here would use it)" if shell else ""
    if not facts.roce_candidates:
        return skipped(f"no hardware class with an EP=2 profile to compare with; the link is {pair.local.name}; "
                       f"{alone}{notes}", f"export NCCL_SOCKET_IFNAME={pair.local.name} for a launch by hand", **data)
    views = [NodeView("this machine", facts.local.net())]
    if facts.remote is not None:
        views.append(NodeView(facts.peer, facts.remote.net()))
    try:
        choice = choose_roce(facts.roce_candidates, views)
    except RoceRefused as exc:
        return problem(f"the EP=2 profile ({facts.hardware_class}: {', '.join(facts.roce_candidates)}) would refuse: "
                       f"{exc.message}; the link to {facts.peer} is {pair.local.name}; {alone}{notes}",
                       f"`run --worker … --roce-interface {pair.local.name} --master-addr {pair.local_addr.address}`, "
                       f"or address one of {', '.join(facts.roce_candidates)} on both nodes", **data)
    hca_here = pair.local.rdma[0].name if len(pair.local.rdma) == 1 else None
    hca_there = pair.remote.rdma[0].name if pair.remote is not None and len(pair.remote.rdma) == 1 else None
    data.update(profile_ifname=choice.interface, profile_hca=hca_here, peer_hca=hca_there)
    hca = f"NCCL_IB_HCA={hca_here or 'unset'} here, {hca_there or 'unset'} on {facts.peer}"
    if choice.interface != pair.local.name:
        return warn(f"the EP=2 profile would set NCCL_SOCKET_IFNAME={choice.interface} (an address on both nodes), but "
                    f"{pair.local.name} has {pair.why} to {facts.peer}; {alone}{notes}",
                    f"`run --worker … --roce-interface {pair.local.name} --master-addr {pair.local_addr.address}`, "
                    f"or take the addresses off {choice.interface}", **data)
    status = warn if shell and any(f"NCCL_SOCKET_IFNAME={pair.local.name}" != s for s in shell
                                   if s.startswith("NCCL_SOCKET_IFNAME=")) else ok
    return status(f"the EP=2 profile sets NCCL_SOCKET_IFNAME={choice.interface} (master address "
                  f"{choice.master_addr}), {hca}; {alone}{notes}", None, **data)


def check_throughput(facts: FabricFacts) -> Finding:
    if not facts.probes:
        return skipped(f"no probe: {facts.remote_error or 'the peer did not answer'}")
    parts, errors = [], []
    for p in facts.probes:
        if p.error:
            errors.append(f"{p.direction}: {p.error}")
        elif p.mbps is not None:
            parts.append(f"{p.direction} {p.mbps:.0f} Mb/s ({p.bytes / 2**20:.0f} MiB in {p.seconds:.2f} s)")
    data = {"address": facts.probe_address,
            "probes": [{"direction": p.direction, "bytes": p.bytes, "seconds": round(p.seconds, 4), "mbps":
                        None if p.mbps is None else round(p.mbps, 1), "error": p.error} for p in facts.probes]}
    text = f"to {facts.probe_address}: " + "; ".join(parts + errors)
    floor = "an HTTP probe between the agents: a floor (one TCP stream, Python), not NCCL's bandwidth"
    if errors:
        return warn(text, f"is the peer's agent listening on {facts.probe_address} (a firewall on that network?)",
                    **data)
    link = chosen(facts)
    speed = link.local.speed_mbps if link is not None else None
    slow = [p for p in facts.probes if p.mbps is not None and p.mbps < SLOW_PROBE_MBPS]
    if slow and speed is not None and speed >= 10_000:
        return warn(f"{text}: under 1 Gb/s on a {speed} Mb/s link ({floor})",
                    "errors on the link (`ip -s link`, `ethtool -S`), a port negotiated down, or a busy CPU", **data)
    return ok(f"{text} ({floor})", None, **data)


check_mtu = _need_pair(_mtu)
check_speed = _need_pair(_speed)
check_rdma = _need_pair(_rdma)
check_nccl = _need_pair(_nccl)

FABRIC_CHECKS: tuple[tuple[str, str, Callable[[FabricFacts], Finding]], ...] = (
    ("fabric.peer", "Peer's agent reports its links", check_peer),
    ("fabric.route", "Interface that reaches the peer", check_route),
    ("fabric.mtu", "MTU on both ends of the link", check_mtu),
    ("fabric.speed", "Link speed and duplex", check_speed),
    ("fabric.rdma", "RDMA device behind the link", check_rdma),
    ("fabric.nccl", "NCCL interface and HCA for EP=2", check_nccl),
    ("fabric.throughput", "Throughput probe between the agents", check_throughput),
)
