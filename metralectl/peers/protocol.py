"""The peer protocol's signatures: requests (created/expires/nonce, bound to one node) and responses.

Request headers (docs/agent.md):

    X-Metrale-Key        the requester's fingerprint
    X-Metrale-To         the fingerprint of the node it is meant for (a request cannot be replayed elsewhere)
    X-Metrale-Created    unix seconds
    X-Metrale-Expires    unix seconds; expires - created <= MAX_WINDOW_S
    X-Metrale-Nonce      16-64 url-safe base64 characters, never reused
    X-Metrale-Signature  base64 Ed25519 signature over
                         PAE[domain "metralectl-peer-request/1"](METHOD, {path, key, to, created, expires, nonce}, body)

A response carries X-Metrale-Key (the node's fingerprint) and X-Metrale-Signature over
PAE[domain "metralectl-peer-response/1"](STATUS, {nonce: the request's, key, to: the requester}, body), so
the requester knows the answer came from the key it paired with, for this request.

Replay: a request is refused once it has expired (by the node's clock), or if it claims to be created
more than CLOCK_SKEW_S in the future, or if its nonce was already seen. A nonce only has to be
remembered until its request expires, so the seen-nonce store is time-windowed: at most MAX_WINDOW_S of
nonces, bounded in count (when full the node answers 503 instead of forgetting a live nonce), and
appended to a file so that restarting the listener does not reopen the window.
"""

from __future__ import annotations

import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from metralectl.seams.identity import Identity, b64, unb64, verify_signature
from metralectl.seams.signing import pae

REQUEST_DOMAIN = "metralectl-peer-request/1"
RESPONSE_DOMAIN = "metralectl-peer-response/1"
H_KEY, H_TO, H_CREATED, H_EXPIRES, H_NONCE, H_SIG = (
    "X-Metrale-Key", "X-Metrale-To", "X-Metrale-Created", "X-Metrale-Expires", "X-Metrale-Nonce",
    "X-Metrale-Signature")
DEFAULT_TTL_S = 60
MAX_WINDOW_S = 300
CLOCK_SKEW_S = 30
MAX_NONCES = 100_000
_NONCE = re.compile(r"[A-Za-z0-9_-]{16,64}")
_DIGITS = re.compile(r"[0-9]{1,12}")  # ASCII: str.isdigit() is true for '²', which int() refuses


class Headers(Protocol):
    """What is read from headers: a Mapping, http.server's message, httpx's Headers all fit."""

    def get(self, name: str, /) -> str | None: ...


def new_nonce() -> str:
    return secrets.token_urlsafe(18)  # 24 characters, 144 bits


def _request_pae(method: str, path: str, key: str, to: str, created: str, expires: str, nonce: str,
                 body: bytes) -> bytes:
    names = {"path": path, "key": key, "to": to, "created": created, "expires": expires, "nonce": nonce}
    return pae(method.upper(), names, body, domain=REQUEST_DOMAIN)


def sign_request(me: Identity, to: str, method: str, path: str, body: bytes = b"", *,
                 now: float | None = None, ttl_s: int = DEFAULT_TTL_S, nonce: str | None = None) -> dict[str, str]:
    created = int(time.time() if now is None else now)
    headers = {H_KEY: me.fingerprint, H_TO: to, H_CREATED: str(created), H_EXPIRES: str(created + ttl_s),
               H_NONCE: nonce or new_nonce()}
    data = _request_pae(method, path, me.fingerprint, to, headers[H_CREATED], headers[H_EXPIRES],
                        headers[H_NONCE], body)
    headers[H_SIG] = b64(me.sign(data))
    return headers


@dataclass(frozen=True)
class Refusal:
    status: int  # 401 unsigned/bad signature, 403 unknown peer / wrong node, 409 replay, 503 store full
    reason: str


@dataclass(frozen=True)
class SignedRequest:
    key: str  # the requester's fingerprint
    nonce: str
    expires: int


class NonceStore:
    """Seen nonces until their requests expire; persisted (append-only) when given a path."""

    def __init__(self, path: Path | None = None, *, max_entries: int = MAX_NONCES,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.max_entries = max_entries
        self.clock = clock
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._lines = 0
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        from metralectl.filecap import DOCUMENT_LIMIT, read_text

        now = self.clock()
        try:  # FileRefused (exit 65) for a FIFO or a file past the cap; a torn line is skipped below
            text = read_text(path, DOCUMENT_LIMIT, "nonce store", errors="replace")
        except FileNotFoundError:
            return  # nothing seen yet; the file appears with the first accepted request
        for line in text.splitlines():
            nonce, _, expires = line.partition(" ")
            if _DIGITS.fullmatch(expires) and int(expires) >= now - CLOCK_SKEW_S:
                self._seen[nonce] = int(expires)
        self._compact()

    def _compact(self) -> None:
        if self.path is None:
            return
        from metralectl.seams.store import write_atomic

        write_atomic(self.path, "".join(f"{n} {e}\n" for n, e in self._seen.items()), mode=0o600)
        self._lines = len(self._seen)

    def _purge(self, now: float) -> None:
        expired = [n for n, e in self._seen.items() if e < now]
        for n in expired:
            del self._seen[n]

    def __len__(self) -> int:
        return len(self._seen)

    def check_and_add(self, nonce: str, expires: int) -> Refusal | None:
        with self._lock:
            now = self.clock()
            if nonce in self._seen:
                return Refusal(409, "replayed request: this nonce was already used")
            if len(self._seen) >= self.max_entries:
                self._purge(now)
                if len(self._seen) >= self.max_entries:
                    return Refusal(503, "too many requests in the replay window; try again shortly")
            self._seen[nonce] = expires
            if self.path is not None:
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                try:
                    os.write(fd, f"{nonce} {expires}\n".encode())
                finally:
                    os.close(fd)
                self._lines += 1
                if self._lines > 2 * len(self._seen) + 1000:
                    self._purge(now)
                    self._compact()
            return None


def verify_request(headers: Headers, method: str, path: str, body: bytes, *, me: str,
                   keys: Callable[[str], bytes | None], nonces: NonceStore,
                   now: float | None = None) -> SignedRequest | Refusal:
    """Check a request's signature, freshness and nonce. keys(fp) gives the requester's trusted key."""
    values = {h: headers.get(h) for h in (H_KEY, H_TO, H_CREATED, H_EXPIRES, H_NONCE, H_SIG)}
    missing = [h for h, v in values.items() if not v]
    if missing:
        return Refusal(401, f"unsigned request (missing {', '.join(missing)})")
    key, to, created_s, expires_s, nonce, sig_s = (str(values[h]) for h in (H_KEY, H_TO, H_CREATED, H_EXPIRES,
                                                                            H_NONCE, H_SIG))
    if to != me:
        return Refusal(403, f"this request is for node {to}, not this one ({me})")
    public = keys(key)
    if public is None:
        return Refusal(403, f"unknown peer {key}: this node does not trust that key (on this node: "
                            f"`metralectl peer grant-bench {key}` once its hello arrived, or `metralectl peer pair` it)")
    if not (_DIGITS.fullmatch(created_s) and _DIGITS.fullmatch(expires_s)) or not _NONCE.fullmatch(nonce):
        return Refusal(401, "malformed created/expires/nonce")
    created, expires = int(created_s), int(expires_s)
    t = time.time() if now is None else now
    if expires <= created or expires - created > MAX_WINDOW_S:
        return Refusal(401, f"the request's lifetime must be 1..{MAX_WINDOW_S} s")
    if created > t + CLOCK_SKEW_S:
        return Refusal(401, f"the request was created {created - t:.0f} s in the future; check both clocks (NTP)")
    if t > expires:
        return Refusal(401, f"expired request ({t - expires:.0f} s ago); check both clocks (NTP) if this repeats")
    try:
        signature = unb64(sig_s, "signature")
    except ValueError as exc:
        return Refusal(401, str(exc))
    if not verify_signature(public, signature, _request_pae(method, path, key, to, created_s, expires_s, nonce, body)):
        return Refusal(401, "bad signature: not signed by the key this node knows for that peer")
    refusal = nonces.check_and_add(nonce, expires)
    if refusal is not None:
        return refusal
    return SignedRequest(key, nonce, expires)


def sign_response(me: Identity, status: int, nonce: str, to: str, body: bytes) -> dict[str, str]:
    data = pae(str(status), {"nonce": nonce, "key": me.fingerprint, "to": to}, body, domain=RESPONSE_DOMAIN)
    return {H_KEY: me.fingerprint, H_SIG: b64(me.sign(data))}


def verify_response(headers: Headers, status: int, body: bytes, *, nonce: str, me: str,
                    expect_key: str, public: bytes) -> str | None:
    """None when the response is signed by `expect_key` for this request; else why not."""
    key, sig_s = headers.get(H_KEY), headers.get(H_SIG)
    if not key or not sig_s:
        return "the answer is not signed (not a metralectl peer listener?)"
    if key != expect_key:
        return f"answered as {key}, expected {expect_key}"
    try:
        signature = unb64(sig_s, "signature")
    except ValueError as exc:
        return str(exc)
    data = pae(str(status), {"nonce": nonce, "key": key, "to": me}, body, domain=RESPONSE_DOMAIN)
    if not verify_signature(public, signature, data):
        return "the answer's signature does not verify with the paired key"
    return None


# -- streamed answers: one signature per line ---------------------------------------------------------
EVENT_DOMAIN = "metralectl-peer-event/1"


def _event_pae(nonce: str, key: str, to: str, stream: str, line: bytes) -> bytes:
    return pae("event", {"nonce": nonce, "key": key, "to": to, "stream": stream}, line, domain=EVENT_DOMAIN)


def sign_event_line(me: Identity, nonce: str, to: str, stream: str, line: bytes) -> bytes:
    """`<signature> <json>\\n`: each line of a stream is signed on its own (the stream has no end to sign),
    bound to the request's nonce and the stream's name, so lines cannot be moved between streams."""
    return b64(me.sign(_event_pae(nonce, me.fingerprint, to, stream, line))).encode() + b" " + line + b"\n"


def verify_event_line(raw: bytes, *, nonce: str, me: str, key: str, public: bytes, stream: str) -> bytes | None:
    """The JSON bytes of a signed stream line, or None when its signature does not verify."""
    sig_s, sep, line = raw.rstrip(b"\n").partition(b" ")
    if not sep:
        return None
    try:
        signature = unb64(sig_s.decode("ascii"), "signature")
    except (ValueError, UnicodeDecodeError):
        return None
    return line if verify_signature(public, signature, _event_pae(nonce, key, me, stream, line)) else None
