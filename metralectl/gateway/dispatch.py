"""One routed request between its reading and its answer: what the gateway read of it (Routed: the model it names,
checked against the caller's key) and, once sent to an engine, the send (Flight). Both are plain data the
connection's task and the fast path that forwards from the read callback (server.Gateway.arrived) hand each other."""

from __future__ import annotations

import json
import json.scanner
from dataclasses import dataclass
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from metralectl.core.gateway_keys import ApiKey
from metralectl.gateway import auth, http1, timing
from metralectl.gateway.http1 import Answered, Request
from metralectl.gateway.routes import Route, Table
from metralectl.gateway.upstream import Client, Start, Upstream

if TYPE_CHECKING:
    from metralectl.gateway.metrics import Metrics

# The C scanner json.loads() runs, called directly: loads() wraps it in two Python calls and two regex matches for
# the whitespace around the document, Python run per request on cold caches (heads.py says why that counts).
_scan: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(  # typeshed types it as a class
    json.JSONDecoder())  # type: ignore[arg-type]
_JSON_SPACE = " \t\n\r"  # RFC 8259 2: the only whitespace around a value
# no `model` in these: the one engine's, else the body's
UNNAMED = frozenset({"/tokenize", "/detokenize", "/apply-template"})


@dataclass(slots=True)
class Routed:
    """A request for a model, its body read and its caller allowed to use it."""

    request: Request
    path: str
    body: dict[str, Any]
    model: str
    keyed: bool = False  # it came with a gateway key (its Authorization header): never passed on

    def payload(self, route: Route) -> bytes:
        """The body for `route`'s engine: as it came, unless the engine checks the name and serves it as another."""
        if route.models and self.model != route.models[0]:
            return json.dumps({**self.body, "model": route.models[0]}).encode()
        return self.request.body

    def head(self, route: Route, length: int) -> bytes:
        """The request's head for `route`'s engine: the client's end-to-end headers, the engine token in place of
        any client's Authorization (and a gateway key never), the engine's Host and the body's length. All but the
        length is kept per head seen before and route (heads.py says why), the route held so its id is not reused."""
        request, drop = self.request, bool(route.upstream) or self.keyed
        key = (request.method, request.target, request.block, drop, id(route)) if request.block is not None else None
        known = _prefixes.get(key) if key is not None else None
        if known is None or known[0] is not route:
            kept = http1.end_to_end(request.block, request.headers, drop)
            token = "".join(f"{k}: {v}\r\n" for k, v in route.upstream)
            prefix = (f"{request.method} {request.target} HTTP/1.1\r\n{kept}{token}Host: {route.host}:{route.port}"
                      "\r\nContent-Length: ").encode("latin-1")
            if key is None:
                return prefix + b"%d\r\n\r\n" % length
            if len(_prefixes) >= 256:
                _prefixes.clear()
            known = _prefixes[key] = (route, prefix)
        return known[1] + b"%d\r\n\r\n" % length


_prefixes: dict[tuple[str, str, str | None, bool, int], tuple[Route, bytes]] = {}  # Routed.head(), all but its length


class Flight(Start):
    """A routed request sent to an engine on `conn` (pooled: the engine may have closed it meanwhile), and where its
    answer goes (it is its own Start): counted in `requests` once its answer is handed to the client (an SSE stream
    once its `data: [DONE]` is), in `errors` as client-gone when its client leaves before that."""

    __slots__ = ("routed", "route", "conn", "pooled", "metrics", "sent", "resent", "up_cpu", "tasked")

    def __init__(self, routed: Routed, route: Route, conn: Upstream, pooled: bool, client: Client,
                 metrics: Metrics, marks: list[int] | None = None, resent: bool = False, tasked: bool = False) -> None:
        self.client, self.marks = client, marks  # Start's, without a call to its __init__
        self.routed, self.route, self.conn, self.pooled, self.metrics = routed, route, conn, pooled, metrics
        self.sent = 0  # timing.now() as it was handed to the engine's socket, when the gateway keeps its own time
        self.up_cpu = -1  # and the thread's CPU time from the request's read to then (timing.cpu())
        self.resent = resent  # sent again: the kept connection it went on first had been closed by the engine
        self.tasked = tasked  # sent from the connection's task, not from the callback that read it

    @property
    def request(self) -> Request:
        return self.routed.request

    def answered(self, response: http1.Response) -> None:  # in the callback that wrote its end (upstream.py says why)
        if self.marks is not None:
            timing.keep(self.routed.request.received, self.sent, self.marks, self.resent, self.up_cpu, self.tasked)
        self.metrics.requests.labels(self.routed.model, self.routed.path, str(response.status)).inc()

    def cut(self) -> None:
        if self.client.gone:  # else the gateway stops: no fault of the request's
            self.metrics.errors.labels(self.routed.model, "client-gone").inc()


@dataclass(slots=True)
class Refused:
    """A request the fast path refused (its key, its body): the task writes the answer."""

    request: Request
    path: str
    answer: Answered


def _json(data: bytes) -> object:
    """The body's JSON, else None. UTF-8 (RFC 8259 8.1) starting with its object is read at once, as json.loads
    would; json.loads(bytes), which first guesses among UTF-8, -16 and -32 (and a BOM), only for any other body."""
    try:
        text = data.decode("utf-8", "surrogatepass")
        if text[:1] == "{":
            value, end = _scan(text, 0)
            if end == len(text) or not text[end:].strip(_JSON_SPACE):
                return value
            return None  # more after the value: json.loads says "Extra data"
    except RecursionError:  # nested past Python's stack
        return None
    except (ValueError, StopIteration):  # not JSON, or not UTF-8
        pass
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def routed(request: Request, path: str, key: ApiKey | None, table: Table) -> Routed:
    """What a routed request names, checked: Answered (400, 403) when it names no model or one its key may not use.
    A gateway key is its own: it is taken off the request here, never passed on to an engine."""
    body = _json(request.body) if request.body else None
    model = body.get("model") if isinstance(body, dict) else None
    if model is None and path in UNNAMED and isinstance(body, dict) and len(table.routes) == 1:
        model = table.routes[0].recipe
    if not isinstance(body, dict) or not isinstance(model, str) or not model:
        raise Answered(400, "the request body is not JSON naming a `model`", "invalid_request_error",
                       "model_missing", "bad-request")
    if key is not None and not auth.may_use(key, model, table.find(model)):
        assert key is not None
        raise Answered(403, f"the key `{key.name}` may not use the model `{model[:200]}`", "invalid_request_error",
                       "model_not_allowed", "forbidden")
    if key is not None:
        request.headers = [(k, v) for k, v in request.headers if k.lower() != "authorization"]
    return Routed(request, path, body, model, key is not None)
