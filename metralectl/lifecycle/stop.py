"""`stop`: graceful stop, kill after a timeout, verify it is gone, and that memory came back."""

from __future__ import annotations

import time
from dataclasses import dataclass

from metralectl import cancel
from metralectl.errors import MetralError
from metralectl.lifecycle.events import Listener, Step, ignore
from metralectl.lifecycle.memory import MemoryWatch, NoMemoryWatch
from metralectl.core.labels import LABEL_RECIPE
from metralectl.seams.container_runtime import ContainerRuntime
from metralectl.seams.docker_runtime import ContainerInfo


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
                              f"check the daemon: `docker inspect {container.name}`")
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
        raise MetralError(f"several metralectl containers exist ({names}); name one" + (" or use --all" if offer_all else ""),
                          "`metralectl ps` lists them")
    chosen = [c for c in ours if c.labels.get(LABEL_RECIPE) == recipe or c.name == recipe]
    if not chosen and not missing_ok:
        raise MetralError(f"no metralectl container serves {recipe!r}", "`metralectl ps` lists them")
    return chosen
