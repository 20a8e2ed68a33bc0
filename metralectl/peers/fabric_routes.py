"""The peer listener's fabric routes, for a paired node's `doctor --peer` (every request signed by a known peer).

    GET  /peer/v1/fabric                  this node's links: MTU, speed, duplex, state, IPv4 addresses, RDMA
                                          devices (seams.linkfacts.local_report), signed as every answer is
    GET  /peer/v1/fabric/source?bytes=N   N zero bytes (N <= SOURCE_MAX), cut after PROBE_S: the probe's
                                          download. The head is signed over an empty body (the filler is not
                                          signed), the body close-delimited
    POST /peer/v1/fabric/sink?bytes=N     N bytes (Content-Length N <= SINK_MAX) read and discarded; answers
                                          {received, seconds}. The request is signed over its path with an
                                          empty body: the signature admits the sender, the filler means nothing

One probe at a time per node (another is answered 503 at once), each bounded in bytes and in time (the
listener's request deadline still holds), so a paired peer cannot keep this node's link or CPU busy.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from metralectl.peers.protocol import Refusal, sign_response
from metralectl.seams.httpserve import BadRequest, ascii_int

if TYPE_CHECKING:
    from metralectl.peers.listener import PeerHandler

FABRIC = "/peer/v1/fabric"
SOURCE = "/peer/v1/fabric/source"
SINK = "/peer/v1/fabric/sink"
SOURCE_MAX = 256 << 20  # bytes one download may ask for
SINK_MAX = 64 << 20  # bytes one upload may send
PROBE_S = 2.0  # a download is cut after this long
CHUNK = 256 << 10
_ZEROS = bytes(CHUNK)
_PROBE = threading.BoundedSemaphore(1)  # one probe at a time on this node, whoever asks


def _bytes_asked(handler: PeerHandler, cap: int) -> int | None:
    value = ascii_int((parse_qs(urlsplit(handler.path).query).get("bytes") or [""])[0])
    return value if value is not None and 0 < value <= cap else None


def dispatch(handler: PeerHandler, method: str, route: str) -> None:
    if method == "POST" and route == SINK:
        _sink(handler)
        return
    try:
        body = handler.read_body()
    except BadRequest as exc:
        handler.close_connection = True
        handler._refuse(Refusal(exc.status, str(exc)))
        return
    request = handler._signed(body)
    if request is None:
        return
    node = handler.server.node
    if method == "GET" and route == FABRIC:
        from metralectl.seams.linkfacts import local_report

        handler._answer(200, {"name": node.name, **local_report(node.sys_root, node.proc_root)},
                        nonce=request.nonce, to=request.key)
    elif method == "GET" and route == SOURCE:
        asked = _bytes_asked(handler, SOURCE_MAX)
        if asked is None:
            handler._answer(400, {"error": f"bytes=N is required, 1 to {SOURCE_MAX}"}, nonce=request.nonce,
                            to=request.key)
        elif not _PROBE.acquire(blocking=False):
            handler._answer(503, {"error": "another throughput probe is running on this node; try again"},
                            nonce=request.nonce, to=request.key)
        else:
            try:
                _source(handler, asked, request.nonce, request.key)
            finally:
                _PROBE.release()
    else:
        handler._answer(404, {"error": f"no {method} {route}"}, nonce=request.nonce, to=request.key)


def _source(handler: PeerHandler, asked: int, nonce: str, to: str) -> None:
    headers = sign_response(handler.server.node.identity, 200, nonce, to, b"")
    handler.close_connection = True
    handler.send_response(200)
    handler.send_header("Content-Type", "application/octet-stream")
    handler.send_header("Cache-Control", "no-store")
    handler.send_header("Connection", "close")
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.end_headers()
    sent, deadline = 0, time.monotonic() + PROBE_S
    try:
        while sent < asked and time.monotonic() < deadline:
            piece = min(CHUNK, asked - sent)
            handler.wfile.write(_ZEROS[:piece])
            sent += piece
        handler.wfile.flush()
    except OSError:
        return  # the reader went away


def _sink(handler: PeerHandler) -> None:
    """Admit the sender by its signature over the path (empty body) before reading a byte of the filler."""
    handler.close_connection = True
    request = handler._signed(b"")
    if request is None:
        return
    asked = _bytes_asked(handler, SINK_MAX)
    length = ascii_int((handler.header("Content-Length") or "").strip())
    if asked is None or length != asked or handler.headers.get("Transfer-Encoding"):
        handler._answer(400, {"error": f"bytes=N with Content-Length N is required, 1 to {SINK_MAX}"},
                        nonce=request.nonce, to=request.key)
        return
    if not _PROBE.acquire(blocking=False):
        handler._answer(503, {"error": "another throughput probe is running on this node; try again"},
                        nonce=request.nonce, to=request.key)
        return
    try:
        received, started = 0, time.monotonic()
        try:
            while received < asked:
                piece = handler.rfile.read(min(CHUNK, asked - received))
                if not piece:
                    break
                received += len(piece)
        except OSError:
            return  # the sender went away, or the listener's request deadline passed
        seconds = time.monotonic() - started
    finally:
        _PROBE.release()
    handler._answer(200, {"received": received, "seconds": round(seconds, 6)}, nonce=request.nonce, to=request.key)
