"""One routed request between its reading and its answer: what the gateway read of it (Routed: the model it names,
checked against the caller's key) and, once sent to an engine, the send (Flight). Both are plain data the
connection's task and the fast path that forwards from the read callback (server.Gateway.arrived) hand each other."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from metralectl.core.gateway_keys import ApiKey
from metralectl.gateway import auth, http1
from metralectl.gateway.http1 import Answered, Request
from metralectl.gateway.routes import Route, Table
from metralectl.gateway.upstream import Start, Upstream

# no `model` in these: the one engine's, else the body's
UNNAMED = frozenset({"/tokenize", "/detokenize", "/apply-template"})


@dataclass
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
        any client's Authorization (and a gateway key never), the engine's Host and the body's length."""
        request = self.request
        kept = http1.end_to_end(request.block, request.headers, bool(route.upstream) or self.keyed)
        token = "".join(f"{k}: {v}\r\n" for k, v in route.upstream)
        return (f"{request.method} {request.target} HTTP/1.1\r\n{kept}{token}Host: {route.host}:{route.port}\r\n"
                f"Content-Length: {length}\r\n\r\n").encode("latin-1")


@dataclass
class Flight:
    """A routed request sent to an engine on `conn` (pooled: the engine may have closed it meanwhile)."""

    routed: Routed
    route: Route
    conn: Upstream
    pooled: bool
    start: Start | None = None  # where its answer goes (set as it is sent)
    sent: int = 0  # timing.now() as it was handed to the engine's socket, when the gateway keeps its own time

    @property
    def request(self) -> Request:
        return self.routed.request


@dataclass
class Refused:
    """A request the fast path refused (its key, its body): the task writes the answer."""

    request: Request
    path: str
    answer: Answered


def routed(request: Request, path: str, key: ApiKey | None, table: Table) -> Routed:
    """What a routed request names, checked: Answered (400, 403) when it names no model or one its key may not use.
    A gateway key is its own: it is taken off the request here, never passed on to an engine."""
    try:
        body = json.loads(request.body) if request.body else None
    except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
        body = None
    model = body.get("model") if isinstance(body, dict) else None
    if model is None and path in UNNAMED and isinstance(body, dict) and len(table.routes) == 1:
        model = table.routes[0].recipe
    if not isinstance(body, dict) or not isinstance(model, str) or not model:
        raise Answered(400, "the request body is not JSON naming a `model`", "invalid_request_error",
                       "model_missing", "bad-request")
    if not auth.may_use(key, model, table.find(model)):
        assert key is not None
        raise Answered(403, f"the key `{key.name}` may not use the model `{model[:200]}`", "invalid_request_error",
                       "model_not_allowed", "forbidden")
    if key is not None:
        request.headers = [(k, v) for k, v in request.headers if k.lower() != "authorization"]
    return Routed(request, path, body, model, key is not None)
