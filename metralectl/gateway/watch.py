"""The gateways of this box as `top`, the dashboard and the page show them: each record (state.py), and for one whose
process runs its own /metrics, read through the seams' HTTP client (loopback or a literal address the record names,
0.5 s at most each) and turned into a row by telemetry/gateway_view.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from metralectl.gateway import state

if TYPE_CHECKING:
    from metralectl.telemetry.gateway_view import GatewayRow

METRICS_TIMEOUT_S = 0.5


def observe(timeout: float = METRICS_TIMEOUT_S) -> list[GatewayRow]:
    from metralectl.telemetry.gateway_view import gateway_row

    rows = []
    for record in state.listed():
        running = bool(record.pop("running"))
        if not running:
            record.pop("monitor", None)
            rows.append(gateway_row(record, running=False))
            continue
        if not record.get("here"):  # a record's claim about another host: never asked, its credential never sent
            record.pop("monitor", None)
            rows.append(gateway_row(record, running=True, failure="not an address of this machine: not asked"))
            continue
        text, failure, needs_key = _metrics(record["url"], timeout, record.pop("monitor", None))
        rows.append(gateway_row(record, running=True, text=text, failure=failure, needs_key=needs_key))
    return rows


def _metrics(url: str, timeout: float, monitor: str | None) -> tuple[str | None, str | None, bool]:
    """(text, why not, whether a key is needed); `monitor`: the record's credential for /metrics (keys in force)."""
    from metralectl.seams.bounded import METRICS_LIMIT
    from metralectl.seams.httpclient import Failed, get_once

    match = state.URL_RE.fullmatch(url)
    if match is None:
        return None, "not a gateway address", False
    try:
        reply = get_once(match.group(1).strip("[]"), int(match.group(2)), "/metrics", timeout,
                         limit=METRICS_LIMIT + 1, headers={"Authorization": f"Bearer {monitor}"} if monitor else None)
    except Failed as exc:
        return None, f"not answering ({exc.kind})", False
    if reply.status == 401:
        return None, None, True
    if reply.status != 200:
        return None, f"/metrics answered {reply.status}", False
    if len(reply.body) > METRICS_LIMIT:
        return None, "/metrics is larger than a gateway's", False
    return reply.body.decode("utf-8", "replace"), None, False
