"""Multi-rank deployments on disk: which container of which rank runs on which node's Docker daemon.

A multi-rank launch spans Docker daemons, so no single daemon's labels can say what belongs
together. `run` writes one record per deployment, atomically, under
`$METRALE_HOME/state/deployments/<recipe>.json` BEFORE it starts anything (state "starting"), marks
it "ready" once serving, and removes it when the launch fails and its containers are gone; `ps`,
`logs --rank N` and `stop` read it to reach every rank. The daemons stay the source of truth for
what runs: the record only says where to look.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from metralectl.seams import store
from metralectl.errors import MetralError
from metralectl.seams.docker.endpoints import Endpoint, endpoint_for
from metralectl.seams.docker.protocol import ContainerRuntime
from metralectl.seams.docker.runtime import open_runtime
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class RankRecord:
    rank: int
    role: str  # "head" | "worker"
    endpoint: str  # the Docker endpoint URL
    endpoint_source: str  # "default", "DOCKER_HOST", "context spark2", "--worker", ...
    endpoint_spec: str  # what the operator named (context or URL), "" for the current endpoint
    node: str  # the daemon's host name
    container: str
    container_id: str = ""
    port: int = 0
    roce_address: str = ""

    def endpoint_value(self) -> Endpoint:
        """The endpoint again, TLS material included (a context is read anew, as the CLI would)."""
        if self.endpoint_spec:
            try:
                return endpoint_for(self.endpoint_spec, self.role)
            except MetralError:
                pass
        return Endpoint(self.endpoint, self.endpoint_source, None, self.endpoint_spec)


@dataclass(frozen=True)
class Deployment:
    run_id: str
    recipe: str
    state: str  # "starting" | "ready" | "failed" (kept with --keep-failed)
    url: str
    roce_interface: str
    master_addr: str
    master_port: int
    ranks: tuple[RankRecord, ...]
    created_at: float
    sets: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def rank(self, index: int) -> RankRecord:
        for record in self.ranks:
            if record.rank == index:
                return record
        raise MetralError(f"{self.recipe} has no rank {index} (ranks: {', '.join(str(r.rank) for r in self.ranks)})")

    def with_state(self, state: str) -> Deployment:
        return replace(self, state=state)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Deployment | None:
        try:
            ranks = tuple(RankRecord(**r) for r in data["ranks"])
            return cls(run_id=str(data["run_id"]), recipe=str(data["recipe"]), state=str(data["state"]),
                       url=str(data["url"]), roce_interface=str(data["roce_interface"]),
                       master_addr=str(data["master_addr"]), master_port=int(data["master_port"]), ranks=ranks,
                       created_at=float(data["created_at"]), sets=tuple(data.get("sets") or ()),
                       notes=tuple(data.get("notes") or ()))
        except (KeyError, TypeError, ValueError):
            return None


def directory() -> Path:
    path = store.state_dir() / "deployments"
    path.mkdir(parents=True, exist_ok=True)
    return path


def path_for(recipe: str) -> Path:
    return directory() / f"{_SAFE.sub('_', recipe)}.json"


def save(deployment: Deployment) -> None:
    store.write_json(path_for(deployment.recipe), deployment.to_json())


def load_all() -> list[Deployment]:
    out = []
    for file in sorted(directory().glob("*.json")):
        found = Deployment.from_json(store.read_json(file))
        if found is not None:
            out.append(found)
    return out


def find(recipe: str) -> Deployment | None:
    found = Deployment.from_json(store.read_json(path_for(recipe)))
    return found if found is not None and found.recipe == recipe else None


def forget(recipe: str, run_id: str | None = None) -> None:
    """Remove the record (only that run's, when run_id is given: a newer launch keeps its own)."""
    path = path_for(recipe)
    if run_id is not None:
        current = Deployment.from_json(store.read_json(path))
        if current is not None and current.run_id != run_id:
            return
    path.unlink(missing_ok=True)


def forget_gone(runtimes: dict[str, ContainerRuntime]) -> None:
    """Drop the records whose containers are all gone from these daemons (by endpoint URL), after a --replace."""
    for dep in load_all():
        if all(r.endpoint in runtimes and runtimes[r.endpoint].inspect(r.container_id or r.container) is None
               for r in dep.ranks):
            forget(dep.recipe, dep.run_id)


class Runtimes:
    """One runtime per endpoint URL, opened on first use; errors are kept per endpoint. A context manager:
    it closes the runtimes it opened itself, never the `local` one it was handed (its caller owns that)."""

    def __init__(self, local: ContainerRuntime | None = None) -> None:
        self._open: dict[str, ContainerRuntime] = {}
        self._borrowed = local
        self.errors: dict[str, MetralError] = {}
        if local is not None:
            self._open[local.endpoint.url] = local

    def get(self, record: RankRecord) -> ContainerRuntime | None:
        if record.endpoint in self._open:
            return self._open[record.endpoint]
        if record.endpoint in self.errors:
            return None
        try:
            runtime = open_runtime(record.endpoint_value())
        except MetralError as exc:
            self.errors[record.endpoint] = exc
            return None
        self._open[record.endpoint] = runtime
        return runtime

    def require(self, record: RankRecord) -> ContainerRuntime:
        runtime = self.get(record)
        if runtime is None:
            raise self.errors[record.endpoint]
        return runtime

    def close(self) -> None:
        for runtime in self._open.values():
            if runtime is not self._borrowed:
                runtime.close()
        self._open.clear()

    def __enter__(self) -> Runtimes:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
