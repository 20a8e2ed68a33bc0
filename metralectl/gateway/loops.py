"""The event loop the gateway serves on: uvloop (libuv's loop, in C) where it is installed, else asyncio's own.

Why it matters: at one stream, what the gateway adds to a first token is its cold path: the accept, four or five turns
of the loop before a request is read and forwarded, and one more wake-up for the engine's first piece. Each turn of
asyncio's loop is Python; uvloop's is C, and it accepts and reads without a turn of its own for each step. Paired at
one stream against a stub engine on the 2-core box, through 0.9 ms added under uvloop against 1.1 ms under asyncio's
loop, with a minimal relay in C at 0.15 ms (benchmarks/relay_floor.c; docs/gateway.md has the table). uvloop is a
dependency where it has wheels (Linux, macOS); elsewhere, and with `--event-loop asyncio`, asyncio's loop serves.

Both set TCP_NODELAY on every TCP connection they make or accept (asyncio since Python 3.6, as documented; uvloop
likewise), so the gateway sets nothing itself: an answer's pieces are small writes that Nagle's algorithm and a
delayed ACK would hold ~40 ms (tests/unit/test_gateway_loops.py holds both loops to it).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, TypeVar

from metralectl.errors import ExitCode, MetralError

T = TypeVar("T")
CHOICES = ("auto", "uvloop", "asyncio")


def pick(choice: str) -> str:
    """The loop `choice` names on this machine: auto is uvloop where it imports, else asyncio."""
    if choice not in CHOICES:
        raise MetralError(f"--event-loop {choice!r} is not one of {', '.join(CHOICES)}",
                          "auto (the default) serves on uvloop where it is installed", exit_code=ExitCode.USAGE)
    if choice == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if choice == "uvloop":
            raise MetralError("--event-loop uvloop: uvloop is not installed in metralectl's environment",
                              "install it there (`pip install uvloop` in that venv), or leave --event-loop at auto",
                              exit_code=ExitCode.USAGE) from None
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T], loop: str) -> T:
    """main to its end on the loop pick() named."""
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main)  # type: ignore[no-any-return]
    return asyncio.run(main)


def settle_heap() -> int:
    """Called once the gateway serves: what it imported and built to start (its modules, Docker's client, the first
    routing table) is collected once, then frozen out of the garbage collector's passes; returns how many objects
    that froze. Why: a full collection walks every object the process holds, and with those tens of thousands it
    stopped the loop for ~15 ms (the lent H200 at 16 streams: every request then in flight waited that long before it
    reached its engine, and a piece of each stream as long), and the younger generations' passes 1-3.6 ms. What the
    relay makes per request is still collected as before. (Collected first: a cycle of garbage frozen would never go.)"""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
