"""The gateway's event loop: accept, read a request under its caps, route it by its `model`, relay the engine's
answer as it comes, and hold a request whose model is starting or swapping in a bounded queue.

One asyncio loop, no thread per request. The routing table (routes.py) is replaced whole by a scan on a worker
thread, so a request only reads a dict. Engine connections come from pool.py (kept alive, or opened ahead). A client
that goes away (EOF or reset on its socket, seen by client.ClientConnection) cancels its relay, and the relay's engine
connection is closed, which is how an engine learns to stop generating.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from metralectl.gateway import auth, busy, dispatch, http1, idle, loops, timing, waiting
from metralectl.gateway.client import ClientConnection
from metralectl.gateway.dispatch import Flight, Refused, Routed
from metralectl.gateway.http1 import Answered, NotSent
from metralectl.core.gateway_keys import ApiKey, KeyWatch
from metralectl.gateway.metrics import UNKNOWN, Metrics
from metralectl.gateway.pool import SPARES, Pool
from metralectl.gateway.loader import Loader
from metralectl.gateway.oversize import TooLarge
from metralectl.gateway.routes import LIFECYCLE_POLL_S, RESCAN_S, Route, Scanner, Table

# The engines' own token counters and llama-server's chat template: bench sizes its prompts with them (a prompt
# sized by guess through the gateway was 220 tokens where 127 were asked, and the comparison with direct was off).
ROUTED = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
                    "/tokenize", "/detokenize", "/apply-template"})
LABELLED = ROUTED | {"/v1/models", "/metrics", "/health"}  # the paths metrics name; any other is "(other)", not its own
SWITCH_INTERVAL_S = 0.0005  # the longest the event loop waits for the GIL behind the scan's thread (serve())


@dataclass(frozen=True)
class Limits:
    max_body: int = 16 * 1024 * 1024
    queue_size: int = 256  # requests waiting per model
    queue_stall_s: float = 300.0  # a waiting request fails after this long with no progress of its model's start
    connect_timeout_s: float = 5.0
    spares: int = SPARES  # engine connections opened ahead of need, per engine (pool.py)
    client_timeout_s: float = idle.TIMEOUT_S  # a client connection idle, or a request head not whole, this long
    busy_poll_s: float = 0.0  # the loop polls instead of sleeping this long after each read (busy.py; 0: off)


class Gateway:
    def __init__(self, scanner: Scanner, limits: Limits = Limits(), keys: KeyWatch | None = None,
                 require_key: bool = False, loader: Loader | None = None) -> None:
        """keys: the API keys (none: every client is let in, the CLI listening on loopback only); require_key: the
        gateway listens beyond loopback, so an empty key file lets nobody in rather than everybody; loader: loads
        on demand (None: routes only to what serves)."""
        self.scanner, self.limits, self.loader = scanner, limits, loader
        self.keys, self.require_key = keys, require_key
        self.metrics = Metrics()
        self.table = Table()
        self._changed = asyncio.Event()
        self._rescan = asyncio.Event()
        self.pool = Pool(limits.connect_timeout_s, limits.spares)  # engine connections: kept, and spares ahead
        self._waiting: dict[str, int] = {}
        self._clients: set[asyncio.Task[Any]] = set()  # each client connection's task: cancelled as the gateway stops
        self.connections: set[ClientConnection] = set()  # each client connection open (idle.py sweeps them)
        self.on_table: Any = None  # called with each new Table whose routes differ (the CLI's status line)
        self.monitor: str | None = None  # the credential that reads /metrics with keys in force (state.record)
        self.timing = timing.target()  # the gateway's own time per request, kept only when asked (timing.py)
        if self.timing is not None:
            timing.watch_collections()  # and each garbage collection's pause, which stops every request
            timing.ON[0] = True

    # the table
    def _publish(self, table: Table) -> None:
        before = self.table
        self.table = table
        self.metrics.publish(table)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        went = sorted({r.recipe for r in before.routes} - {r.recipe for r in table.routes} & set(table.exited.values()))
        for recipe in went:  # crashed or killed under us (a stop removes its record: not counted)
            self.metrics.engines_gone.labels(recipe).inc()
        if self.on_table is not None and (before.routes != table.routes or before.starting != table.starting):
            self.on_table(table, gone=went)

    async def refresh_forever(self) -> None:
        last_seen: Any = object()
        last_scan = 0.0
        while True:
            if self.keys is not None and self.keys.poll() and self.on_table is not None:
                self.on_table(self.table)  # the status line says the keys changed (names and counts only)
            # On a thread: a state directory that answers slowly must not stall every request (run in the loop
            # instead, the gateway's tail at 64 streams on a lent H100 was the same: docs/gateway.md).
            started = timing.now() if self.timing is not None else 0
            holder, journal = await asyncio.to_thread(self.scanner.lifecycle)
            if started:
                timing.window("lifecycle", started)
            seen = (holder, journal.get("phase") if journal else None, journal.get("updated") if journal else None)
            if seen != last_seen or self._rescan.is_set() or time.monotonic() - last_scan > RESCAN_S:
                self._rescan.clear()
                started = timing.now() if self.timing is not None else 0
                self._publish(await asyncio.to_thread(self.scanner.scan))  # engines' own answers: a thread
                if started:
                    timing.window("scan", started)
                last_seen, last_scan = seen, time.monotonic()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._rescan.wait(), LIFECYCLE_POLL_S)

    async def _table_change(self, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    # connections
    async def handle(self, client: ClientConnection) -> None:
        this: Any = asyncio.current_task()  # never None here: a connection's own task
        self._clients.add(this)
        try:
            while True:
                try:
                    got = await client.next()
                except http1.Closed:
                    return
                except http1.BadRequest as bad:
                    self.metrics.errors.labels(UNKNOWN, "bad-request").inc()
                    client.write(http1.simple_response(bad.status, http1.error_body(bad.status, bad.message, bad.kind),
                                                       keep_alive=False))
                    await client.drain()
                    return
                keep = await self._serve(got, client)
                request = got.request if isinstance(got, (Routed, Refused, Flight)) else got
                assert isinstance(request, http1.Request)
                if not keep or not request.keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:  # the gateway stops (serve()): this task is the connection's top, awaited by
            return  # nobody, and Python 3.11's asyncio logs a cancelled one as an unhandled exception with a traceback
        finally:
            self._clients.discard(this)
            client.close()

    def arrived(self, request: http1.Request, client: ClientConnection) -> object:
        """The fast path, in the callback that read the request's last byte: a request for a model that is served
        and ready, with an engine connection idle in the pool, is checked and sent from here, before the connection's
        task wakes (client.py says why); it gets the Flight. Anything else goes to the task as it is (or as far as
        it was read: a Routed, a Refused), and nothing is done twice."""
        if self.timing is not None:
            request.received = client.read_at  # its parse is the gateway's time too
        path = request.target.split("?", 1)[0]  # request.path, without a call: each is cache lines on a cold core
        if request.method != "POST" or path not in ROUTED or client.gone:
            return request
        try:
            keyed = self.require_key or (self.keys is not None and self.keys.ring)  # _authorize()'s first test
            routed = dispatch.routed(request, path, self._authorize(request) if keyed else None, self.table)
        except Answered as answer:
            return Refused(request, path, answer)
        table = self.table
        route = table.by_name.get(routed.model)  # table.find()
        if route is None or routed.model in table.starting or (self.loader is not None and
                                                              self.loader.holds(route.recipe)):
            return routed  # its engine is starting, swapping or loading: its queue, in the task
        now = self.pool.now((route.host, route.port))  # a spare, else a loopback engine connected to right here
        if now is None:
            return routed
        conn, pooled = now
        if self.loader is not None:
            self.loader.begin(route.recipe)  # in flight: never evicted mid-request (ended by _relay)
        return self._send(Flight(routed, route, conn, pooled, client, self.metrics,
                                 [] if self.timing is not None else None))

    def _authorize(self, request: http1.Request) -> ApiKey | None:
        if not self.require_key and (self.keys is None or not self.keys.ring):
            return None  # no key configured, loopback only: every client is let in (auth.authorize's first case)
        try:
            key = auth.authorize(self.keys, self.require_key, request.header("authorization"),
                                 self.monitor if request.method == "GET" and request.path == "/metrics" else None)
        except auth.Unauthorized as no:
            raise Answered(401, str(no), "invalid_request_error", "invalid_api_key", "unauthorized") from None
        if key is not None:
            self.metrics.key_requests.labels(key.name).inc()
        return key

    async def _serve(self, got: object, client: ClientConnection) -> bool:
        """One request to its answer: got is what arrived() made of it."""
        flight = got if isinstance(got, Flight) else None
        if isinstance(got, Refused):
            return await self._refuse(client, got.path, got.answer)
        if isinstance(got, http1.Request):
            request, path, key = got, got.path, None
            if path != "/health":
                try:
                    key = self._authorize(request)
                except Answered as answer:
                    return await self._refuse(client, path, answer)
            if request.method == "GET" and path in ("/v1/models", "/metrics", "/health"):
                loader = self.loader if path == "/v1/models" else None
                too_large = await loader.oversize.get() if loader is not None else {}
                client.write(self._own(path, key, too_large))
                await client.drain()
                return True
            if path not in ROUTED:
                return await self._refuse(client, path, Answered(404, f"no route for {request.method} {path[:200]}",
                                                                 "invalid_request_error", "unknown_url", "bad-request"))
            if request.method != "POST":
                return await self._refuse(client, path, Answered(405, f"{path} takes POST", "invalid_request_error",
                                                                 "method_not_allowed", "bad-request"))
            try:
                got = dispatch.routed(request, path, key, self.table)
            except Answered as answer:
                return await self._refuse(client, path, answer)
        routed = flight.routed if flight is not None else got
        assert isinstance(routed, Routed)
        # The relay runs in the connection's own task (a task of its own cost a turn of the event loop per request:
        # under load, behind every stream's pieces, ~0.5-1 ms on the lent H200), which the client's going away
        # cancels (a callback of its connection); the cancel closes the engine connection in _forward, which is how
        # the engine learns to stop generating.
        this: Any = asyncio.current_task()
        client.on_gone = this.cancel
        if flight is not None:  # sent from the read callback: the connection it took is replaced from here
            self.pool.refill((flight.route.host, flight.route.port))
        if client.gone:  # before this task woke: a request the fast path sent is taken back from its engine
            if flight is not None:
                flight.conn.abandon()  # counted as answered (to its end, or its `data: [DONE]`) or client-gone
                if self.loader is not None:
                    self.loader.end(flight.route.recipe)
            return False
        try:
            return await self._relay(routed, client, flight)
        except Answered as answer:
            return await self._refuse(client, routed.path, answer,
                                      routed.model if answer.reason != "unknown-model" else UNKNOWN)
        except asyncio.CancelledError:
            if not client.gone:
                raise  # the gateway itself is stopping
            if hasattr(this, "uncancel"):  # 3.11+: this task goes on, to close the client's connection
                this.uncancel()
            return False
        finally:
            client.on_gone = None

    async def _refuse(self, writer: ClientConnection, path: str, answer: Answered, model: str = UNKNOWN) -> bool:
        extra = [("Retry-After", str(answer.retry_after))] if answer.retry_after is not None else []
        if answer.status == 401:
            extra.append(("WWW-Authenticate", 'Bearer realm="metralectl gateway"'))
        writer.write(http1.simple_response(answer.status, answer.body, extra=extra))
        await writer.drain()
        self.metrics.errors.labels(model, answer.reason).inc()
        self.metrics.requests.labels(model, path if path in LABELLED else "(other)", str(answer.status)).inc()
        return True

    def _own(self, path: str, key: ApiKey | None = None, too_large: Mapping[str, TooLarge] | None = None) -> bytes:
        """too_large: the loadable recipes more than the whole budget (oversize.py), listed so with their numbers."""
        if path == "/metrics":
            return http1.simple_response(200, *self.metrics.text())
        if path == "/health":
            return http1.simple_response(200, json.dumps({"status": "ok", "models": len(self.table.routes),
                                                          "waiting": sum(self._waiting.values())}).encode())
        data = [{"id": name, "object": "model", "created": 0, "owned_by": route.owned_by or "metralectl",
                 "recipe": route.recipe, "status": "loaded"}
                for name, route in sorted(self.table.by_name.items())
                if key is None or key.allows(name, route.recipe)]  # a key sees the models it may use
        if self.loader is not None:  # what a request may name to have it loaded (or, too large, why not)
            too_large = too_large or {}
            data += [{"id": name, "object": "model", "created": 0, "owned_by": "metralectl", "recipe": recipe,
                      **(too_large[recipe].fields() if recipe in too_large else {"status": "loadable"})}
                     for name, recipe in sorted(self.loader.names.items())
                     if name not in self.table.by_name and (key is None or key.allows(name, recipe))]
        return http1.simple_response(200, json.dumps({"object": "list", "data": data}).encode())

    # one routed request
    async def _relay(self, routed: Routed, client: ClientConnection, flight: Flight | None = None) -> bool:
        """routed to its engine (flight: already sent there by the fast path) and its answer to the client."""
        refused_since = None  # the engine refused it, or went away with it unanswered: tried again (a swap's new
        # engine, a run starting it) until the table says where it is, for connect_timeout_s at most
        while True:
            if flight is None:
                route = await waiting.wait_for(self, routed.model)
                if self.loader is not None:
                    self.loader.begin(route.recipe)  # in flight: never evicted mid-request, and its last use
            else:
                route = flight.route  # begun by arrived()
            try:
                return await self._forward(route, routed, client, flight)
            except NotSent:  # the engine was not there (a swap stopped it, a run is starting it): wait, again
                refused_since = refused_since or time.monotonic()
                if time.monotonic() - refused_since > self.limits.connect_timeout_s:
                    break
                self._rescan.set()
                await self._table_change(1.0)
            finally:
                flight = None
                if self.loader is not None:
                    self.loader.end(route.recipe)
        if routed.model in self.table.exited:
            raise waiting.gone(routed.model, self.table)
        raise Answered(502, f"the engine serving `{routed.model}` does not answer", "server_error",
                       "upstream_unreachable", "upstream")

    def _send(self, flight: Flight) -> Flight:
        """flight's request written to its engine connection; its answer starts to the client from the callback that
        reads its head (upstream.py)."""
        routed, route = flight.routed, flight.route
        payload = routed.request.body if not route.models or routed.model == route.models[0] else routed.payload(route)
        flight.conn.send(routed.head(route, len(payload)) + payload, flight)
        if flight.marks is not None:
            flight.sent = timing.now()
            read_cpu = getattr(flight.client, "read_cpu", 0)  # a ClientConnection's (tests' stand-ins have none)
            flight.up_cpu = timing.cpu() - read_cpu if read_cpu else -1
        return flight

    async def _forward(self, route: Route, routed: Routed, client: ClientConnection,
                       flight: Flight | None = None) -> bool:
        model = routed.model
        resent = False
        while True:
            if flight is None:
                try:
                    conn, pooled = await self.pool.take((route.host, route.port))
                except (OSError, asyncio.TimeoutError):
                    raise NotSent() from None
                flight = self._send(Flight(routed, route, conn, pooled, client, self.metrics,
                                           [] if self.timing is not None else None, resent, True))
            conn = flight.conn
            try:
                response = await conn.head()
                break
            except http1.Closed:  # before a byte of an answer: a kept-alive one it had dropped, else not there
                conn.close()
                if flight.pooled:
                    flight, resent = None, True
                    continue
                raise NotSent() from None
            except (ConnectionError, http1.BadRequest) as bad:  # an answer's head cut, not HTTP/1.x, or too long
                conn.close()
                raise Answered(502, f"the engine serving `{model[:200]}`: {bad}", "server_error", "upstream_malformed",
                               "upstream") from None
            except BaseException:  # cancelled: the client went away (client-gone), or the gateway stops
                conn.abandon()
                raise
        gauge = self.metrics.in_flight.labels(model)
        gauge.inc()
        reusable = False
        try:
            reusable = await conn.relay(response, flight)
            return True
        except ConnectionError:
            self.metrics.errors.labels(model, "upstream").inc()
            return False  # the answer was cut: the client's connection closes too, so it sees that it was
        finally:
            gauge.dec()
            self.pool.give((route.host, route.port), conn, reusable)


async def serve(gateway: Gateway, sock: socket.socket, ready: Any = None) -> None:
    """Serve on a bound, listening socket until cancelled."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: ClientConnection(gateway.handle, gateway.arrived,
                                                               gateway.limits.max_body, gateway.connections), sock=sock)
    gateway._publish(await asyncio.to_thread(gateway.scanner.scan))
    if gateway.loader is not None:
        gateway.loader.oversize.start()  # the too-large recipes found now, so the first /v1/models seldom waits
    refresher = asyncio.ensure_future(gateway.refresh_forever())
    sweeper = asyncio.ensure_future(idle.sweep_forever(gateway.connections, gateway.limits.client_timeout_s,
                                                       gateway.metrics.count_timeouts))
    loops.settle_heap()  # what starting made, out of the collector's passes (loops.py says why)
    if ready is not None:
        ready(gateway.table)
    # Scans run on a worker thread, and Python hands the GIL from it to the waiting loop after this interval (5 ms).
    switch = sys.getswitchinterval()
    sys.setswitchinterval(min(switch, SWITCH_INTERVAL_S))
    busy.start(gateway.limits.busy_poll_s)
    try:
        await server.serve_forever()
    finally:  # stopping (Ctrl-C): no new client, and each one's connection closed now, its relay (and so its engine
        # connection) cancelled, streams cut where they are, never waited for; engines are left as they are
        sys.setswitchinterval(switch)
        busy.stop()
        server.close()
        refresher.cancel()
        sweeper.cancel()
        for unasked in [conn for conn in gateway.connections if conn.task is None]:
            unasked.drop()  # no request came on it, so no task: closed here
        clients = list(gateway._clients)
        for client in clients:
            client.cancel()
        if clients:
            await asyncio.wait(clients, timeout=5.0)
        gateway.pool.close()
        await asyncio.to_thread(gateway.scanner.close)
        if gateway.timing is not None:
            timing.unwatch_collections()
            timing.ON[0] = False
            timing.dump(gateway.timing)
