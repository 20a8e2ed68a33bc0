"""Known peers and pending hellos, in `<config>/peers/peers.json` (read-modify-write under a file lock).

A *known* peer is one whose key this box trusts: paired from here (`peer pair ADDR`: trust on first
use, after the operator saw its fingerprint) or promoted from a pending hello by the operator typing
its full fingerprint (`peer grant-bench FP`). Only known peers' signed requests are accepted.

A *pending* entry is a hello some machine sent to the peer listener ("I paired with you; here is my
key"). It grants nothing: it only lets `grant-bench FP` find the key for a fingerprint the operator
typed. At most MAX_PENDING are kept (oldest dropped): anyone can send a hello.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from metralectl import paths
from metralectl.errors import ExitCode, MetralError, NotFound
from metralectl.safetext import NAME_LIMIT, clean
from metralectl.seams.identity import fingerprint_of, public_key_from_b64

GRANTS = ("bench",)
MAX_PENDING = 32


def private_dir(path: Path) -> Path:
    """`path` as a directory only this user can enter (0700): created so, or narrowed if it was looser."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_mode & 0o077 and st.st_uid == os.geteuid():
        os.chmod(path, 0o700)  # made 0755 by an older version
    return path


class PeerKeyChanged(MetralError):
    """An address answered with a different key than the one paired: refused, loudly."""

    exit_code = ExitCode.FAILED


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Peer:
    fingerprint: str
    public_key: str  # base64 of the raw 32-byte Ed25519 key
    address: str | None  # "host:port" / "[v6]:port"; None for a peer known only from its hello
    name: str = ""
    first_seen: str = ""
    grants: tuple[str, ...] = ()
    via: str = "pair"  # "pair" (TOFU from here) or "hello" (promoted by the operator's typed fingerprint)

    @property
    def key(self) -> bytes:
        return public_key_from_b64(self.public_key)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["grants"] = list(self.grants)
        return out


@dataclass(frozen=True)
class Pending:
    fingerprint: str
    public_key: str
    name: str
    from_addr: str  # where the hello came from (its source IP and the peer port it announced)
    seen: str


@dataclass
class PeerBook:
    peers: list[Peer] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)

    def by_fingerprint(self, fp: str) -> Peer | None:
        return next((p for p in self.peers if p.fingerprint == fp), None)

    def by_address(self, address: str) -> Peer | None:
        return next((p for p in self.peers if p.address == address), None)


def _peer(raw: dict[str, Any]) -> Peer:
    peer = Peer(fingerprint=str(raw["fingerprint"]), public_key=str(raw["public_key"]),
                address=raw.get("address"), name=str(raw.get("name", "")), first_seen=str(raw.get("first_seen", "")),
                grants=tuple(g for g in raw.get("grants", ()) if g in GRANTS), via=str(raw.get("via", "pair")))
    if fingerprint_of(peer.key) != peer.fingerprint:
        raise ValueError(f"peer {peer.fingerprint}: the stored key does not have that fingerprint")
    return peer


class PeerStore:
    def __init__(self, base: Path | None = None) -> None:
        self.dir = (base if base is not None else paths.config_dir()) / "peers"
        self.path = self.dir / "peers.json"

    def _read(self) -> PeerBook:
        from metralectl.filecap import DOCUMENT_LIMIT, read_text

        try:  # FileRefused (exit 65) for a FIFO or a file past the cap
            raw = json.loads(read_text(self.path, DOCUMENT_LIMIT, "peer store"))
        except FileNotFoundError:
            return PeerBook()
        except (OSError, ValueError, RecursionError) as exc:
            raise MetralError(f"the peer store {paths.display(self.path)} is unreadable ({exc})",
                              "restore it, or move it away and pair again") from None
        try:
            peers = [_peer(p) for p in raw.get("peers", [])]
            pending = [Pending(**p) for p in raw.get("pending", [])]
        except (KeyError, TypeError, ValueError) as exc:
            raise MetralError(f"the peer store {paths.display(self.path)} is damaged ({exc})",
                              "restore it, or move it away and pair again") from None
        return PeerBook(peers, pending)

    def load(self) -> PeerBook:
        return self._read()

    @contextmanager
    def edit(self) -> Iterator[PeerBook]:
        """Read, let the caller change the book, write it back atomically (one writer at a time)."""
        from metralectl.seams.store import write_json

        private_dir(self.dir)
        fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            book = self._read()
            yield book
            write_json(self.path, {"version": 1, "peers": [p.to_json() for p in book.peers],
                                   "pending": [asdict(p) for p in book.pending]}, mode=0o600)
        finally:
            os.close(fd)  # closing releases the lock

    # -- operations -----------------------------------------------------------------------------
    def add_paired(self, fingerprint: str, public_key: str, address: str, name: str) -> tuple[Peer, str]:
        """Trust on first use. Returns (peer, what happened); a changed key for the address is refused."""
        with self.edit() as book:
            at_address = book.by_address(address)
            if at_address is not None and at_address.fingerprint != fingerprint:
                raise key_changed(address, at_address.fingerprint, fingerprint)
            known = book.by_fingerprint(fingerprint)
            if known is not None:
                if known.address == address:
                    return known, "already paired"
                moved = replace(known, address=address, name=name or known.name)
                book.peers[book.peers.index(known)] = moved
                return moved, f"already known; address updated ({known.address} -> {address})"
            peer = Peer(fingerprint, public_key, address, name, now_iso(), (), "pair")
            book.peers.append(peer)
            book.pending = [p for p in book.pending if p.fingerprint != fingerprint]
            return peer, "paired"

    def add_pending(self, fingerprint: str, public_key: str, name: str, from_addr: str) -> None:
        with self.edit() as book:
            if book.by_fingerprint(fingerprint) is not None:
                return  # already trusted: a hello changes nothing
            book.pending = [p for p in book.pending if p.fingerprint != fingerprint]
            book.pending.append(Pending(fingerprint, public_key, name[:NAME_LIMIT], from_addr, now_iso()))
            book.pending = book.pending[-MAX_PENDING:]

    def grant(self, fingerprint: str, grant: str = "bench") -> tuple[Peer, str]:
        if grant not in GRANTS:
            raise NotFound(f"unknown grant {grant!r}", f"grants: {', '.join(GRANTS)}")
        with self.edit() as book:
            peer = book.by_fingerprint(fingerprint)
            how = ""
            if peer is None:
                hello = next((p for p in book.pending if p.fingerprint == fingerprint), None)
                if hello is None:
                    raise NotFound(f"no peer with fingerprint {fingerprint}",
                                   "pair with it first (`metralectl peer pair ADDR`), or have it run "
                                   "`metralectl peer pair <this box>` so its hello arrives here")
                host = hello.from_addr
                peer = Peer(fingerprint, hello.public_key, host or None, hello.name, now_iso(), (), "hello")
                book.peers.append(peer)
                book.pending.remove(hello)
                how = f"trusted from its hello ({clean(hello.name, NAME_LIMIT) or '?'} at {clean(host) or '?'}); "
            if grant in peer.grants:
                return peer, how + f"{grant} was already granted"
            updated = replace(peer, grants=tuple(sorted({*peer.grants, grant})))
            book.peers[book.peers.index(peer)] = updated
            return updated, how + f"granted {grant}"

    def revoke(self, fingerprint: str) -> Peer:
        with self.edit() as book:
            peer = book.by_fingerprint(fingerprint)
            if peer is None:
                raise NotFound(f"no peer with fingerprint {fingerprint}", "`metralectl peer list` shows them")
            book.peers.remove(peer)
            return peer

    def known_keys(self) -> dict[str, bytes]:
        return {p.fingerprint: p.key for p in self.load().peers}


def key_changed(address: str, old: str, new: str) -> PeerKeyChanged:
    return PeerKeyChanged(
        f"KEY CHANGED for {address}: it was paired as {old}, it now answers as {new}. "
        "Refused: someone may be impersonating it, or it was reinstalled with a new identity",
        f"check `metralectl id` on that machine; if the new fingerprint is really its own, "
        f"`metralectl peer revoke {old}` and pair again")


def known_keys(base: Path | None = None, *, include_self: bool = True) -> dict[str, bytes]:
    """Keys a signed record may be signed by: this box's own and its known peers'."""
    keys = PeerStore(base).known_keys()
    if include_self:
        from metralectl.seams import identity
        try:
            me = identity.load(base)
        except identity.IdentityError:
            pass
        else:
            keys[me.fingerprint] = me.public_key
    return keys
