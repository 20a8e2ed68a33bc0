"""The gateway's connections to engines, per address: kept-alive ones given back after an answer, and a spare
opened ahead of need, so a request's path to its engine holds no TCP connect.

Why a spare: a streamed (chunked) answer's connection is not reused (server.py/http1.py say why: llama-server
closes some of them late), so without one every streamed request paid a loopback connect on its way to the
engine: ~0.1 ms at the median on the 2-core box and up to 8 ms at p99 there, most of the gateway's own time
(benchmarks/gateway_overhead.py measures it from inside, metralectl/gateway/timing.py). Taking a connection
opens its replacement in the background, off the request's path. One spare per address is enough (the refill
takes ~0.1 ms, requests rarely come closer together) and costs the engine little: an idle connection holds one of
llama-server's HTTP threads while it waits (it keeps parallel + 4 and makes more on demand). An engine drops an
idle one after its keep-alive timeout (llama-server: 5 s): noticed as closed at the next take, which then
connects inline, as before, and opens a new spare.
"""

from __future__ import annotations

import asyncio
import socket

from metralectl.gateway import http1

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]
Address = tuple[str, int]
KEPT_PER_ENGINE = 128  # kept-alive connections given back, per address
SPARES = 1  # connections opened ahead, per address


class Pool:
    def __init__(self, connect_timeout_s: float, spares: int = SPARES) -> None:
        self.connect_timeout_s, self.spares = connect_timeout_s, spares
        self._idle: dict[Address, list[Conn]] = {}
        self._opening: dict[Address, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.opened = 0  # connections made, inline or ahead (tests read it)

    async def take(self, address: Address) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        """A live kept or spare connection (True: the engine may have closed it meanwhile: a failure on it is
        worth a retry on a fresh one), else a new one (False). OSError or TimeoutError when none can be made."""
        idle = self._idle.get(address)
        try:
            while idle:
                reader, writer = idle.pop()
                if not writer.is_closing() and not reader.at_eof():
                    return reader, writer, True
                writer.close()
            reader, writer = await asyncio.wait_for(self._open(address), self.connect_timeout_s)
            return reader, writer, False
        finally:
            self._ahead(address)

    def give(self, address: Address, conn: Conn, reusable: bool) -> None:
        idle = self._idle.setdefault(address, [])
        if reusable and len(idle) < KEPT_PER_ENGINE:
            idle.append(conn)
        else:
            conn[1].close()

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for idle in self._idle.values():
            for _, writer in idle:
                writer.close()
        self._idle.clear()

    async def _open(self, address: Address) -> Conn:
        reader, writer = await asyncio.open_connection(*address, limit=http1.HEAD_LIMIT)
        sock = writer.get_extra_info("socket")
        if sock is not None:  # the request's head and body are one write, but an engine's client may be slow
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.opened += 1
        return reader, writer

    def _ahead(self, address: Address) -> None:
        if len(self._idle.get(address, ())) + self._opening.get(address, 0) >= self.spares:
            return
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
