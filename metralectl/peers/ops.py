"""What `peer pair` and `nodes` do, as functions over explicit inputs (the CLI only renders)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metralectl.errors import ExitCode, MetralError
from metralectl.seams.identity import Identity
from metralectl.peers import PEER_PORT
from metralectl.peers.address import PeerAddress, parse_address
from metralectl.peers.admission import Admission
from metralectl.peers.client import RemoteIdentity, fetch_identity, hello, signed_call
from metralectl.peers.store import PeerStore, key_changed


@dataclass(frozen=True)
class PairResult:
    address: str
    fingerprint: str
    name: str
    outcome: str  # "paired", "already paired", "already known; address updated (...)"
    hello: str  # what the node said to our hello (or why it could not be sent)


def pair(text: str, me: Identity, *, base: Path | None = None, confirm: Callable[[RemoteIdentity, str], bool],
         name: str, peer_port: int = PEER_PORT, timeout: float = 5.0) -> PairResult:
    """Trust on first use: fetch the node's proven identity, refuse a changed key, ask, store, say hello."""
    addr = parse_address(text)
    remote = fetch_identity(addr, timeout=timeout)
    if remote.fingerprint == me.fingerprint:
        raise MetralError(f"{addr} is this machine ({me.fingerprint})", "pair with another node")
    store = PeerStore(base)
    book = store.load()
    at_address = book.by_address(addr.netloc)
    if at_address is not None and at_address.fingerprint != remote.fingerprint:
        raise key_changed(addr.netloc, at_address.fingerprint, remote.fingerprint)
    if book.by_fingerprint(remote.fingerprint) is None and not confirm(remote, addr.netloc):
        raise MetralError(f"not paired with {addr}", None, exit_code=ExitCode.FAILED)
    peer, outcome = store.add_paired(remote.fingerprint, remote.public_b64, addr.netloc, remote.name)
    try:
        answer = hello(me, addr, remote.fingerprint, remote.public_key, name=name, peer_port=peer_port, timeout=timeout)
        said = "it has our key as pending" if answer.status == 200 else f"hello answered {answer.status}: {answer.value}"
    except MetralError as exc:
        said = f"hello not delivered: {exc.message}"
    return PairResult(addr.netloc, peer.fingerprint, peer.name, outcome, said)


@dataclass(frozen=True)
class NodeAnswer:
    address: str
    admitted: bool
    fingerprint: str | None = None
    admission: Admission | None = None
    error: str | None = None
    hint: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "admitted": self.admitted, "fingerprint": self.fingerprint,
                "admission": self.admission.to_json() if self.admission else None, "error": self.error,
                "hint": self.hint}

    @property
    def reasons(self) -> list[str]:
        if self.error:
            return [self.error]
        return [c.detail for c in self.admission.reasons] if self.admission else []


def ask_node(text: str, me: Identity, *, base: Path | None = None, timeout: float = 5.0) -> NodeAnswer:
    try:
        addr: PeerAddress = parse_address(text)
    except MetralError as exc:
        return NodeAnswer(text, False, error=exc.message, hint=exc.hint)
    peer = PeerStore(base).load().by_address(addr.netloc)
    if peer is None:
        return NodeAnswer(addr.netloc, False, error="not paired with this machine",
                          hint=f"`metralectl peer pair {addr.netloc}`, then on that node `metralectl peer grant-bench "
                               f"{me.fingerprint}`")
    try:
        answer = signed_call(me, addr, peer.fingerprint, peer.key, "GET", "/peer/v1/admission", timeout=timeout)
    except MetralError as exc:
        return NodeAnswer(addr.netloc, False, peer.fingerprint, error=exc.message, hint=exc.hint)
    if answer.status != 200 or not isinstance(answer.value, dict):
        detail = answer.value.get("error") if isinstance(answer.value, dict) else answer.value
        return NodeAnswer(addr.netloc, False, peer.fingerprint, error=f"refused the request ({answer.status}): {detail}",
                          hint=answer.value.get("hint") if isinstance(answer.value, dict) else None)
    try:
        admission = Admission.from_json(answer.value)
    except (KeyError, TypeError, ValueError) as exc:
        return NodeAnswer(addr.netloc, False, peer.fingerprint, error=f"malformed admission answer ({exc})")
    if admission.fingerprint != peer.fingerprint:
        return NodeAnswer(addr.netloc, False, peer.fingerprint,
                          error=f"the answer names signer {admission.fingerprint}, not {peer.fingerprint}")
    return NodeAnswer(addr.netloc, admission.admitted, peer.fingerprint, admission)


def ask_nodes(texts: Sequence[str], me: Identity, *, base: Path | None = None, timeout: float = 5.0) -> list[NodeAnswer]:
    """Each node's answer, asked in parallel, in the order given."""
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(texts)))) as pool:
        return list(pool.map(lambda t: ask_node(t, me, base=base, timeout=timeout), texts))
