"""`ps`: what metralectl serves, read from the daemon's labelled containers (the source of truth)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from metralectl import store
from metralectl.endpoint import EngineClient
from metralectl.lifecycle.launch import LABEL_ENDPOINT
from metralectl.render import LABEL_RECIPE, LABEL_RUN_ID
from metralectl.runtime import ContainerInfo, DockerRuntime


@dataclass(frozen=True)
class Serving:
    recipe: str
    name: str
    owner: str
    state: str
    health: str
    uptime: str
    uptime_s: float | None
    endpoint: str
    run_id: str
    image: str
    image_revision: str | None


@dataclass(frozen=True)
class StatusReport:
    serving: list[Serving] = field(default_factory=list)
    degraded: str | None = None
    last_swap: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"serving": [asdict(s) for s in self.serving], "degraded": self.degraded, "last_swap": self.last_swap}


def _uptime(started_at: str | None) -> float | None:
    """Seconds since Docker's StartedAt ("2026-11-29T17:45:01.123456789Z"; zero time when never started)."""
    if not started_at or started_at.startswith("0001-"):
        return None
    try:
        stamp = datetime.strptime(started_at[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    return max(0.0, time.time() - stamp.timestamp())


def _human(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


def _health(container: ContainerInfo) -> str:
    url = container.labels.get(LABEL_ENDPOINT)
    if not container.running or not url:
        return "-"
    with EngineClient(url, timeout=1.0) as client:
        answer = client.health()
    if answer.status is None:
        return "no answer"
    return "ok" if answer.ready else f"{answer.status}"


def collect(runtime: DockerRuntime) -> StatusReport:
    containers = runtime.containers(mine=False)  # show every metralectl model on the box, each with its owner
    with ThreadPoolExecutor(max_workers=max(1, len(containers))) as pool:
        health = list(pool.map(_health, containers))
    revisions: dict[str, str | None] = {}
    serving = []
    for container, answer in zip(containers, health):
        if container.image not in revisions:
            revisions[container.image] = runtime.image_state(container.image).revision
        up = _uptime(container.started_at) if container.running else None
        serving.append(Serving(
            recipe=container.labels.get(LABEL_RECIPE, "?"), name=container.name, owner=container.owner or "?",
            state=container.status if container.exit_code is None else f"{container.status} ({container.exit_code})",
            health=answer, uptime=_human(up), uptime_s=up, endpoint=container.labels.get(LABEL_ENDPOINT, "-"),
            run_id=container.labels.get(LABEL_RUN_ID, "-"), image=container.image,
            image_revision=revisions[container.image]))
    from metralectl.lifecycle.swap import describe_journal, last_swap_summary

    return StatusReport(serving, describe_journal(), last_swap_summary())


__all__ = ["StatusReport", "Serving", "collect", "store"]
