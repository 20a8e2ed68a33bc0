"""`ps`: what metralectl serves, read from the daemon's labelled containers (the source of truth)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from metralectl.seams import store
from metralectl.seams.endpoint import health_once
from metralectl.core.labels import LABEL_ENDPOINT, LABEL_RECIPE, LABEL_RUN_ID
from metralectl.seams.docker.containers import ContainerInfo
from metralectl.seams.docker.protocol import ContainerRuntime
from metralectl.errors import MetralError
from metralectl.lifecycle.engine_token import engine_headers
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
    rank: int | None = None  # multi-rank deployments: which rank this container is
    node: str | None = None  # ... and the Docker endpoint of its node
    gpu_ids: tuple[int, ...] | None = None  # the GPUs a box of several placed it on (its gpu-ids label)

    @property
    def host_process(self) -> bool:
        """Whether this engine runs as a process on this host (seams/process: its image is `process:<program>`),
        not in a container."""
        from metralectl.lifecycle.local_runtime import PROCESS_IMAGE_PREFIX

        return self.image.startswith(PROCESS_IMAGE_PREFIX)


@dataclass(frozen=True)
class StatusReport:
    serving: list[Serving] = field(default_factory=list)
    degraded: str | None = None
    last_swap: str | None = None
    notes: list[str] = field(default_factory=list)  # multi-rank: a rank down, a node unreachable
    last_swap_record: dict[str, Any] | None = None  # the same swap, as fields (swap_journal.last_swap_record)

    def to_json(self) -> dict[str, Any]:
        return {"serving": [asdict(s) for s in self.serving], "degraded": self.degraded,
                "last_swap": self.last_swap_record, "notes": list(self.notes)}


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
    try:  # llama-server's and Metrale's /health are open; an engine that asks the token for it gets it
        headers = engine_headers(container.labels)
    except MetralError as exc:
        return f"engine token: {exc.message}"
    answer = health_once(url, timeout=1.0, headers=headers)
    if answer.status is None:
        return "no answer"
    if answer.ready:
        return "ok"
    from metralectl.core.contract import Readiness
    from metralectl.lifecycle.readiness import classify_health

    state = classify_health(answer, Readiness())
    return state.describe() if state.kind in ("loading", "faulted") else f"{answer.status}"


def _placed(labels: dict[str, str]) -> tuple[int, ...] | None:
    """The GPUs its gpu-ids label names (core/placement.py), read strictly: a label that is anyone's on a shared
    daemon, shown only as the indices it holds (anything else: None)."""
    from metralectl.core.labels import LABEL_GPU_IDS
    from metralectl.core.placement import parse_ids

    return parse_ids(labels.get(LABEL_GPU_IDS), SHOWN_GPUS)


SHOWN_GPUS = 1024  # a bound for reading the label (no box has as many): `ps` shows it, placement judges it per box


def _row(runtime: ContainerRuntime, container: ContainerInfo, answer: str, revisions: dict[str, str | None],
         rank: int | None = None, node: str | None = None) -> Serving:
    key = f"{runtime.endpoint.url} {container.image}"
    if key not in revisions:
        revisions[key] = runtime.image_state(container.image).revision
    up = _uptime(container.started_at) if container.running else None
    return Serving(
        recipe=container.labels.get(LABEL_RECIPE, "?"), name=container.name, owner=container.owner or "?",
        state=container.status if container.exit_code is None else f"{container.status} ({container.exit_code})",
        health=answer, uptime=_human(up), uptime_s=up, endpoint=container.labels.get(LABEL_ENDPOINT, "-"),
        run_id=container.labels.get(LABEL_RUN_ID, "-"), image=container.image,
        image_revision=revisions[key], rank=rank, node=node, gpu_ids=_placed(container.labels))


def collect(runtime: ContainerRuntime) -> StatusReport:
    containers = runtime.containers(mine=False)  # show every metralectl model on the box, each with its owner
    with ThreadPoolExecutor(max_workers=max(1, len(containers))) as pool:
        health = list(pool.map(_health, containers))
    revisions: dict[str, str | None] = {}
    serving = [_row(runtime, container, answer, revisions) for container, answer in zip(containers, health)]
    notes = _deployments(runtime, serving, revisions)
    from metralectl.lifecycle.swap_journal import describe_journal, last_swap_record, last_swap_summary

    swap = last_swap_record()
    docker_error = getattr(runtime, "docker_error", None)  # this machine's runtime without Docker (local_runtime)
    if docker_error is not None:
        notes.insert(0, f"Docker is not reachable ({docker_error.message}): only engines run as host processes "
                        "are shown")
    return StatusReport(serving, describe_journal(), last_swap_summary(swap), notes, swap)


def _deployments(local: ContainerRuntime, serving: list[Serving], revisions: dict[str, str | None]) -> list[str]:
    """Multi-rank deployments: mark the local rows with their rank, add the other nodes' ranks, say what is wrong.

    Runs only when `run --worker` recorded a deployment (state/deployments/); otherwise nothing changes.
    """
    from metralectl.lifecycle import deployment

    found = deployment.load_all()
    if not found:
        return []
    notes: list[str] = []
    with deployment.Runtimes(local) as runtimes:
        for dep in found:
            states: dict[int, str] = {}
            reachable = True
            for record in dep.ranks:
                where = "local" if record.endpoint == local.endpoint.url else record.endpoint
                if record.endpoint == local.endpoint.url:
                    for i, row in enumerate(serving):
                        if row.name == record.container:
                            serving[i] = replace(row, rank=record.rank, node=where)
                            states[record.rank] = row.state
                    continue
                runtime = runtimes.get(record)
                if runtime is None:
                    reachable = False
                    states[record.rank] = "unreachable"
                    error = runtimes.errors[record.endpoint]
                    serving.append(Serving(dep.recipe, record.container, "?", "unreachable", "-", "-", None, "-",
                                           dep.run_id, "?", None, record.rank, where))
                    notes.append(f"{dep.recipe}: rank {record.rank} ({record.role}) on {record.endpoint} is unreachable: "
                                 f"{error.message}")
                    continue
                info = runtime.inspect(record.container_id or record.container) or runtime.inspect(record.container)
                if info is None:
                    states[record.rank] = "gone"
                    serving.append(Serving(dep.recipe, record.container, "?", "gone", "-", "-", None, "-", dep.run_id,
                                           "?", None, record.rank, where))
                    continue
                states[record.rank] = info.status
                serving.append(_row(runtime, info, _health(info), revisions, record.rank, where))
            down = [r for r in dep.ranks if not states.get(r.rank, "gone").startswith("running")]
            if reachable and len(down) == len(dep.ranks) and all(states.get(r.rank, "gone") == "gone" for r in down):
                deployment.forget(dep.recipe, dep.run_id)  # nothing of it is left anywhere: a stale record
                continue
            if down and len(down) < len(dep.ranks) and dep.state != "starting":
                names = ", ".join(f"rank {r.rank} ({r.role}, {states.get(r.rank, 'unknown')})" for r in down)
                notes.append(f"{dep.recipe}: {names} is not running: the head's requests hang or fail until every rank "
                             f"is back; `metralectl stop {dep.recipe}` then run it again")
    return notes


__all__ = ["StatusReport", "Serving", "collect", "store"]
