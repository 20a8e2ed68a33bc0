"""`logs` of a multi-rank deployment: one rank's container, on its node's Docker daemon (docs/multinode.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from metralectl.errors import MetralError

if TYPE_CHECKING:
    import threading

    from metralectl.lifecycle.deployment import Deployment


def deployment_for_logs(recipe: str | None, rank: int | None) -> Deployment | None:
    """The recorded deployment whose log is meant; None when none is (the single-node path)."""
    from metralectl.lifecycle import deployment

    if recipe is not None:
        dep = deployment.find(recipe)
    else:
        found = deployment.load_all()
        if len(found) > 1:
            raise MetralError(f"several multi-rank deployments ({', '.join(d.recipe for d in found)}); name one",
                              "`metralectl logs RECIPE --rank N`")
        dep = found[0] if found else None
    if dep is None and rank not in (None, 0):
        raise MetralError("--rank is for multi-rank deployments (`run RECIPE --worker NODE`); none is recorded"
                          + (f" for {recipe}" if recipe else ""), "`metralectl ps` lists what runs")
    return dep


def rank_log(dep: Deployment, rank: int, *, follow: bool, tail: int,
             stop: threading.Event | None = None) -> Iterator[str]:
    from metralectl.lifecycle import deployment

    record = dep.rank(rank)
    with deployment.Runtimes() as runtimes:
        runtime = runtimes.require(record)
        container = (runtime.inspect(record.container_id) if record.container_id else None) or runtime.inspect(record.container)
        if container is None:
            raise MetralError(f"rank {record.rank} of {dep.recipe} ({record.container} on {record.endpoint}) is gone",
                              f"`metralectl stop {dep.recipe}` cleans up; its start-up log is under $METRALE_HOME/logs/")
        if follow:
            yield from runtime.follow_logs(container.id, tail=tail, stop=stop)
        else:
            yield from runtime.log_tail(container.id, tail)
