"""`logs` beyond the served container: a multi-rank deployment's rank, on its node's Docker daemon
(docs/multinode.md), and the kept log of a start that failed (its container is gone)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
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


@dataclass(frozen=True)
class FailedStart:
    run_id: str
    recipe: str
    cause: str
    at: float
    log: Path


def last_failed_start(recipe: str | None = None) -> FailedStart | None:
    """The newest failed start (of `recipe`, or of any) whose log metralectl kept (runs.jsonl + logs/)."""
    from metralectl.seams import store

    for entry in reversed(store.read_jsonl(store.state_dir() / "runs.jsonl")):
        if not isinstance(entry, dict) or entry.get("outcome") != "failed":
            continue
        if recipe is not None and entry.get("recipe") != recipe:
            continue
        log = store.logs_dir() / f"{entry.get('run_id')}-{entry.get('recipe')}.log"
        if log.is_file():
            return FailedStart(str(entry["run_id"]), str(entry["recipe"]), str(entry.get("cause", "")),
                               float(entry.get("at") or 0.0), log)
    return None


def failed_start_lines(found: FailedStart, tail: int) -> Iterator[str]:
    lines = found.log.read_text(errors="replace").splitlines()
    yield from lines[-tail:] if tail > 0 else lines


def failed_start_log(recipe: str | None, tail: int, served: list[str] | None = None) -> Iterator[str]:
    """No container: the kept log of the last failed start (of `recipe`), announced on stderr as such.
    `served`: what serves now (None: `--last-failed`, which asks for that log only)."""
    import sys
    import time

    found = last_failed_start(recipe)
    if found is None:
        of = f" of {recipe}" if recipe is not None else ""
        if served is None:
            raise MetralError(f"no failed start{of} was kept", "`metralectl logs` shows the served model's log")
        from metralectl.app.not_served import not_served
        from metralectl.errors import RUN_ONE

        run = RUN_ONE if recipe is None else f"`metralectl run {recipe}` serves it; `metralectl ps` shows what runs"
        raise not_served(recipe, served, f"{run} (no failed start{of} was kept either)")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(found.at))
    print(f"metralectl: no container serves {found.recipe}; this is the log of its failed start at {when} "
          f"(run {found.run_id}, {found.cause}), kept in {found.log}", file=sys.stderr)
    yield from failed_start_lines(found, tail)
