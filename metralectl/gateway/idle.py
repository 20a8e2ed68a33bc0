"""Client connections that hold the gateway without using it, closed: one idle past the client timeout (nothing
asked of it yet, a kept-alive one between requests, a body that stopped coming) and one whose request head is not
whole within it (sent a byte at a time: a 408). Without this, a client that opens connections and sends nothing, or
a head that never ends, holds a file descriptor each for ever: enough of them, from anyone who can reach the
address (keys are checked only once a head is whole), and the gateway can accept nobody.

Nothing here runs per request: a sweep every few seconds compares each connection's last read (`read_at`, which
its read callback keeps anyway) with what the sweep before saw, so a limit holds to within a sweep's interval. A
connection the gateway is serving (a request handed over: waiting in a model's queue, or its answer streaming) is
never swept, however long that takes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from metralectl.gateway import http1
from metralectl.gateway.client import ClientConnection

TIMEOUT_S = 60.0  # nginx's client_header_timeout; above the keep-alive clients keep (httpx 5 s, aiohttp 15 s)
HEAD_TOO_SLOW = http1.simple_response(408, http1.error_body(
    408, "the request head did not arrive whole within the gateway's client timeout", "invalid_request_error",
    "request_timeout"), keep_alive=False)


def interval(timeout_s: float) -> float:
    return min(max(timeout_s / 4, 0.05), 5.0)


def sweep(connections: Iterable[ClientConnection], now: float, timeout_s: float) -> tuple[int, int]:
    """One pass at monotonic time `now`: (idle ones closed, slow heads answered 408 and closed)."""
    idle = slow = 0
    for conn in list(connections):
        if conn.gone or conn.busy or conn.transport.is_closing():
            conn.swept = conn.head_since = None
            continue
        if conn.parser.head_pending():
            conn.head_since = conn.head_since or now
            if now - conn.head_since >= timeout_s:
                conn.time_out(HEAD_TOO_SLOW)
                slow += 1
                continue
        else:
            conn.head_since = None
        seen = conn.swept
        if seen is None or seen[0] != conn.read_at:
            conn.swept = (conn.read_at, now)
        elif now - seen[1] >= timeout_s:
            conn.time_out(None)
            idle += 1
    return idle, slow


async def sweep_forever(connections: Iterable[ClientConnection], timeout_s: float,
                        counted: Callable[[int, int], object]) -> None:
    """Sweeps until cancelled; `counted(idle, slow)` after each pass that closed any."""
    while True:
        await asyncio.sleep(interval(timeout_s))
        idle, slow = sweep(connections, time.monotonic(), timeout_s)
        if idle or slow:
            counted(idle, slow)
