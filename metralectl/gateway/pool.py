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

Connecting inline, on the fast path (now()): an engine on loopback is connected to, and the request written to it,
within the callback that read the request (a loopback connect completes inside the call), where asyncio's
create_connection takes two or three turns of the event loop, each behind every stream's pieces. (It was thought to
be the own time's p99 at 64 streams on a lent H100, 1.4-2.6 ms; it was not: that was the kernel preempting the
gateway for engine threads, seams/affinity.py. It stays: a request with no spare left is not put behind others.)
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import select
import socket

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
        try:
            conn, burst = self._kept(address)
            if conn is not None:
                return conn, True
            if burst:
                self._grow(address)
            return await asyncio.wait_for(self._open(address), self.connect_timeout_s), False
        finally:  # after the request is written (its task runs on to the write before it awaits): spares are
            # opened off its path, each a task of its own
            asyncio.get_running_loop().call_soon(self._ahead, address)

    def now(self, address: Address) -> tuple[Upstream, bool] | None:
        """A connection at once, without a wait, for the fast path (server.Gateway.arrived): a live kept or spare one
        (True: as take() says), else, for an engine on loopback, a new one made within this callback (False): a
        connect on loopback completes inside the call (EINPROGRESS, then writable at once: ~10-15 us), where
        asyncio's create_connection takes two or three turns of the event loop, each behind every stream's pieces.
        The request is written on that socket at once (Upstream.send); asyncio adopts it in a task of its own.
        None: an engine elsewhere with no live connection on top, or one that did not accept at once: the caller's
        task connects (take()). Counted as take() counts; the caller calls refill(address) once the request is
        written (from the connection's task: off its path)."""
        idle = self._idle.get(address)
        family = _loopback(address[0])
        if family is None:  # take() does the counting and the connect, in the task
            return (idle.pop(), True) if idle and not idle[-1].closed and address in self._wanted else None
        kept, burst = self._kept(address)
        if kept is not None:
            return kept, True
        made = _connect_now(family, address)
        if made is None:
            return None
        if burst:
            self._grow(address)
        conn = Upstream(made)
        self.opened += 1
        task = asyncio.ensure_future(self._adopt(conn, made))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return conn, False

    def _kept(self, address: Address) -> tuple[Upstream | None, bool]:
        """A live kept or spare connection (None: none left), and whether a new one now means a burst outran the
        spares: not a first use, and no spare found closed on the way (each one dropped, one spare fewer wanted:
        it idled past the engine's keep-alive, so the load that wanted it has gone)."""
        idle = self._idle.get(address)
        first = address not in self._wanted  # nothing was opened ahead yet: not a burst
        self._wanted.setdefault(address, self.spares)
        dropped = False
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn, False
            conn.close()
            self._wanted[address] = max(self.spares, self._wanted[address] - 1)
            dropped = True
        return None, not first and not dropped

    def _grow(self, address: Address) -> None:
        """One more spare kept ahead for the next burst (up to MAX_SPARES)."""
        if self.spares:
            self._wanted[address] = min(MAX_SPARES, self._wanted[address] + 1)

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

    async def _adopt(self, conn: Upstream, sock: socket.socket) -> None:
        """A socket now() connected, under asyncio's transport (the request on it may be written already)."""
        try:
            await asyncio.get_running_loop().create_connection(lambda: conn, sock=sock)
        except BaseException as e:  # not adopted (the gateway stops, or the socket failed): its request fails
            sock.close()
            conn.connection_lost(e if isinstance(e, Exception) else ConnectionResetError("the gateway is stopping"))
            if not isinstance(e, Exception):
                raise

    async def _spare(self, address: Address) -> None:
        try:
            conn = await asyncio.wait_for(self._open(address), self.connect_timeout_s)
        except (OSError, asyncio.TimeoutError):
            return  # the engine is not there (stopped, swapped): the next request finds out on its own
        finally:
            self._opening[address] -= 1
        self._idle.setdefault(address, []).append(conn)


_families: dict[str, int | None] = {}


def _loopback(host: str) -> int | None:
    """The address family of a loopback IP address, None for anything else (a name is never resolved here: that
    could block the event loop)."""
    if host not in _families:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            ip = None
        if len(_families) >= 1024:  # engine addresses are few; never a cache that grows without end
            _families.clear()
        _families[host] = None if ip is None or not ip.is_loopback else (
            socket.AF_INET6 if ip.version == 6 else socket.AF_INET)
    return _families[host]


def _connect_now(family: int, address: Address) -> socket.socket | None:
    """A TCP connection to a loopback address, made within this call, or None (refused, not accepted at once)."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        if sock.connect_ex(address) in (0, errno.EINPROGRESS) and _writable(sock) and \
                not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as asyncio's transports do (loops.py)
            return sock
    except OSError:
        pass
    sock.close()
    return None


def _writable(sock: socket.socket) -> bool:
    poller = select.poll()  # not select.select: a descriptor past 1024 is common on a busy gateway
    poller.register(sock, select.POLLOUT)
    return bool(poller.poll(0))
