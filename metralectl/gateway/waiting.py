"""A request for a model that is not served yet: it waits, bounded, in that model's queue while its engine starts
or swaps (or the loader loads it), and gets an answer in OpenAI's shape when it cannot be served."""

from __future__ import annotations

import time
from typing import Any

from metralectl.gateway.http1 import Answered
from metralectl.gateway.loader import LoadRefused, wait_loaded
from metralectl.gateway.routes import Route, Table


async def wait_for(gw: Any, model: str) -> Route:
    """For the gateway (server.Gateway `gw`): the route for `model`, waiting (bounded, in its queue) while its
    engine starts or swaps; Answered when it is nobody's (404), or its queue is full or stalled (503 +
    Retry-After)."""
    table = gw.table
    if gw.loader is not None:  # the route once the loader has it loaded; None: not the loader's
        try:
            loaded = await wait_loaded(gw, model, gw.loader)
        except LoadRefused as no:
            raise Answered(no.status, no.message, "server_error", no.code, no.reason, retry_after=no.retry_after)
        if loaded is not None:
            return loaded
    if model not in table.starting and table.find(model) is not None:
        return table.find(model)  # type: ignore[return-value]
    if model not in table.starting:
        gw._rescan.set()  # it may have started a moment ago
        await gw._table_change(1.0)
        table = gw.table
        if model not in table.starting:
            route = table.find(model)
            if route is not None:
                return route
            if model in table.exited:
                raise gone(model, table)
            raise Answered(404, f"the model `{model[:200]}` is not served here; served: "
                                f"{', '.join(table.served_names()) or 'none'}", "invalid_request_error",
                           "model_not_found", "unknown-model", served=table.served_names())
    if gw._waiting.get(model, 0) >= gw.limits.queue_size:
        raise Answered(503, f"`{model}` is starting and {gw.limits.queue_size} requests already wait for it",
                       "server_error", "model_starting", "queue-full", retry_after=5)
    gw._waiting[model] = gw._waiting.get(model, 0) + 1
    gauge = gw.metrics.queue_depth.labels(model)
    gauge.inc()
    started, progress = time.monotonic(), (table.holder, table.phase)
    last_progress = started
    try:
        while True:
            table = gw.table
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
            left = gw.limits.queue_stall_s - (time.monotonic() - last_progress)
            if left <= 0:
                raise Answered(503, f"`{model}` is still starting: no progress in {gw.limits.queue_stall_s:g} s",
                               "server_error", "model_starting", "queue-stalled", retry_after=10)
            await gw._table_change(left)
    finally:
        gw._waiting[model] -= 1
        gauge.dec()
        gw.metrics.queue_wait.labels(model).observe(time.monotonic() - started)


def gone(model: str, table: Table) -> Answered:
    """502 for a model whose engine went away (crashed or killed; with loading on, a later request loads it again)."""
    recipe = table.exited.get(model, model)
    return Answered(502, f"the engine serving `{model[:200]}` went away (it exited without being stopped): "
                         f"`metralectl logs {recipe[:200]}` says why, `metralectl run {recipe[:200]}` starts it again",
                    "server_error", "upstream_gone", "upstream")
