"""The gateway's event loop: accept, read a request under its caps, route it by its `model`, relay the engine's
answer as it comes, and hold a request whose model is starting or swapping in a bounded queue.

One asyncio loop, no thread per request. The routing table (routes.py) is replaced whole by a scan on a worker
thread, so a request only reads a dict. Engine connections come from pool.py (kept alive, or opened ahead). A client
that goes away (EOF or reset on its socket, seen by ClientReader) cancels its relay, and the relay's engine
connection is closed, which is how an engine learns to stop generating.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

from metralectl.gateway import auth, http1, loops, timing
from metralectl.gateway.http1 import Answered, ClientReader, NotSent
from metralectl.core.gateway_keys import ApiKey, KeyWatch
from metralectl.gateway.metrics import UNKNOWN, Metrics
from metralectl.gateway.pool import SPARES, Pool
from metralectl.gateway.loader import Loader, LoadRefused, wait_loaded
from metralectl.gateway.routes import LIFECYCLE_POLL_S, RESCAN_S, Route, Scanner, Table
from metralectl.gateway.upstream import Start

# The engines' own token counters and llama-server's chat template: bench sizes its prompts with them (a prompt
# sized by guess through the gateway was 220 tokens where 127 were asked, and the comparison with direct was off).
ROUTED = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
                    "/tokenize", "/detokenize", "/apply-template"})
LABELLED = ROUTED | {"/v1/models", "/metrics", "/health"}  # the paths metrics name; any other is "(other)", not its own
SWITCH_INTERVAL_S = 0.0005  # the longest the event loop waits for the GIL behind the scan's thread (serve())
UNNAMED = frozenset({"/tokenize", "/detokenize", "/apply-template"})  # no `model`: the one engine's, else the body's


@dataclass(frozen=True)
class Limits:
    max_body: int = 16 * 1024 * 1024
    queue_size: int = 256  # requests waiting per model
    queue_stall_s: float = 300.0  # a waiting request fails after this long with no progress of its model's start
    connect_timeout_s: float = 5.0
    spares: int = SPARES  # engine connections opened ahead of need, per engine (pool.py)


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
        self.on_table: Any = None  # called with each new Table whose routes differ (the CLI's status line)
        self.monitor: str | None = None  # the credential that reads /metrics with keys in force (state.record)
        self.timing = timing.target()  # the gateway's own time per request, kept only when asked (timing.py)

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
            holder, journal = await asyncio.to_thread(self.scanner.lifecycle)
            seen = (holder, journal.get("phase") if journal else None, journal.get("updated") if journal else None)
            if seen != last_seen or self._rescan.is_set() or time.monotonic() - last_scan > RESCAN_S:
                self._rescan.clear()
                self._publish(await asyncio.to_thread(self.scanner.scan))
                last_seen, last_scan = seen, time.monotonic()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._rescan.wait(), LIFECYCLE_POLL_S)

    async def _table_change(self, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    # connections
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert isinstance(reader, ClientReader)  # its socket is TCP_NODELAY: both loops set it (loops.py)
        this: Any = asyncio.current_task()  # never None here: a connection's own task
        self._clients.add(this)
        try:
            while True:
                try:
                    request = await http1.read_request(reader, self.limits.max_body)
                    if self.timing is not None:
                        request.received = timing.now()
                except http1.Closed:
                    return
                except http1.BadRequest as bad:
                    self.metrics.errors.labels(UNKNOWN, "bad-request").inc()
                    writer.write(http1.simple_response(bad.status, http1.error_body(bad.status, bad.message, bad.kind),
                                                       keep_alive=False))
                    await writer.drain()
                    return
                keep = await self._serve(request, reader, writer)
                if not keep or not request.keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:  # the gateway stops (serve()): this task is the connection's top, awaited by
            return  # nobody, and Python 3.11's asyncio logs a cancelled one as an unhandled exception with a traceback
        finally:
            self._clients.discard(this)
            writer.close()

    def _authorize(self, request: http1.Request) -> ApiKey | None:
        try:
            key = auth.authorize(self.keys, self.require_key, request.header("authorization"),
                                 self.monitor if request.method == "GET" and request.path == "/metrics" else None)
        except auth.Unauthorized as no:
            raise Answered(401, str(no), "invalid_request_error", "invalid_api_key", "unauthorized") from None
        if key is not None:
            self.metrics.key_requests.labels(key.name).inc()
        return key

    async def _serve(self, request: http1.Request, reader: ClientReader, writer: asyncio.StreamWriter) -> bool:
        path, key = request.path, None
        if path != "/health":
            try:
                key = self._authorize(request)
            except Answered as answer:
                return await self._refuse(writer, path, answer)
        if request.method == "GET" and path in ("/v1/models", "/metrics", "/health"):
            writer.write(self._own(path, key))
            await writer.drain()
            return True
        if path not in ROUTED:
            return await self._refuse(writer, path, Answered(404, f"no route for {request.method} {path[:200]}",
                                                             "invalid_request_error", "unknown_url", "bad-request"))
        if request.method != "POST":
            return await self._refuse(writer, path, Answered(405, f"{path} takes POST", "invalid_request_error",
                                                             "method_not_allowed", "bad-request"))
        if reader.gone:
            return False
        # The relay runs in the connection's own task (a task of its own cost a turn of the event loop per request:
        # under load, behind every stream's pieces, ~0.5-1 ms on the lent H200), which the client's going away
        # cancels (a callback of its reader); the cancel closes the engine connection in _forward, which is how the
        # engine learns to stop generating.
        this: Any = asyncio.current_task()
        reader.on_gone = this.cancel
        try:
            return await self._route(request, path, writer, key)
        except asyncio.CancelledError:
            if not reader.gone:
                raise  # the gateway itself is stopping
            if hasattr(this, "uncancel"):  # 3.11+: this task goes on, to close the client's connection
                this.uncancel()
            return False
        finally:
            reader.on_gone = None

    async def _refuse(self, writer: asyncio.StreamWriter, path: str, answer: Answered, model: str = UNKNOWN) -> bool:
        extra = [("Retry-After", str(answer.retry_after))] if answer.retry_after is not None else []
        if answer.status == 401:
            extra.append(("WWW-Authenticate", 'Bearer realm="metralectl gateway"'))
        writer.write(http1.simple_response(answer.status, answer.body, extra=extra))
        await writer.drain()
        self.metrics.errors.labels(model, answer.reason).inc()
        self.metrics.requests.labels(model, path if path in LABELLED else "(other)", str(answer.status)).inc()
        return True

    def _own(self, path: str, key: ApiKey | None = None) -> bytes:
        if path == "/metrics":
            return http1.simple_response(200, *self.metrics.text())
        if path == "/health":
            return http1.simple_response(200, json.dumps({"status": "ok", "models": len(self.table.routes),
                                                          "waiting": sum(self._waiting.values())}).encode())
        data = [{"id": name, "object": "model", "created": 0, "owned_by": route.owned_by or "metralectl",
                 "recipe": route.recipe, "status": "loaded"}
                for name, route in sorted(self.table.by_name.items())
                if key is None or key.allows(name, route.recipe)]  # a key sees the models it may use
        if self.loader is not None:  # what a request may name to have it loaded
            data += [{"id": name, "object": "model", "created": 0, "owned_by": "metralectl", "recipe": recipe,
                      "status": "loadable"} for name, recipe in sorted(self.loader.names.items())
                     if name not in self.table.by_name and (key is None or key.allows(name, recipe))]
        return http1.simple_response(200, json.dumps({"object": "list", "data": data}).encode())

    # one routed request
    async def _route(self, request: http1.Request, path: str, writer: asyncio.StreamWriter,
                     key: ApiKey | None = None) -> bool:
        try:
            body = json.loads(request.body) if request.body else None
        except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
            body = None
        model = body.get("model") if isinstance(body, dict) else None
        if model is None and path in UNNAMED and isinstance(body, dict) and len(self.table.routes) == 1:
            model = self.table.routes[0].recipe
        if not isinstance(body, dict) or not isinstance(model, str) or not model:
            return await self._refuse(writer, path, Answered(400, "the request body is not JSON naming a `model`",
                                                             "invalid_request_error", "model_missing", "bad-request"))
        if not auth.may_use(key, model, self.table.find(model)):
            assert key is not None
            return await self._refuse(writer, path, Answered(
                403, f"the key `{key.name}` may not use the model `{model[:200]}`", "invalid_request_error",
                "model_not_allowed", "forbidden"))
        if key is not None:  # the gateway's key is its own: never passed on to an engine
            request.headers = [(k, v) for k, v in request.headers if k.lower() != "authorization"]
        try:
            return await self._relay(request, body, model, path, writer)
        except Answered as answer:
            return await self._refuse(writer, path, answer, model if answer.reason != "unknown-model" else UNKNOWN)

    async def _wait_for(self, model: str) -> Route:
        """The route for `model`, waiting (bounded, in its queue) while its engine starts or swaps; Answered
        when it is nobody's (404), or its queue is full or stalled (503 + Retry-After)."""
        table = self.table
        if self.loader is not None:  # the route once the loader has it loaded; None: not the loader's
            try:
                loaded = await wait_loaded(self, model, self.loader)
            except LoadRefused as no:
                raise Answered(no.status, no.message, "server_error", no.code, no.reason, retry_after=no.retry_after)
            if loaded is not None:
                return loaded
        if model not in table.starting and table.find(model) is not None:
            return table.find(model)  # type: ignore[return-value]
        if model not in table.starting:
            self._rescan.set()  # it may have started a moment ago
            await self._table_change(1.0)
            table = self.table
            if model not in table.starting:
                route = table.find(model)
                if route is not None:
                    return route
                if model in table.exited:
                    raise _gone(model, table)
                raise Answered(404, f"the model `{model[:200]}` is not served here; served: "
                                    f"{', '.join(table.served_names()) or 'none'}", "invalid_request_error",
                               "model_not_found", "unknown-model", served=table.served_names())
        if self._waiting.get(model, 0) >= self.limits.queue_size:
            raise Answered(503, f"`{model}` is starting and {self.limits.queue_size} requests already wait for it",
                           "server_error", "model_starting", "queue-full", retry_after=5)
        self._waiting[model] = self._waiting.get(model, 0) + 1
        gauge = self.metrics.queue_depth.labels(model)
        gauge.inc()
        started, progress = time.monotonic(), (table.holder, table.phase)
        last_progress = started
        try:
            while True:
                table = self.table
                route = table.find(model)
                if model not in table.starting:
                    if route is not None:
                        return route
                    raise Answered(404, f"the model `{model[:200]}` is not served here (its start ended without it); "
                                        f"served: {', '.join(table.served_names()) or 'none'}",
                                   "invalid_request_error", "model_not_found", "unknown-model",
                                   served=table.served_names())
                if (table.holder, table.phase) != progress:
                    progress, last_progress = (table.holder, table.phase), time.monotonic()
                left = self.limits.queue_stall_s - (time.monotonic() - last_progress)
                if left <= 0:
                    raise Answered(503, f"`{model}` is still starting: no progress in {self.limits.queue_stall_s:g} s",
                                   "server_error", "model_starting", "queue-stalled", retry_after=10)
                await self._table_change(left)
        finally:
            self._waiting[model] -= 1
            gauge.dec()
            self.metrics.queue_wait.labels(model).observe(time.monotonic() - started)

    async def _relay(self, request: http1.Request, body: dict[str, Any], model: str, path: str,
                     writer: asyncio.StreamWriter) -> bool:
        payload = request.body
        refused_since = None  # the engine refused it, or went away with it unanswered: tried again (a swap's new
        # engine, a run starting it) until the table says where it is, for connect_timeout_s at most
        while True:
            route = await self._wait_for(model)
            if route.models and model != route.models[0]:  # engines that check the name get the one they serve
                payload = json.dumps({**body, "model": route.models[0]}).encode()
            if self.loader is not None:
                self.loader.begin(route.recipe)  # in flight: never evicted mid-request, and its last use
            try:
                return await self._forward(route, request, payload, model, path, writer)
            except NotSent:  # the engine was not there (a swap stopped it, a run is starting it): wait, again
                refused_since = refused_since or time.monotonic()
                if time.monotonic() - refused_since > self.limits.connect_timeout_s:
                    break
                self._rescan.set()
                await self._table_change(1.0)
            finally:
                if self.loader is not None:
                    self.loader.end(route.recipe)
        if model in self.table.exited:
            raise _gone(model, self.table)
        raise Answered(502, f"the engine serving `{model}` does not answer", "server_error", "upstream_unreachable",
                       "upstream")

    async def _forward(self, route: Route, request: http1.Request, payload: bytes, model: str, path: str,
                       client: asyncio.StreamWriter) -> bool:
        headers = [*((k, v) for k, v in http1.forwarded(request.headers) if not (route.upstream and k.lower() ==
                   "authorization")), *route.upstream, ("Host", f"{route.host}:{route.port}"),
                   ("Content-Length", str(len(payload)))]  # the engine token replaces any client's
        head = http1.head_bytes(f"{request.method} {request.target} HTTP/1.1", headers)
        marks: list[int] | None = [] if self.timing is not None else None
        sent = 0

        def answered(response: http1.Response) -> None:  # in the callback that wrote its end (upstream.py says why)
            if marks is not None:
                timing.keep(request.received, sent, marks)
            self.metrics.requests.labels(model, path, str(response.status)).inc()

        start = Start(client, marks, answered)  # the answer goes to the client from the callback that read its head
        while True:
            try:
                conn, pooled = await self.pool.take((route.host, route.port))
            except (OSError, asyncio.TimeoutError):
                raise NotSent() from None
            try:
                conn.send(head + payload, start)
                sent = timing.now() if self.timing is not None else 0
                response = await conn.head()
                break
            except http1.Closed:  # before a byte of an answer: a kept-alive one it had dropped, else not there
                conn.close()
                if pooled:
                    continue
                raise NotSent() from None
            except (ConnectionError, http1.BadRequest) as bad:  # an answer's head cut, not HTTP/1.x, or too long
                conn.close()
                raise Answered(502, f"the engine serving `{model[:200]}`: {bad}", "server_error", "upstream_malformed",
                               "upstream") from None
            except BaseException:
                conn.close()
                raise
        gauge = self.metrics.in_flight.labels(model)
        gauge.inc()
        reusable = False
        try:
            reusable = await conn.relay(response, start)
            return True
        except ConnectionError:
            self.metrics.errors.labels(model, "upstream").inc()
            return False  # the answer was cut: the client's connection closes too, so it sees that it was
        finally:
            gauge.dec()
            self.pool.give((route.host, route.port), conn, reusable)


def _gone(model: str, table: Table) -> Answered:
    """502 for a model whose engine went away (crashed or killed; with loading on, a later request loads it again)."""
    recipe = table.exited.get(model, model)
    return Answered(502, f"the engine serving `{model[:200]}` went away (it exited without being stopped): "
                         f"`metralectl logs {recipe[:200]}` says why, `metralectl run {recipe[:200]}` starts it again",
                    "server_error", "upstream_gone", "upstream")


async def serve(gateway: Gateway, sock: socket.socket, ready: Any = None) -> None:
    """Serve on a bound, listening socket until cancelled."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: http1.ClientProtocol(ClientReader(http1.HEAD_LIMIT), gateway.handle), sock=sock)
    gateway._publish(await asyncio.to_thread(gateway.scanner.scan))
    refresher = asyncio.ensure_future(gateway.refresh_forever())
    loops.settle_heap()  # what starting made, out of the collector's passes (loops.py says why)
    if ready is not None:
        ready(gateway.table)
    # Scans run on a worker thread, and Python hands the GIL from it to the waiting loop after this interval (5 ms).
    switch = sys.getswitchinterval()
    sys.setswitchinterval(min(switch, SWITCH_INTERVAL_S))
    try:
        await server.serve_forever()
    finally:  # stopping (Ctrl-C): no new client, and each one's connection closed now, its relay (and so its engine
        # connection) cancelled, streams cut where they are, never waited for; engines are left as they are
        sys.setswitchinterval(switch)
        server.close()
        refresher.cancel()
        clients = list(gateway._clients)
        for client in clients:
            client.cancel()
        if clients:
            await asyncio.wait(clients, timeout=5.0)
        gateway.pool.close()
        await asyncio.to_thread(gateway.scanner.close)
        if gateway.timing is not None:
            timing.dump(gateway.timing)
