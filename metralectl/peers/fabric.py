"""`doctor --peer HOST`: the fabric preflight before an EP=2 launch, as doctor checks.

    ref = resolve("spark2")                                   # a paired peer, by its name or its address
    session = Session(ref, me, profile=profile_of(catalog))   # gathers once: both ends' links, the route, the probe
    checks = session.checks()                                 # doctor Checks (fabric.*), judged by doctor.fabric_checks

This node's links come from seams.linkfacts; the peer's from its agent (`GET /peer/v1/fabric`, signed by the key
paired with it), read through the same untrusting reader (doctor.fabric_facts.parse_report). The throughput probe
goes to the peer's address on the chosen link, at its peer port: a download (`/source`) and an upload (`/sink`),
each bounded in bytes and time on both sides. Every request has a timeout; nothing here can hang doctor past
FABRIC_TIMEOUT_S.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metralectl.errors import MetralError, NotFound
from metralectl.peers.address import PeerAddress, parse_address
from metralectl.peers.store import PeerStore
from metralectl.safetext import NAME_LIMIT, clean

if TYPE_CHECKING:
    from collections.abc import Callable

    from metralectl.core.catalog import Catalog
    from metralectl.doctor.context import Context
    from metralectl.doctor.model import Finding
    from metralectl.doctor.fabric_facts import FabricFacts, Probe
    from metralectl.doctor.model import Check
    from metralectl.peers.remote_units import NodeRef
    from metralectl.seams.identity import Identity

REPORT_TIMEOUT_S = 3.0
PROBE_S = 1.5  # the download's own cut (the peer cuts at fabric_routes.PROBE_S)
DOWNLOAD_BYTES = 256 << 20
UPLOAD_MIN, UPLOAD_MAX = 1 << 20, 64 << 20
FABRIC_TIMEOUT_S = 12.0  # doctor's deadline for the fabric checks (counted from the run's start)


def resolve(host: str, base: Path | None = None) -> NodeRef:
    """A paired peer by its name (as it named itself when paired) or its address (host[:port])."""
    from metralectl.peers.remote_units import NodeRef

    peers = PeerStore(base).load().peers
    named = [p for p in peers if p.name and p.name == host and p.address]
    if len(named) > 1:
        raise NotFound(f"{len(named)} paired peers are named {clean(host, NAME_LIMIT)!r}",
                       "name it by its address: " + ", ".join(str(p.address) for p in named))
    if not named:
        try:
            addr = parse_address(host)
        except MetralError:
            addr = None
        if addr is not None:
            named = [p for p in peers if p.address == addr.netloc]
            if not named and ":" not in host.strip("[]"):  # the host alone: any port it was paired at
                named = [p for p in peers if p.address and parse_address(p.address).host == addr.host]
    if len(named) != 1:
        known = ", ".join(f"{clean(p.name, NAME_LIMIT) or '?'} ({p.address})" for p in peers if p.address) or "none"
        raise NotFound(f"{clean(host, NAME_LIMIT)!r} is not a paired peer (paired: {known})",
                       f"`metralectl peer pair {clean(host, NAME_LIMIT)}` first; on that node `metralectl peer "
                       "grant-bench FINGERPRINT` (this box's `metralectl id`) so its agent answers")
    peer = named[0]
    assert peer.address is not None
    return NodeRef(parse_address(peer.address), peer.fingerprint, peer.key, peer.name)


@dataclass(frozen=True)
class Profile:
    """What the fabric is judged against: the hardware class with an EP=2 profile."""

    hardware_class: str | None = None
    roce_candidates: tuple[str, ...] = ()
    rated_mbps: int | None = None
    expected_mtu: int | None = None


def profile_of(catalog: Catalog, recipe: str | None = None) -> Profile:
    """The recipe's hardware class; without one, the one class with multi-node launches (GB10)."""
    if recipe is not None:
        classes = [catalog.hardware[catalog.recipe(recipe).hardware]]
    else:
        classes = [hw for hw in catalog.hardware.values() if hw.multi_node.get("roce-interfaces")]
    if len(classes) != 1 or not classes[0].multi_node:
        return Profile(classes[0].id if len(classes) == 1 else None)
    hw = classes[0]
    multi = hw.multi_node
    return Profile(hw.id, tuple(str(i) for i in multi.get("roce-interfaces") or ()),
                   multi.get("link-mbps"), multi.get("mtu"))


def _report(me: Identity, ref: NodeRef) -> tuple[Any, str | None]:
    from metralectl.doctor.fabric_facts import parse_report
    from metralectl.peers.client import signed_call

    try:
        answer = signed_call(me, ref.address, ref.fingerprint, ref.public_key, "GET", "/peer/v1/fabric",
                             timeout=REPORT_TIMEOUT_S)
    except MetralError as exc:
        return None, clean(exc.message, 300)
    if answer.status != 200:
        said = answer.value.get("error") if isinstance(answer.value, dict) else answer.value
        return None, clean(f"answered {answer.status}: {said}", 300)
    return parse_report(answer.value), None


def _download(me: Identity, ref: NodeRef, addr: PeerAddress) -> Probe:
    from metralectl.doctor.fabric_facts import Probe
    from metralectl.peers.protocol import sign_request, verify_response
    from metralectl.seams.httpclient import Client, Failed

    path = f"/peer/v1/fabric/source?bytes={DOWNLOAD_BYTES}"
    headers = sign_request(me, ref.fingerprint, "GET", path)
    got, started = 0, time.monotonic()
    try:
        with Client(timeout=REPORT_TIMEOUT_S) as client, client.stream("GET", addr.url(path), headers=headers) as reply:
            if reply.status != 200:
                return Probe("from the peer", error=f"answered {reply.status}: {clean(reply.peek(300).decode(errors='replace'), 300)}")
            why = verify_response(reply.headers, 200, b"", nonce=headers["X-Metrale-Nonce"], me=me.fingerprint,
                                  expect_key=ref.fingerprint, public=ref.public_key)
            if why:
                return Probe("from the peer", error=f"answer refused: {why}")
            started = time.monotonic()
            for chunk in reply.chunks():
                got += len(chunk)
                if got >= DOWNLOAD_BYTES or time.monotonic() - started > PROBE_S:
                    break
    except Failed as exc:
        if not got:
            return Probe("from the peer", error=clean(exc.named, 300))
    return Probe("from the peer", got, time.monotonic() - started)


def _upload(me: Identity, ref: NodeRef, addr: PeerAddress, size: int) -> Probe:
    from metralectl.doctor.fabric_facts import Probe
    from metralectl.peers.client import _send
    from metralectl.peers.protocol import sign_request, verify_response

    path = f"/peer/v1/fabric/sink?bytes={size}"
    headers = sign_request(me, ref.fingerprint, "POST", path)
    headers["Content-Type"] = "application/octet-stream"
    started = time.monotonic()
    try:
        status, answer_headers, body = _send(addr, "POST", path, bytes(size), headers, REPORT_TIMEOUT_S + PROBE_S)
    except MetralError as exc:
        return Probe("to the peer", error=clean(exc.message, 300))
    seconds = time.monotonic() - started
    why = verify_response(answer_headers, status, body, nonce=headers["X-Metrale-Nonce"], me=me.fingerprint,
                          expect_key=ref.fingerprint, public=ref.public_key)
    if why or status != 200:
        return Probe("to the peer", error=f"answered {status}" + (f": {why}" if why else
                                                                  f": {clean(body[:300].decode(errors='replace'))}"))
    return Probe("to the peer", size, seconds)


def probe(me: Identity, ref: NodeRef, host: str) -> tuple[Probe, ...]:
    """Download, then an upload sized from the download's rate (about one second's worth, capped)."""
    addr = PeerAddress(host, ref.address.port)
    down = _download(me, ref, addr)
    if down.error is not None:
        return (down,)  # the address does not answer: an upload would only wait out its timeout too
    rate = down.bytes / down.seconds if down.seconds > 0 and down.bytes else 0
    size = int(min(UPLOAD_MAX, max(UPLOAD_MIN, rate * 0.5)))
    return down, _upload(me, ref, addr, size)


def gather(ref: NodeRef, me: Identity, profile: Profile, *, label: str, sys_root: str = "/sys",
           proc_root: str = "/proc", run_probe: bool = True) -> FabricFacts:
    from metralectl.doctor.fabric_facts import FabricFacts, parse_report
    from metralectl.doctor.fabric_checks import chosen
    from metralectl.seams import linkfacts

    local = parse_report(linkfacts.local_report(sys_root, proc_root))
    host = linkfacts.ipv4_of(ref.address.host)  # a name resolved (bounded); None for IPv6
    route = linkfacts.route_to(linkfacts.read_routes(proc_root), host) if host else None
    remote, error = _report(me, ref)
    facts = FabricFacts(
        peer=clean(label, NAME_LIMIT), peer_host=host or ref.address.host, local=local, remote=remote,
        remote_error=error, route_iface=route.interface if route else None,
        route_gateway=route.gateway if route else None, route_prefix=route.prefix if route else None,
        source=linkfacts.source_address(host) if host else None,
        hardware_class=profile.hardware_class, roce_candidates=profile.roce_candidates,
        rated_mbps=profile.rated_mbps, expected_mtu=profile.expected_mtu,
        environ={k: clean(os.environ[k], 200) for k in ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA") if k in os.environ})
    if remote is None or not run_probe:
        return facts
    pair = chosen(facts)
    host = pair.remote_addr if pair is not None else ref.address.host
    return replace(facts, probes=probe(me, ref, host), probe_address=PeerAddress(host, ref.address.port).netloc)


class Session:
    """The facts gathered once, in the first check's thread; the other checks wait for them (bounded)."""

    def __init__(self, ref: NodeRef, me: Identity, profile: Profile, *, label: str, sys_root: str = "/sys",
                 proc_root: str = "/proc") -> None:
        self._args = (ref, me, profile)
        self._kw = {"label": label, "sys_root": sys_root, "proc_root": proc_root}
        self._lock = threading.Lock()
        self._facts: FabricFacts | None = None
        self._error: BaseException | None = None

    def facts(self) -> FabricFacts:
        with self._lock:
            if self._facts is None and self._error is None:
                try:
                    self._facts = gather(*self._args, **self._kw)  # type: ignore[arg-type]
                except Exception as exc:  # noqa: BLE001 - every check reports it as its own verdict
                    self._error = exc
            if self._error is not None:
                raise self._error
            assert self._facts is not None
            return self._facts

    def checks(self) -> tuple[Check, ...]:
        from metralectl.doctor.fabric_checks import FABRIC_CHECKS
        from metralectl.doctor.model import Check

        def bound(judge: Callable[[FabricFacts], Finding]) -> Callable[[Context], Finding]:
            return lambda ctx: judge(self.facts())
        return tuple(Check(cid, title, bound(judge), timeout_s=FABRIC_TIMEOUT_S) for cid, title, judge in FABRIC_CHECKS)
