"""What `top`, the dashboard and the page show of a gateway (`metralectl gateway`): its record (where it listens,
whether its process still runs) and its own Prometheus /metrics text -> a GatewayRow and the row's JSON. Pure: the
gateway package (gateway/watch.py) reads the records and fetches the text; this module only reads numbers.

A gateway whose record outlived its process (killed with -9) is `gone`, whatever its port answers now: the port may
be anyone's. The text is the gateway's own, but a port can be taken over: every name read from it is capped, and
front ends escape them (safetext) as they show them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Literal

GatewayState = Literal["serving", "gone", "not-answering", "needs-key", "bad-metrics"]
MAX_MODELS = 64  # names kept per gateway (a hostile text cannot grow a view without bound)
NAME_LIMIT = 120
PREFIX = "metralectl_gateway_"


@dataclass(frozen=True)
class GatewayModel:
    """One model the gateway counts: a recipe or a served name (`(unknown)` for names nobody serves)."""

    name: str
    routed: bool = False  # an engine serves it and the gateway routes to it now
    loading: bool = False  # a run/swap starts it, or the gateway's loader loads it on demand
    resident: bool = False  # loaded by the gateway's loader and not evicted since
    queue_depth: int = 0
    in_flight: int = 0
    requests: int = 0
    errors: int = 0
    loads: int = 0
    evictions: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "routed": self.routed, "loading": self.loading, "resident": self.resident,
                "queue_depth": self.queue_depth, "in_flight": self.in_flight, "requests": self.requests,
                "errors": self.errors, "loads": self.loads, "evictions": self.evictions}


@dataclass(frozen=True)
class GatewayRow:
    url: str
    pid: int
    keys: int
    started: str | None
    state: GatewayState
    error: str | None = None
    models_served: int | None = None  # engines routed to (its gauge)
    models: tuple[GatewayModel, ...] = ()
    loads: dict[str, int] | None = None  # by outcome: loaded, failed, refused
    errors_by_reason: dict[str, int] | None = None

    @property
    def serving(self) -> bool:
        return self.state == "serving"

    def names(self, flag: str) -> list[str]:
        return [m.name for m in self.models if getattr(m, flag)]

    def total(self, field: str) -> int | None:
        return sum(getattr(m, field) for m in self.models) if self.serving else None

    def to_json(self) -> dict[str, Any]:
        live = self.serving
        return {
            "url": self.url, "pid": self.pid, "keys": self.keys, "started": self.started, "state": self.state,
            "error": self.error, "models_served": self.models_served if live else None,
            "routed": self.names("routed"), "loading": self.names("loading"), "resident": self.names("resident"),
            "queue_depth": self.total("queue_depth"), "in_flight": self.total("in_flight"),
            "requests": self.total("requests"), "errors": self.total("errors"),
            "loads": dict(self.loads or {}) if live else None,
            "evictions": self.total("evictions"),
            "errors_by_reason": dict(self.errors_by_reason or {}) if live else None,
            "models": [m.to_json() for m in self.models],
        }


def gateway_row(record: dict[str, Any], *, running: bool, text: str | None = None, failure: str | None = None,
                needs_key: bool = False) -> GatewayRow:
    """The row of one gateway record: `gone` when its process does not run (nothing else is believed then), else
    from its /metrics `text`, or the `failure` to read it."""
    base: dict[str, Any] = dict(url=str(record["url"]), pid=int(record["pid"]), keys=int(record["keys"]),
                                started=record.get("started"))
    if not running:
        return GatewayRow(**base, state="gone", error="its process is gone (killed or crashed without removing its "
                                                      "record); the next gateway to start removes it")
    if needs_key:
        return GatewayRow(**base, state="needs-key", error="its /metrics needs an API key (keys are configured)")
    if text is None:
        return GatewayRow(**base, state="not-answering", error=failure or "no answer")
    try:
        return parse_gateway_metrics(text, base)
    except (ValueError, TypeError, KeyError, IndexError) as exc:  # prometheus_client's parser on a foreign text
        return GatewayRow(**base, state="bad-metrics", error=f"its /metrics is not the gateway's: {exc}"[:300])


def parse_gateway_metrics(text: str, base: dict[str, Any]) -> GatewayRow:
    from prometheus_client.parser import text_string_to_metric_families

    per: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    loads: dict[str, int] = defaultdict(int)
    reasons: dict[str, int] = defaultdict(int)
    served: float | None = None
    seen = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, value = sample.name, sample.value
            if not name.startswith(PREFIX) or name.endswith("_created") or not math.isfinite(value):
                continue
            seen = True
            short = name[len(PREFIX):].removesuffix("_total")
            if short == "models_served":
                served = value
                continue
            model = str(sample.labels.get("model", ""))[:NAME_LIMIT]
            if not model or (model not in per and len(per) >= MAX_MODELS):
                continue
            if short == "loads":
                loads[str(sample.labels.get("outcome", ""))[:40]] += int(value)
                per[model]["loads"] += value if sample.labels.get("outcome") == "loaded" else 0
            elif short == "errors":
                reason = str(sample.labels.get("reason", ""))[:40]
                reasons[reason] += int(value)
                if reason != "client-gone":  # a client that left (a user's stop) is no failure: by reason only
                    per[model]["errors"] += value
            elif short in ("requests", "evictions", "queue_depth"):
                per[model][short] += value
            elif short == "requests_in_flight":
                per[model]["in_flight"] += value
            elif short in ("model_routed", "model_starting", "model_loading", "model_resident"):
                per[model][short] = max(per[model][short], value)
    if not seen:
        raise ValueError("no metralectl_gateway_ series")
    models = tuple(GatewayModel(
        name, routed=v["model_routed"] > 0, loading=v["model_starting"] > 0 or v["model_loading"] > 0,
        resident=v["model_resident"] > 0, queue_depth=int(v["queue_depth"]), in_flight=int(v["in_flight"]),
        requests=int(v["requests"]), errors=int(v["errors"]), loads=int(v["loads"]), evictions=int(v["evictions"]))
        for name, v in sorted(per.items()))
    return GatewayRow(**base, state="serving", models_served=None if served is None else int(served), models=models,
                      loads=dict(loads), errors_by_reason=dict(reasons))
