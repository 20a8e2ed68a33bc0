"""The peer listener's remote-unit routes. Every request is signed by a known peer; a peer sees only its units.

    POST /peer/v1/units                     submit {key, suite, params, ...}: 202 new | 200 the same unit again
                                            | 409 the key is taken by another body | 403 no bench grant / disabled
                                            | 503 not admitted now (busy, floors, queue full) | 400 a bad body
    GET  /peer/v1/units                     the requester's units
    GET  /peer/v1/units/KEY                 one unit's state
    GET  /peer/v1/units/KEY/events?after=N  a stream of its events after seq N (NDJSON, each line signed;
                                            heartbeats while nothing happens; ends after the "end" event)
    GET  /peer/v1/units/KEY/record          the signed record, its envelope and per-request timings
    POST /peer/v1/units/KEY/cancel          stop it (queued: at once; running: the benchmark is interrupted)
"""

from __future__ import annotations

import base64
import json
import logging
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from metralectl.errors import MetralError
from metralectl.seams.httpserve import ascii_int, parse_json
from metralectl.peers.protocol import SignedRequest, sign_event_line, sign_response
from metralectl.peers.unit_spec import KEY_RE, UnitSpec
from metralectl.peers.units import QueueFull, Unit, UnitConflict, UnitNotFound

if TYPE_CHECKING:
    from metralectl.peers.listener import PeerHandler

log = logging.getLogger("metralectl.peers")
HEARTBEAT_S = 2.0
STREAM_LIMIT_S = 6 * 3600.0  # one stream's longest life; the follower simply re-attaches after it


def dispatch(handler: PeerHandler, method: str, route: str, body: bytes) -> None:
    request = handler._signed(body)
    if request is None:
        return
    parts = route.removeprefix("/peer/v1/units").strip("/").split("/")
    answer = _Answer(handler, request)
    try:
        if parts == [""]:
            if method == "POST":
                _submit(handler, request, body, answer)
            elif method == "GET":
                answer(200, {"units": [u.to_json() for u in handler.server.node.units.list_for(request.key)]})
            else:
                answer(405, {"error": f"{method} not allowed here"})
            return
        key, action = parts[0], (parts[1] if len(parts) > 1 else "")
        if not KEY_RE.fullmatch(key) or len(parts) > 2:
            answer(404, {"error": f"no {route}"})
            return
        unit = handler.server.node.units.get(key, request.key)
        if method == "GET" and action == "":
            answer(200, unit.to_json())
        elif method == "GET" and action == "events":
            _stream(handler, request, unit)
        elif method == "GET" and action == "record":
            _record(unit, answer)
        elif method == "POST" and action == "cancel":
            answer(200, handler.server.node.units.cancel(key, request.key).to_json())
        else:
            answer(404, {"error": f"no {method} {route}"})
    except UnitNotFound as exc:
        answer(404, {"error": exc.message})


class _Answer:
    def __init__(self, handler: PeerHandler, request: SignedRequest) -> None:
        self.handler, self.request = handler, request

    def __call__(self, status: int, value: Any) -> None:
        self.handler._answer(status, value, nonce=self.request.nonce, to=self.request.key)


def _submit(handler: PeerHandler, request: SignedRequest, body: bytes, answer: _Answer) -> None:
    node = handler.server.node
    peer = node.peers.load().by_fingerprint(request.key)
    if peer is None or "bench" not in peer.grants:
        answer(403, {"error": "this node has not granted you bench",
                     "hint": f"on this node: `metralectl peer grant-bench {request.key}`"})
        return
    try:
        config = node.bench_config()
    except MetralError as exc:
        answer(500, {"error": f"this node cannot read its bench.yaml: {exc.message}", "hint": exc.hint})
        return
    if not config.enabled:
        answer(403, {"error": "bench is not enabled on this node", "hint": "on this node: `metralectl peer bench-config --enable`"})
        return
    try:
        spec = UnitSpec.from_json(parse_json(body or b"null"))
    except ValueError as exc:
        answer(400, {"error": f"the body is not JSON we take ({exc})"})
        return
    except MetralError as exc:
        answer(400, {"error": exc.message, "hint": exc.hint})
        return
    try:
        known = node.units.get(spec.key, request.key)
    except UnitNotFound:
        known = None
    if known is None:  # a new unit must find the node admitted now (a resubmission gets its unit whatever)
        admission = node.admission(peer.grants)
        blocking = [c for c in admission.reasons if c.id != "queue"]
        if blocking:
            answer(503, {"error": "not admitted now: " + "; ".join(c.detail for c in blocking),
                         "reasons": [{"id": c.id, "detail": c.detail, "remedy": c.remedy} for c in blocking]})
            return
    try:
        unit, created = node.units.submit(spec, request.key)
    except UnitConflict as exc:
        answer(409, {"error": exc.message, "hint": exc.hint})
        return
    except QueueFull as exc:
        answer(503, {"error": exc.message, "hint": exc.hint})
        return
    log.info("unit %s from %s: %s", spec.key, request.key, "queued" if created else "resubmitted (same body)")
    answer(202 if created else 200, unit.to_json())


def _record(unit: Unit, answer: _Answer) -> None:
    from pathlib import Path

    if unit.state != "completed" or not unit.run_dir:
        answer(409, {"error": f"unit {unit.key} has no completed record (it is {unit.state}"
                              + (f": {unit.error})" if unit.error else ")"), "state": unit.state})
        return
    from metralectl.bench.signed import read_signed

    try:
        record, envelope, requests = read_signed(Path(unit.run_dir))
    except (OSError, ValueError) as exc:
        answer(500, {"error": f"the record of unit {unit.key} cannot be read here: {exc}"})
        return
    answer(200, {"unit": unit.key, "envelope": envelope, "record": base64.b64encode(record).decode("ascii"),
                 "requests": base64.b64encode(requests).decode("ascii")})


def _stream(handler: PeerHandler, request: SignedRequest, unit: Unit) -> None:
    """NDJSON, each line signed (protocol.sign_event_line), closed after the "end" event. The connection is
    close-delimited (no length is known in advance), so a follower tells an ended stream from a lost link
    by whether it saw "end"."""
    query = parse_qs(urlsplit(handler.path).query)
    after_s = (query.get("after") or ["0"])[0]
    after = ascii_int(after_s) or 0
    node = handler.server.node
    me, stream = node.identity, f"units/{unit.key}/events"
    headers = sign_response(me, 200, request.nonce, request.key, b"")
    handler.close_connection = True
    handler.send_response(200)
    handler.send_header("Content-Type", "application/x-ndjson")
    handler.send_header("Cache-Control", "no-store")
    handler.send_header("Connection", "close")
    handler.send_header("X-Metrale-Stream", stream)
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.end_headers()

    def send(event: dict[str, Any]) -> None:
        line = json.dumps(event, sort_keys=True, separators=(",", ":"), default=str).encode()
        handler.wfile.write(sign_event_line(me, request.nonce, request.key, stream, line))
        handler.wfile.flush()

    started = time.monotonic()
    try:
        while time.monotonic() - started < STREAM_LIMIT_S:
            events, done = node.units.events_after(unit.key, after, HEARTBEAT_S)
            for event in events:
                send(event)
                after = int(event["seq"])
                if event.get("kind") == "end":
                    return
            if done and not events:
                return  # ended before this follower's `after`: nothing more will come
            if not events:
                send({"kind": "heartbeat", "t": time.time(), "after": after})
    except (BrokenPipeError, ConnectionResetError, TimeoutError, OSError):
        return  # the follower went away; it re-attaches with ?after=
