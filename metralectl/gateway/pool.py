"""The gateway's connections to engines, per address: kept-alive ones given back after an answer, and a spare
opened ahead of need, so a request's path to its engine holds no TCP connect.

Why spares: a streamed (chunked) answer's connection is not reused (server.py/http1.py say why: llama-server
closes some of them late), so without one every streamed request paid a loopback connect on its way to the
engine: ~0.1 ms at the median on the 2-core box and up to 8 ms at p99 there, most of the gateway's own time
(benchmarks/gateway_overhead.py measures it from inside, metralectl/gateway/timing.py). Taking a connection
opens its replacement in the background, off the request's path. One spare per address is enough (the refill
takes ~0.1 ms) while requests come one at a time. Under concurrency they come in bursts (an engine batches its
streams, so they end, and their clients send the next request, together): on the lent H200 at 16 and 64 streams
one spare left most requests of a burst to connect inline, which cost ~1 ms at the median (p10 0.11 ms), so the
number kept ahead follows the bursts seen: each take that finds none adds one, up to MAX_SPARES. An idle
connection costs the engine little: it holds one of llama-server's HTTP threads while it waits (it keeps
parallel + 4 and makes more on demand). An engine drops an idle one after its keep-alive timeout (llama-server:
5 s): noticed as closed at the next take, which gives one spare back (the load that wanted it has gone), then
connects inline and opens a new spare.
"""

from __future__ import annotations

import asyncio

from metralectl.gateway.upstream import Upstream

Address = tuple[str, int]
KEPT_PER_ENGINE = 128  # kept-alive connections given back, per address
SPARES = 1  # connections opened ahead, per address, at first
MAX_SPARES = 32  # the most it grows to under bursts of requests


class Pool:
    def __init__(self, connect_timeout_s: float, spares: int = SPARES) -> None:
        self.connect_timeout_s, self.spares = connect_timeout_s, spares
        self._wanted: dict[Address, int] = {}  # spares kept ahead per address: grows with bursts (above)
        self._idle: dict[Address, list[Upstream]] = {}
        self._opening: dict[Address, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.opened = 0  # connections made, inline or ahead (tests read it)

    async def take(self, address: Address) -> tuple[Upstream, bool]:
        """A live kept or spare connection (True: the engine may have closed it meanwhile: a failure on it is
        worth a retry on a fresh one), else a new one (False). OSError or TimeoutError when none can be made."""
        idle = self._idle.get(address)
        first = address not in self._wanted  # nothing was opened ahead yet: not a burst
        self._wanted.setdefault(address, self.spares)
        dropped = False  # a spare was there, but the engine had closed it: no burst, the load went away
        try:
            while idle:
                conn = idle.pop()
                if not conn.closed:
                    return conn, True
                conn.close()  # it idled past the engine's keep-alive: one spare fewer is wanted
                self._wanted[address] = max(self.spares, self._wanted[address] - 1)
                dropped = True
            if self.spares and not first and not dropped:  # a burst outran the spares: one more ahead for the next
                self._wanted[address] = min(MAX_SPARES, self._wanted[address] + 1)
            return await asyncio.wait_for(self._open(address), self.connect_timeout_s), False
        finally:  # after the request is written (its task runs on to the write before it awaits): spares are
            # opened off its path, each a task of its own
            asyncio.get_running_loop().call_soon(self._ahead, address)

    def idle(self, address: Address) -> Upstream | None:
        """A live kept or spare connection at once, without a wait (the fast path, server.Gateway.arrived), else None:
        none there, or the one on top was closed by its engine (take() counts that, as it does a first use). The
        caller calls refill(address) once the request is written (from the connection's task: off its path)."""
        idle = self._idle.get(address)
        if not idle or idle[-1].closed or address not in self._wanted:
            return None
        return idle.pop()

    def refill(self, address: Address) -> None:
        """Opens what is wanted ahead for `address` (after an idle() that took one)."""
        self._ahead(address)

    def wanted(self, address: Address) -> int:
        """How many connections are kept open ahead for `address` now."""
        return self._wanted.get(address, self.spares)

    def give(self, address: Address, conn: Upstream, reusable: bool) -> None:
        idle = self._idle.setdefault(address, [])
        if reusable and not conn.closed and len(idle) < KEPT_PER_ENGINE:
            idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()

    async def _open(self, address: Address) -> Upstream:
        _, conn = await asyncio.get_running_loop().create_connection(Upstream, *address)
        self.opened += 1
        return conn

    def _ahead(self, address: Address) -> None:
        for _ in range(self.wanted(address) - len(self._idle.get(address, ())) - self._opening.get(address, 0)):
            self._opening[address] = self._opening.get(address, 0) + 1
            task = asyncio.ensure_future(self._spare(address))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _spare(self, address: Address) -> None:
        try:
            conn = await asyncio.wait_for(self._open(address), self.connect_timeout_s)
        except (OSError, asyncio.TimeoutError):
            return  # the engine is not there (stopped, swapped): the next request finds out on its own
        finally:
            self._opening[address] -= 1
        self._idle.setdefault(address, []).append(conn)
