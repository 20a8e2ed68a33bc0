"""The submitting side of remote benchmark units: submit, follow (re-attaching after a lost link), fetch + verify.

A record fetched from a node is accepted only when it is for that unit and completed, its envelope verifies
against the keys this box knows, it is signed by that very node, and the per-request timings it names are
the ones that came with it. Only then is anything written (run.json with its exact bytes, run.json.sig,
requests.jsonl), so `metralectl bench verify DIR` re-checks it later against the same keys.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metralectl.errors import ExitCode, MetralError
from metralectl.seams.identity import Identity
from metralectl.peers.address import PeerAddress, parse_address
from metralectl.peers.client import (TIMEOUT_S, Answer, PeerProtocolError, PeerUnreachable, StreamBroken,
                                     _decode, open_stream, signed_call)
from metralectl.seams.httpserve import parse_json
from metralectl.peers.protocol import H_KEY, sign_request, verify_event_line, verify_response
from metralectl.peers.store import PeerStore, key_changed
from metralectl.wording import count

MAX_LOSSES = 10  # a follower that lost its link this many times gives up (a harness failure)
READ_TIMEOUT_S = 10.0  # the node sends a heartbeat every 2 s: silence this long is a lost link


class UnitRefused(MetralError):
    """The node answered, and said no (with its reasons)."""

    exit_code = ExitCode.FAILED

    def __init__(self, message: str, hint: str | None = None, *, status: int = 0,
                 reasons: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message, hint)
        self.status = status
        self.reasons = reasons or []


class LinkLost(MetralError):
    """The event stream was lost more often than a follower tolerates."""

    exit_code = ExitCode.UNAVAILABLE


class RecordRejected(MetralError):
    """A fetched record failed a check; nothing of it was kept."""

    exit_code = ExitCode.DATA


@dataclass(frozen=True)
class NodeRef:
    """A paired node: where it answers and the key its answers must be signed by."""

    address: PeerAddress
    fingerprint: str
    public_key: bytes
    name: str = ""

    @classmethod
    def lookup(cls, text: str, base: Path | None = None) -> NodeRef:
        addr = parse_address(text)
        peer = PeerStore(base).load().by_address(addr.netloc)
        if peer is None:
            raise MetralError(f"{addr.netloc} is not paired with this machine", f"`metralectl peer pair {addr.netloc}`")
        return cls(addr, peer.fingerprint, peer.key, peer.name)

    def __str__(self) -> str:
        return self.address.netloc


def _call(me: Identity, node: NodeRef, method: str, path: str, body: bytes = b"", timeout: float = TIMEOUT_S) -> Answer:
    return signed_call(me, node.address, node.fingerprint, node.public_key, method, path, body, timeout=timeout)


def _refused(node: NodeRef, what: str, answer: Answer) -> UnitRefused:
    value = answer.value if isinstance(answer.value, dict) else {"error": answer.value}
    return UnitRefused(f"{node}: {what} refused ({answer.status}): {value.get('error')}", value.get("hint"),
                       status=answer.status, reasons=value.get("reasons"))


def submit(me: Identity, node: NodeRef, spec: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """(the unit, True when the node created it now; False: it already had this unit)."""
    answer = _call(me, node, "POST", "/peer/v1/units", json.dumps(dict(spec), sort_keys=True).encode())
    if answer.status not in (200, 202) or not isinstance(answer.value, dict):
        raise _refused(node, f"unit {spec.get('key')}", answer)
    return answer.value, answer.status == 202


def unit_state(me: Identity, node: NodeRef, key: str) -> dict[str, Any]:
    answer = _call(me, node, "GET", f"/peer/v1/units/{key}")
    if answer.status != 200 or not isinstance(answer.value, dict):
        raise _refused(node, f"status of unit {key}", answer)
    return answer.value


def cancel(me: Identity, node: NodeRef, key: str, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    answer = _call(me, node, "POST", f"/peer/v1/units/{key}/cancel", timeout=timeout)
    if answer.status != 200 or not isinstance(answer.value, dict):
        raise _refused(node, f"cancelling unit {key}", answer)
    return answer.value


def thermal(me: Identity, node: NodeRef, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    answer = _call(me, node, "GET", "/peer/v1/thermal", timeout=timeout)
    if answer.status != 200 or not isinstance(answer.value, dict):
        raise _refused(node, "thermal reading", answer)
    return answer.value


@dataclass(frozen=True)
class Followed:
    end: dict[str, Any]  # the unit's "end" event: data.state, data.verdict, ...
    last_seq: int
    losses: int  # how many times the link was lost and re-attached


def follow(me: Identity, node: NodeRef, key: str, on_event: Callable[[dict[str, Any]], None], *, after: int = 0,
           max_losses: int = MAX_LOSSES, read_timeout: float = READ_TIMEOUT_S,
           stop: threading.Event | None = None,
           on_loss: Callable[[int, str], None] | None = None) -> Followed:
    """Every event of the unit after `after`, once each and in order, until its "end" event; a lost link
    (EOF before "end", silence beyond read_timeout, a refused connection) re-attaches from the last seq."""
    last, losses = after, 0
    while True:
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt
        try:
            end = _stream_once(me, node, key, last, on_event, read_timeout, stop)
            if end is not None:
                return Followed(end, int(end["seq"]), losses)
            why = "the stream ended before the unit did"
        except _Progressed as p:
            last = p.last
            why = p.why
        except PeerUnreachable as exc:
            why = exc.message
        losses += 1
        if on_loss is not None:
            on_loss(losses, why)
        if losses >= max_losses:
            raise LinkLost(f"{node}: lost the event stream of unit {key} {count(losses, 'time')} (last: {why})",
                           "check the link to that node; the unit may still be running there")
        time.sleep(min(0.2 * losses, 2.0))


class _Progressed(Exception):
    """A stream broke after delivering events up to `last`."""

    def __init__(self, last: int, why: str) -> None:
        self.last, self.why = last, why


def _stream_once(me: Identity, node: NodeRef, key: str, after: int, on_event: Callable[[dict[str, Any]], None],
                 read_timeout: float, stop: threading.Event | None) -> dict[str, Any] | None:
    path = f"/peer/v1/units/{key}/events?after={after}"
    headers = sign_request(me, node.fingerprint, "GET", path)
    nonce, stream = headers["X-Metrale-Nonce"], f"units/{key}/events"
    last = after
    try:
        with open_stream(node.address, path, headers, read_timeout=read_timeout) as response:
            answered_as = response.headers.get(H_KEY)
            if answered_as and answered_as != node.fingerprint:
                raise key_changed(str(node), node.fingerprint, str(answered_as))
            if response.status != 200:
                body = response.read()
                problem = verify_response(response.headers, response.status, body, nonce=nonce,
                                          me=me.fingerprint, expect_key=node.fingerprint, public=node.public_key)
                if problem:
                    raise PeerProtocolError(f"{node}: answer refused: {problem}")
                raise _refused(node, f"events of unit {key}", Answer(response.status, _decode(node, body)))
            problem = verify_response(response.headers, 200, b"", nonce=nonce, me=me.fingerprint,
                                      expect_key=node.fingerprint, public=node.public_key)
            if problem:
                raise PeerProtocolError(f"{node}: stream refused: {problem}")
            for raw in response.lines:
                if stop is not None and stop.is_set():
                    raise KeyboardInterrupt
                line = verify_event_line(raw, nonce=nonce, me=me.fingerprint, key=node.fingerprint,
                                         public=node.public_key, stream=stream)
                if line is None:
                    raise PeerProtocolError(f"{node}: a line of unit {key}'s stream is not signed by its key")
                event = _decode(node, line)
                if not isinstance(event, dict):
                    raise PeerProtocolError(f"{node}: a line of unit {key}'s stream is not an event object")
                if event.get("kind") == "heartbeat":
                    continue
                seq = int(event["seq"])
                if seq <= last:
                    continue  # already seen (a node never sends these, but a re-attach must never repeat)
                if seq != last + 1:
                    raise PeerProtocolError(f"{node}: unit {key}'s stream skipped from {last} to {seq}")
                on_event(event)
                last = seq
                if event.get("kind") == "end":
                    return event
    except StreamBroken as exc:
        raise _Progressed(last, exc.message) from None
    if last != after:
        raise _Progressed(last, "the stream closed before the unit's end")
    return None


@dataclass(frozen=True)
class Fetched:
    directory: Path
    record: dict[str, Any]
    signer: str
    names: dict[str, str]


def fetch_record(me: Identity, node: NodeRef, key: str, dest: Path, *, known: Mapping[str, bytes],
                 suite: str | None = None, timeout: float = 30.0) -> Fetched:
    """Fetch unit `key`'s record, check it (see the module doc), and keep it under dest/ — or raise
    RecordRejected and keep nothing."""
    answer = _call(me, node, "GET", f"/peer/v1/units/{key}/record", timeout=timeout)
    if answer.status != 200 or not isinstance(answer.value, dict):
        raise _refused(node, f"the record of unit {key}", answer)
    value = answer.value
    try:
        payload = base64.b64decode(str(value["record"]), validate=True)
        requests = base64.b64decode(str(value.get("requests") or ""), validate=True)
        envelope = value["envelope"]
    except (KeyError, binascii.Error, ValueError) as exc:
        raise RecordRejected(f"{node}: the record of unit {key} is not accepted: malformed answer ({exc})") from None
    return accept_record(str(node), node.fingerprint, me.fingerprint, key, payload, envelope, requests, dest,
                         known=known, suite=suite)


def accept_record(where: str, signer: str, requester: str, key: str, payload: bytes, envelope: Any, requests: bytes,
                  dest: Path, *, known: Mapping[str, bytes], suite: str | None = None) -> Fetched:
    """The checks a unit's record must pass before it counts (see the module doc); then it is kept under dest/."""
    from metralectl.seams import signing, store
    def reject(why: str) -> RecordRejected:
        return RecordRejected(f"{where}: the record of unit {key} is not accepted: {why}",
                              "it was not kept; the unit counts as failed on that node")

    verdict = signing.verify(envelope, known, payload=payload, expect={"unit": key, "requester": requester})
    if not verdict.ok:
        raise reject(verdict.reason)
    if verdict.signer != signer:
        raise reject(f"signed by {verdict.signer}, not by the node it ran on ({signer})")
    try:
        record = parse_json(payload)
    except ValueError:
        raise reject("the record is not JSON") from None
    if not isinstance(record, dict):
        raise reject("the record is not a JSON object")
    unit = record.get("unit")
    if not isinstance(unit, dict) or unit.get("key") != key:
        raise reject("the record names another unit")
    if record.get("status") != "completed":
        raise reject(f"the run did not complete (status {record.get('status')}: {record.get('error')})")
    if suite is not None and record.get("suite") != suite:
        raise reject(f"the record is of suite {record.get('suite')}, the unit was {suite}")
    if verdict.names.get("requests_sha256") != (hashlib.sha256(requests).hexdigest() if requests else "none"):
        raise reject("the per-request timings that came with it are not the ones it was signed with")
    store.write_atomic(dest / "requests.jsonl", requests)
    store.write_atomic(dest / "run.json.sig", signing.dumps(envelope))
    store.write_atomic(dest / "run.json", payload)  # last: a directory with run.json is complete
    return Fetched(dest, record, str(verdict.signer), dict(verdict.names))


class RemoteNode:
    """A paired node as a campaign drives it (bench.campaign.NodeHandle)."""

    def __init__(self, me: Identity, ref: NodeRef, known: Mapping[str, bytes], *, name: str | None = None,
                 max_losses: int = MAX_LOSSES, read_timeout: float = READ_TIMEOUT_S) -> None:
        self.me, self.ref, self.known = me, ref, known
        self.name = name or str(ref)
        self.fingerprint = ref.fingerprint
        self.max_losses, self.read_timeout = max_losses, read_timeout

    def submit(self, spec: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        return submit(self.me, self.ref, spec)

    def follow(self, key: str, on_event: Callable[[dict[str, Any]], None],
               on_loss: Callable[[int, str], None]) -> dict[str, Any]:
        return follow(self.me, self.ref, key, on_event, max_losses=self.max_losses, read_timeout=self.read_timeout,
                      on_loss=on_loss).end

    def fetch(self, key: str, dest: Path, suite: str) -> dict[str, Any]:
        return fetch_record(self.me, self.ref, key, dest, known=self.known, suite=suite).record

    def cancel(self, key: str) -> None:
        cancel(self.me, self.ref, key)

    def thermal(self) -> dict[str, Any]:
        return thermal(self.me, self.ref)
