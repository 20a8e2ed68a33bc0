"""The gateway's event loop kept awake for a while after each read (`gateway --busy-poll MS`, box.yaml's
`gateway-busy-poll`): it polls its sockets instead of sleeping, so the next request or the engine's next piece is
read the moment it lands, not after the CPU wakes from idle.

Why: between two requests at one stream the gateway's core goes idle, and what it then costs to start again is the
gateway's: on a VM, a halted vCPU woken by the host, and caches and branch predictors that went cold. On the 2-core
box, a gateway kept awake took a request from its last byte read to its write to the engine in 48 us (p50, uvloop)
where asleep between requests it took 86-91; on the lent H100 its own time at one stream was 0.20-0.24 ms where at
64 busy streams it was 0.12 (docs/gateway.md, "Kept awake"). The cost: the gateway's thread runs flat out while it
serves and for the window after its last read, so give it CPUs of its own (`--cpus`) when you turn this on. Idle past
the window, it sleeps as before: a box that serves nothing burns nothing.

How: while awake, one callback puts itself back on the loop's ready queue at each turn, so the loop polls with no
timeout (asyncio's and uvloop's alike), until `window` has passed with no read. A read only sets a flag (`poke`, on
the client's and the engine's connections); the clock is read by the callback, once a turn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class BusyPoll:
    """The window on one loop: poke() at each read, start() and stop() with the gateway's serving."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s, self.clock = window_s, clock
        self.loop: asyncio.AbstractEventLoop | None = None
        self.awake = False  # the callback is on the loop
        self.poked = False  # a read since the callback's last turn
        self.until = 0.0
        self.turns = 0  # the callback's turns (tests; how many polls the window cost)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def poke(self) -> None:
        """A read: awake (again) for window_s from now."""
        if self.awake:
            self.poked = True
            return
        if self.loop is None:
            return
        self.awake, self.poked = True, False
        self.until = self.clock() + self.window_s
        self.loop.call_soon(self._turn)

    def stop(self) -> None:
        self.loop = None  # the callback's next turn is its last
        self.until = 0.0
        self.poked = False

    def _turn(self) -> None:
        self.turns += 1
        now = self.clock()
        if self.poked:
            self.poked, self.until = False, now + self.window_s
        if now < self.until and self.loop is not None:
            self.loop.call_soon(self._turn)
        else:
            self.awake = False


ACTIVE: list[BusyPoll | None] = [None]  # the serving gateway's, when --busy-poll is on: the reads poke it


def start(window_s: float) -> BusyPoll | None:
    """On the running loop for window_s after each read (0: off, the loop sleeps when idle as it always did)."""
    if window_s <= 0:
        ACTIVE[0] = None
        return None
    busy = BusyPoll(window_s)
    busy.start(asyncio.get_running_loop())
    ACTIVE[0] = busy
    return busy


def stop() -> None:
    busy, ACTIVE[0] = ACTIVE[0], None
    if busy is not None:
        busy.stop()
