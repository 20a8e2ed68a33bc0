"""The gateway's row as `top`, the dashboard and the page show it, from the gateway's own Metrics (the real
registry and its text), and what is shown of a gateway that is gone or whose port answers something else."""

from __future__ import annotations

from pathlib import Path

import pytest

from metralectl.core import gateway_keys as keys
from metralectl.gateway import auth
from metralectl.gateway.metrics import Metrics
from metralectl.gateway.routes import Route, Table
from metralectl.telemetry.gateway_view import gateway_row

RECORD = {"url": "http://127.0.0.1:8090", "pid": 4242, "keys": 1, "started": "2026-12-04T05:00:00Z"}


def _route(recipe: str, port: int) -> Route:
    return Route(recipe, f"http://127.0.0.1:{port}", "127.0.0.1", port, (recipe,))


def test_a_running_gateways_routed_loading_and_counts_come_from_its_metrics() -> None:
    m = Metrics()
    m.publish(Table(routes=(_route("a", 1), _route("b", 2))))
    m.publish(Table(routes=(_route("a", 1),), starting=frozenset({"c"})))  # b stopped, c starting
    m.loading.labels("d").set(1)
    m.queue_depth.labels("c").set(3)
    m.requests.labels("a", "/v1/chat/completions", "200").inc(5)
    m.requests.labels("(unknown)", "/v1/chat/completions", "404").inc()
    m.errors.labels("(unknown)", "unknown-model").inc()
    m.errors.labels("a", "client-gone").inc(2)  # clients that left mid-answer: by reason, not among the errors
    m.loads.labels("b", "loaded").inc(2)
    m.loads.labels("d", "refused").inc()
    m.evictions.labels("b").inc()
    row = gateway_row(RECORD, running=True, text=m.text()[0].decode())
    data = row.to_json()
    assert data["state"] == "serving" and data["models_served"] == 1
    assert data["routed"] == ["a"] and data["loading"] == ["c", "d"]
    assert data["queue_depth"] == 3 and data["requests"] == 6 and data["errors"] == 1 and data["evictions"] == 1
    assert data["loads"] == {"loaded": 2, "refused": 1} and data["errors_by_reason"] == {"unknown-model": 1,
                                                                                      "client-gone": 2}


def test_a_gone_gateway_shows_no_number_and_a_foreign_answer_is_not_believed() -> None:
    gone = gateway_row(RECORD, running=False, text="metralectl_gateway_models_served 3\n").to_json()
    assert gone["state"] == "gone" and gone["models_served"] is None and gone["requests"] is None
    assert gone["routed"] == [] and "gone" in gone["error"]
    for text in ("<html>not metrics</html>", "other_metric 1\n", 'metralectl_gateway_requests_total{model="a" 1\n'):
        row = gateway_row(RECORD, running=True, text=text)
        assert row.state == "bad-metrics" and row.to_json()["requests"] is None, text
    assert gateway_row(RECORD, running=True, needs_key=True).state == "needs-key"
    assert gateway_row(RECORD, running=True, failure="not answering (ReadTimeout)").state == "not-answering"


def test_hostile_model_names_are_capped_and_bounded() -> None:
    lines = [f'metralectl_gateway_model_routed{{model="{i}{"x" * 500}"}} 1' for i in range(200)]
    row = gateway_row(RECORD, running=True, text="\n".join(lines) + "\n")
    assert row.state == "serving" and len(row.models) <= 64 and all(len(n) <= 120 for n in row.names("routed"))


def test_the_monitor_credential_reads_metrics_only_and_never_stands_for_a_key(tmp_path: Path) -> None:
    watch = keys.KeyWatch(tmp_path / "keys.json")
    keys.add("a", ("m",), watch.path)
    assert watch.poll() is True
    monitor = "m" * 43
    assert auth.authorize(watch, False, f"Bearer {monitor}", monitor) is None  # let in, as no key is
    for header in (None, "Bearer wrong", f"Bearer {monitor}x", monitor):
        with pytest.raises(auth.Unauthorized):
            auth.authorize(watch, False, header, monitor)
    with pytest.raises(auth.Unauthorized):  # not given the monitor (any path but GET /metrics): no key at all
        auth.authorize(watch, False, f"Bearer {monitor}")
