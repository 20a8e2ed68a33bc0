"""The gateway's own Prometheus series, per model (the name the client asked for, once routed: a recipe or a
served name; unknown names are counted under `model="(unknown)"` so a client cannot grow the label set)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from metralectl.gateway.routes import Table

UNKNOWN = "(unknown)"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("metralectl_gateway_requests", "Requests answered, by model, path and status (a "
                                "stream once its data: [DONE] reached the client, which may close before the "
                                "engine's last chunk)", ["model", "path", "status"], registry=r)
        self.errors = Counter("metralectl_gateway_errors", "Requests the gateway itself failed, by model and reason "
                              "(unknown-model, queue-full, queue-stalled, upstream (an engine cut its answer, went "
                              "away or does not answer), client-gone (the client left a request sent to its engine "
                              "before its answer's end), bad-request, unauthorized, forbidden)",
                              ["model", "reason"], registry=r)
        self.client_timeouts = Counter("metralectl_gateway_client_timeouts", "Client connections closed past the "
                                       "client timeout, by kind (idle; head: a request head not whole in time, 408)",
                                       ["kind"], registry=r)
        self.in_flight = Gauge("metralectl_gateway_requests_in_flight", "Requests being relayed now", ["model"],
                               registry=r)
        self.queue_depth = Gauge("metralectl_gateway_queue_depth", "Requests waiting for a model that is starting or "
                                 "swapping", ["model"], registry=r)
        self.queue_wait = Histogram("metralectl_gateway_queue_wait_seconds", "Time a request waited for its model",
                                    ["model"], registry=r,
                                    buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600))
        self.key_requests = Counter("metralectl_gateway_key_requests", "Requests let in, by API key name",
                                    ["key"], registry=r)
        self.engines_gone = Counter("metralectl_gateway_engines_gone", "Engines that went away while the gateway "
                                    "routed to them (crashed or killed, not stopped), by recipe", ["model"],
                                    registry=r)
        self.served = Gauge("metralectl_gateway_models_served", "Models (recipes) the gateway routes to now",
                            registry=r)

        # what `top`, the dashboard and the page show of the gateway (telemetry/gateway_view.py reads these)
        self.routed = Gauge("metralectl_gateway_model_routed", "1 while the gateway routes to the recipe's engine "
                            "(whoever started it), 0 once it no longer does", ["model"], registry=r)
        self.starting = Gauge("metralectl_gateway_model_starting", "1 while a run, swap or load on demand starts or "
                              "replaces the model (its requests wait), else 0", ["model"], registry=r)
        self.loading = Gauge("metralectl_gateway_model_loading", "1 while the gateway's loader loads the model on "
                             "demand (room made, engine starting), else 0", ["model"], registry=r)
        self._shown: dict[Gauge, set[str]] = {}
        self.resident = Gauge("metralectl_gateway_model_resident", "1 while the gateway's loader has the model loaded, "
                              "0 once it evicted it", ["model"], registry=r)
        self.loads = Counter("metralectl_gateway_loads", "Loads on demand, by model and outcome (loaded, failed, "
                             "refused)", ["model", "outcome"], registry=r)
        self.evictions = Counter("metralectl_gateway_evictions", "Models stopped to make room for another",
                                 ["model"], registry=r)
        self.load_seconds = Histogram("metralectl_gateway_load_seconds", "Time a load on demand took (room made, "
                                      "engine started and ready)", ["model"], registry=r,
                                      buckets=(1, 2, 5, 10, 30, 60, 120, 300, 600, 1800))

    def count_timeouts(self, idle: int, head: int) -> None:
        if idle:
            self.client_timeouts.labels("idle").inc(idle)
        if head:
            self.client_timeouts.labels("head").inc(head)

    def publish(self, table: Table) -> None:
        """The routing table's state as gauges: how many engines, which recipes are routed and which are starting."""
        self.served.set(len(table.routes))
        routed = {route.recipe for route in table.routes}
        for gauge, now in ((self.routed, routed), (self.starting, set(table.starting))):
            shown = self._shown.setdefault(gauge, set())  # the names it has shown: set back to 0, never dropped
            shown |= now
            for name in shown:
                gauge.labels(name).set(1 if name in now else 0)

    def text(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
