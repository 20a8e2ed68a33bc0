"""Heads seen before, parsed once: a client sends the same request head again and again (its SDK's headers, only the
body's length changing) and an engine answers with the same head, so what was made of a head is kept, keyed by its
exact bytes (a request's without the value of its one Content-Length), and reused.

Why: on the lent H200 at one stream the gateway's own time per request (~0.25 ms) is several times what the same
Python costs warm, as every cache and TLB entry it touches was left cold by the ~100 ms between requests; a dict
lookup touches a few lines where a parse touches the regex engine, the dataclass, the header pairs... What is kept
is bounded (KEPT heads each way, each at most LONGEST bytes; the table is emptied when full) and only a head that
parsed is kept. A request head is only reused when its Content-Length line is the one line that frames its body:
the key is the rest of the head, and no kept key holds a Content-Length or Transfer-Encoding line, so a head that
matches one has exactly the line that was taken out, whose value is checked here as the parse checks it.
"""

from __future__ import annotations

from metralectl.gateway import http1
from metralectl.gateway.http1 import Request, Response

KEPT = 256
LONGEST = 4096
LENGTH_LINE = b"\r\nContent-Length: "
_requests: dict[bytes, Request] = {}
_responses: dict[bytes, Response] = {}


def request_head(head: bytes, body_limit: int) -> tuple[Request, bool, int]:
    """http1.parse_request_head(head, body_limit), from a head seen before where it can be."""
    at = head.find(LENGTH_LINE) if len(head) <= LONGEST else -1
    key = None
    if at > 0:
        stop = head.find(b"\r\n", at + len(LENGTH_LINE))
        digits = head[at + len(LENGTH_LINE):stop]
        key = head[:at] + head[stop:]
        known = _requests.get(key)
        if known is not None and digits.isdigit() and len(digits) <= 18:  # bytes.isdigit(): ASCII digits only
            length = int(digits)
            if length <= body_limit:  # else within() says 413, below
                # known.fresh(), made here: each call is cache lines a cold core fetches (this module says why)
                return (Request(known.method, known.target, known.version, known.headers, b"", known.keep_alive, 0,
                                known.block, known.special), False, length)
            http1.within(length, body_limit)
    request, chunked, length = http1.parse_request_head(head, body_limit)
    if key is not None and not chunked and [k.lower() for k, _ in request.headers].count("content-length") == 1:
        if len(_requests) >= KEPT:
            _requests.clear()
        _requests[key] = request.fresh()
    return request, chunked, length


def response_head(head: bytes) -> Response:
    """http1.parse_response_head(head), the same Response for a head seen before (never changed after its parse)."""
    known = _responses.get(head)
    if known is not None:
        return known
    response = http1.parse_response_head(head)
    if len(head) <= LONGEST:
        if len(_responses) >= KEPT:
            _responses.clear()
        _responses[head] = response
    return response
