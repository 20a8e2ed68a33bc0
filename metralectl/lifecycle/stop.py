"""`stop`: graceful stop, kill after a timeout, verify it is gone, and that memory came back; a multi-rank
deployment's every rank, on its node (lifecycle/deployment.py says where), the head first."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from metralectl import cancel
from metralectl.errors import MetralError, UsageError
from metralectl.lifecycle import deployment
from metralectl.lifecycle.deployment import Deployment, Runtimes
from metralectl.lifecycle.events import Listener, Step, Warning_, ignore
from metralectl.lifecycle.memory import MemoryWatch, NoMemoryWatch
from metralectl.core.labels import LABEL_OWNER, LABEL_RECIPE, LABEL_RUN_ID
from metralectl.core.render import owner
from metralectl.seams.docker.containers import ContainerInfo
from metralectl.seams.docker.protocol import ContainerRuntime


@dataclass(frozen=True)
class StopResult:
    name: str
    recipe: str
    exit_code: int | None
    killed: bool  # SIGTERM was not enough
    removed: bool
    stop_s: float
    memory: str  # "returned" | "not checked: ..." | "still held: ..."


def stop_containers(runtime: ContainerRuntime, containers: list[ContainerInfo], *, timeout_s: float = 30.0,
                    on_event: Listener = ignore, memory: MemoryWatch | None = None) -> list[StopResult]:
    watch = memory or NoMemoryWatch()
    results = []
    for container in containers:
        if not container.managed:
            raise MetralError(f"{container.name} is not metralectl's container; refusing to touch it")
        cancel.checkpoint()  # between containers: the ones stopped so far stay stopped
        on_event(Step("stopping", container.name))
        watch.before(container)
        started = time.monotonic()
        runtime.stop(container.id, timeout_s=timeout_s)
        after = runtime.inspect(container.id)
        killed = False
        if after is not None and after.running:  # the daemon's own SIGKILL did not land yet
            runtime.kill(container.id)
            killed = True
            runtime.wait_exit(container.id, 10.0)
            after = runtime.inspect(container.id)
        if after is not None and after.running:
            raise MetralError(f"{container.name} is still running after stop and kill",
                              "`metralectl ps` shows it; its process group may hold a process in uninterruptible "
                              "sleep (`ps -o pid,stat,cmd -g PGID`)" if container.image.startswith("process:")
                              else f"check the daemon: `docker inspect {container.name}`")
        elapsed = time.monotonic() - started
        exit_code = after.exit_code if after else None
        killed = killed or exit_code == 137 or elapsed >= timeout_s
        runtime.remove(container.id, force=True)
        removed = runtime.inspect(container.id) is None
        memory_state = watch.after(container)
        results.append(StopResult(container.name, container.labels.get(LABEL_RECIPE, "?"), exit_code, killed, removed,
                                  elapsed, memory_state))
    return results


def select(runtime: ContainerRuntime, recipe: str | None, all_: bool, *, offer_all: bool = True,
           missing_ok: bool = False) -> list[ContainerInfo]:
    """Our containers to act on: one recipe's, or all of them; foreign containers never. Without a recipe:
    the one running, else the only one there is (a kept failed start); several is a question for the user.
    `offer_all`: the command has --all to suggest; `missing_ok`: no container of the recipe is an empty answer."""
    ours = runtime.containers()
    if all_:
        return ours
    if recipe is None:
        running = [c for c in ours if c.running]
        if len(running) == 1:
            return running
        if len(ours) <= 1:
            return ours
        names = ", ".join(c.labels.get(LABEL_RECIPE, c.name) for c in ours)
        served = sum(1 for c in ours if c.running)
        what = f"{served} models are served" if served > 1 else f"{len(ours)} metralectl engines exist"
        raise UsageError(f"{what} ({names}); name one" + (" or use --all" if offer_all else ""),
                         "`metralectl stop RECIPE` stops one, `metralectl stop --all` every one" if offer_all
                         else "name the recipe (`metralectl ps` lists them)")
    chosen = [c for c in ours if c.labels.get(LABEL_RECIPE) == recipe or c.name == recipe]
    if not chosen and not missing_ok:
        raise MetralError(f"no metralectl container serves {recipe!r}", "`metralectl ps` lists them")
    return chosen


class RemoteMemory:
    """NVML is read on this machine only: another node's GPU memory is not checked from here."""

    def before(self, container: ContainerInfo) -> None:
        pass

    def after(self, container: ContainerInfo) -> str:
        return "not checked (another node; `metralectl doctor` there checks it)"


@dataclass(frozen=True)
class RankStop:
    rank: int
    role: str
    endpoint: str
    container: str
    result: StopResult | None
    error: str | None  # why it could not be stopped ("" when it was already gone)


def stop_deployment(dep: Deployment, runtimes: Runtimes, *, timeout_s: float = 30.0, on_event: Listener = ignore,
                    memory_for: Callable[[ContainerRuntime], MemoryWatch] | None = None) -> list[RankStop]:
    """Stop every rank, the head first (clients then get refused connections rather than hung requests);
    forget the deployment once no rank is left anywhere."""
    out = []
    for record in sorted(dep.ranks, key=lambda r: r.rank):
        runtime = runtimes.get(record)
        if runtime is None:
            error = runtimes.errors[record.endpoint]
            out.append(RankStop(record.rank, record.role, record.endpoint, record.container, None,
                                f"unreachable: {error.message}"))
            continue
        info = runtime.inspect(record.container_id) if record.container_id else None
        if info is None:
            info = runtime.inspect(record.container)
            if info is not None and info.labels.get(LABEL_RUN_ID) not in (dep.run_id, None):
                info = None  # a newer run's container of the same name: not this deployment's
        if info is None:
            out.append(RankStop(record.rank, record.role, record.endpoint, record.container, None, ""))
            continue
        if info.labels.get(LABEL_OWNER) != owner():
            out.append(RankStop(record.rank, record.role, record.endpoint, record.container, None,
                                f"belongs to {info.labels.get(LABEL_OWNER)}; not touched"))
            continue
        watch = memory_for(runtime) if memory_for is not None else NoMemoryWatch()
        [result] = stop_containers(runtime, [info], timeout_s=timeout_s, on_event=on_event, memory=watch)
        out.append(RankStop(record.rank, record.role, record.endpoint, record.container, result, None))
    if all(s.error == "" or (s.result is not None and s.result.removed) for s in out):
        deployment.forget(dep.recipe, dep.run_id)
    return out


def stop_deployments_on(runtime: ContainerRuntime, on_event: Listener = ignore) -> None:
    """Before a --replace on this daemon: stop, on every node, the recorded deployments that have a rank here."""
    found = [d for d in deployment.load_all() if any(r.endpoint == runtime.endpoint.url for r in d.ranks)]
    if not found:
        return
    with Runtimes(runtime) as runtimes:
        for dep in found:
            for stopped in stop_deployment(dep, runtimes, on_event=on_event):
                if stopped.error:
                    on_event(Warning_(f"rank {stopped.rank} of {dep.recipe} on {stopped.endpoint}: {stopped.error}"))
                elif stopped.result is not None:
                    on_event(Step("replaced", f"{stopped.container} (rank {stopped.rank} of {dep.recipe})"))
