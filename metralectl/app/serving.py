"""Changing what is served, once: `run`, `swap`, `stop`, `ps`, `logs` for every front end, in one place.

The CLI builds a `Change` from its flags, the dashboard from the chosen action, the agent from a page's or
a peer's POST body (app/serving_change.py: frozen, checked); each hands it, with an event listener, to a
`Serving`, which does the whole sequence in the caller's process: catalog and --set overrides, the
machine's lifecycle lock, this machine's runtime (its Docker containers and its host processes, closed on
every path), the repair of an interrupted swap, then the lifecycle's launch / swap / stop. The lock is the
one mutual exclusion between them: a CLI command, the dashboard, an agent's job and a peer's benchmark unit
never change the box at once, and whoever comes second is told who holds it (store.busy_because).
Cancelling is the caller's: Ctrl-C in the CLI, a cancel token bound to the thread elsewhere
(metralectl/cancel.py).

Events are the lifecycle's (lifecycle/events.py); results are the lifecycle's values (`Launched`,
`LaunchedMulti`, `SwapResult`) and `Stopped`, what a stop did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from metralectl.app.serving_change import Change, MultiRank
from metralectl.errors import ExitCode, MetralError, UsageError
from metralectl.lifecycle.events import Listener, ignore
from metralectl.lifecycle.stop import StopResult

if TYPE_CHECKING:
    import threading

    from metralectl.core.catalog import Catalog
    from metralectl.core.recipe import Recipe
    from metralectl.lifecycle.launch import Launched
    from metralectl.lifecycle.memory import MemoryWatch
    from metralectl.lifecycle.deployment import Deployment
    from metralectl.lifecycle.multinode import LaunchedMulti
    from metralectl.lifecycle.status import StatusReport
    from metralectl.lifecycle.swap import SwapResult
    from metralectl.seams.docker.containers import ContainerInfo
    from metralectl.seams.docker.protocol import ContainerRuntime

LockFactory = Callable[[str], AbstractContextManager[Any]]


@dataclass(frozen=True)
class RankStopped:
    """One rank of a multi-rank deployment, stopped on its node (or why not)."""

    recipe: str  # the deployment's
    rank: int
    role: str
    endpoint: str
    container: str
    result: StopResult | None
    error: str | None  # why it could not be stopped ("" when it was already gone)


@dataclass(frozen=True)
class Stopped:
    """What a stop did: single-node containers, and every rank of the multi-rank deployments it named."""

    containers: tuple[StopResult, ...] = ()
    ranks: tuple[RankStopped, ...] = ()
    why_nothing: str = ""  # nothing stopped: errors.NotServed's words (what serves now, when a recipe was named)

    @property
    def nothing(self) -> bool:
        return not self.containers and not self.ranks

    @property
    def failures(self) -> tuple[RankStopped, ...]:
        return tuple(r for r in self.ranks if r.error)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"stopped": [asdict(r) for r in self.containers], "ranks": [asdict(r) for r in self.ranks]}
        if self.nothing:
            out["note"] = "nothing to stop"
            if self.why_nothing:
                out["why"] = self.why_nothing
        return out


if TYPE_CHECKING:
    # what a change gives back: run → Launched (LaunchedMulti for several ranks), swap → SwapResult, stop → Stopped
    ChangeResult = Launched | LaunchedMulti | SwapResult | Stopped


class StopIncomplete(MetralError):
    """Not every rank could be stopped; `stopped` says what was."""

    exit_code = ExitCode.FAILED

    def __init__(self, stopped: Stopped) -> None:
        super().__init__("not every rank could be stopped: " + "; ".join(
            f"rank {r.rank} of {r.recipe}: {r.error}" for r in stopped.failures),
            "the deployment stays recorded; `metralectl stop RECIPE` again once the node answers")
        self.stopped = stopped


def result_json(result: ChangeResult) -> dict[str, Any]:
    """A change's result as the agent's job records it."""
    return result.to_json() if isinstance(result, Stopped) else asdict(result)


def docker_runtime(need_docker: bool = True) -> ContainerRuntime:
    """This machine's runtime: its Docker daemon's containers and its host processes (lifecycle/local_runtime.py)."""
    from metralectl.lifecycle.local_runtime import open_local

    return open_local(need_docker=need_docker)


def node_runtime(spec: str, role: str) -> ContainerRuntime:
    """Another node's Docker daemon, from what the operator named (a context, ssh://, tcp://)."""
    from metralectl.seams.docker.endpoints import endpoint_for
    from metralectl.seams.docker.runtime import open_runtime

    return open_runtime(endpoint_for(spec, role))


def memory_watch(runtime: ContainerRuntime) -> MemoryWatch:
    from metralectl.lifecycle.memory import NvmlMemoryWatch

    return NvmlMemoryWatch(runtime)


def _load_catalog() -> Catalog:
    from metralectl.core.catalog import load_catalog

    return load_catalog()


class Serving:
    """The changes, done here. `lock=None` (the default) takes the machine's lifecycle lock per change;
    `lock_held=True` when the caller holds it already (the agent's job runner)."""

    def __init__(self, *, catalog: Callable[[], Catalog] | None = None,
                 runtime: Callable[[], ContainerRuntime] | None = None, lock: LockFactory | None = None,
                 lock_held: bool = False, lock_note: str = "",
                 memory: Callable[[ContainerRuntime], MemoryWatch] | None = None) -> None:
        self._catalog_loader = catalog
        self._runtime_factory = runtime
        self._lock_factory = lock
        self._lock_held = lock_held
        self._lock_note = lock_note
        self._memory_factory = memory

    # -- the pieces every change shares --------------------------------------------------------------
    def catalog(self) -> Catalog:
        return (self._catalog_loader or _load_catalog)()

    def runtime(self, *, need_docker: bool = True) -> ContainerRuntime:
        """The runtime a change acts through (`need_docker` False: a host process's launch, which needs none)."""
        if self._runtime_factory is not None:
            return self._runtime_factory()
        return docker_runtime(need_docker)

    def _memory(self, runtime: ContainerRuntime) -> MemoryWatch:
        return (self._memory_factory or memory_watch)(runtime)

    def _locked(self, what: str) -> AbstractContextManager[Any]:
        if self._lock_held:
            return nullcontext()
        if self._lock_factory is None:
            from metralectl.seams.store import lifecycle_lock

            return lifecycle_lock(f"{what} {self._lock_note}".strip())
        return self._lock_factory(f"{what} {self._lock_note}".strip())

    def resolve(self, change: Change, catalog: Catalog | None = None) -> Recipe:
        from metralectl.core.overrides import apply_sets

        catalog = catalog or self.catalog()
        if change.recipe is None:
            raise UsageError(f"which recipe? a {change.kind} needs one")
        return apply_sets(catalog, catalog.recipe(change.recipe), list(change.sets))

    def apply(self, change: Change, on_event: Listener) -> ChangeResult:
        return {"run": self.run, "swap": self.swap, "stop": self.stop}[change.kind](change, on_event)

    # -- the changes ---------------------------------------------------------------------------------
    def run(self, change: Change, on_event: Listener) -> Launched | LaunchedMulti:
        from metralectl.lifecycle.launch import launch
        from metralectl.lifecycle.swap import repair_if_needed

        _expect(change, "run")
        catalog = self.catalog()
        recipe = self.resolve(change, catalog)
        if change.multi is not None:
            return self._run_multi(change, change.multi, recipe, catalog, on_event)
        with self._locked(f"run {recipe.name}"), self.runtime(need_docker=recipe.runtime != "process") as runtime:
            repair_if_needed(runtime, catalog, on_event=on_event)
            return launch(recipe, catalog, runtime, options=change.options, on_event=on_event)

    def _run_multi(self, change: Change, multi: MultiRank, recipe: Recipe, catalog: Catalog,
                   on_event: Listener) -> LaunchedMulti:
        from metralectl.lifecycle.launch_multi import launch_multi
        from metralectl.lifecycle.multinode import MultiOptions
        from metralectl.lifecycle.swap import repair_if_needed

        if not recipe.multi_rank:
            raise UsageError(f"{recipe.name} is a single-node recipe; --worker/--head are for multi-rank recipes")
        options = MultiOptions(roce_interface=multi.roce_interface, master_addr=multi.master_addr,
                               first_request_timeout_s=multi.first_request_timeout_s, rdma=multi.rdma,
                               rdma_device=multi.rdma_device)
        with self._locked(f"run {recipe.name}"), \
                (node_runtime(multi.head, "head") if multi.head else self.runtime()) as head, \
                node_runtime(multi.worker, "worker") as worker:
            if not multi.head:  # an interrupted swap is this machine's to repair
                repair_if_needed(head, catalog, on_event=on_event)
            return launch_multi(recipe, catalog, head, worker, options=change.options,
                                multi=options, on_event=on_event)

    def swap(self, change: Change, on_event: Listener) -> SwapResult:
        from metralectl.lifecycle.swap import repair_if_needed, swap, swap_after_interruption

        _expect(change, "swap")
        catalog = self.catalog()
        recipe = self.resolve(change, catalog)  # refused here, before anything is released
        with self._locked(f"swap to {recipe.name}"), self.runtime() as runtime:
            resumed = swap_after_interruption(recipe, list(change.sets), catalog, runtime, on_event=on_event,
                                              options=change.options)
            if resumed is not None:
                return resumed
            repair_if_needed(runtime, catalog, on_event=on_event)
            return swap(recipe, list(change.sets), catalog, runtime, on_event=on_event,
                        options=change.options, drain_timeout_s=change.drain_timeout_s, memory=self._memory(runtime))

    def stop(self, change: Change, on_event: Listener) -> Stopped:
        """Stop what the change names (select_stop): a multi-rank deployment on every node, the head first;
        single-node containers here. StopIncomplete (after stopping what it could) when a rank could not be."""
        from metralectl.lifecycle import deployment
        from metralectl.lifecycle.stop import RemoteMemory, stop_containers, stop_deployment

        _expect(change, "stop")
        ranks: list[RankStopped] = []
        with self._locked(f"stop {change.recipe or ''}".strip()), self.runtime() as runtime:
            deployments, chosen = select_stop(runtime, change)
            local_url = runtime.endpoint.url
            with deployment.Runtimes(runtime) as runtimes:  # closes the other nodes' runtimes, not this one
                for dep in deployments:
                    for r in stop_deployment(dep, runtimes, timeout_s=change.stop_timeout_s, on_event=on_event,
                                             memory_for=lambda rt: self._memory(rt) if _here(rt, local_url)
                                             else RemoteMemory()):
                        ranks.append(RankStopped(dep.recipe, r.rank, r.role, r.endpoint, r.container, r.result,
                                                 r.error))
            containers = stop_containers(runtime, chosen, timeout_s=change.stop_timeout_s,
                                         on_event=on_event, memory=self._memory(runtime)) if chosen else []
            why = "" if deployments or chosen else _why_nothing(runtime, change)
        stopped = Stopped(tuple(containers), tuple(ranks), why)
        if stopped.failures:
            raise StopIncomplete(stopped)
        return stopped

    # -- reads -----------------------------------------------------------------------------------------
    def ps(self, *, repair: bool = False, on_event: Listener = ignore) -> StatusReport:
        """What is served (every metralectl model on the box); `repair`: finish or undo an interrupted swap first."""
        from metralectl.lifecycle import status

        with self.runtime() as runtime:
            if repair:
                from metralectl.lifecycle.swap import repair_if_needed

                with self._locked("repair"):
                    repair_if_needed(runtime, self.catalog(), on_event=on_event)
            return status.collect(runtime)

    def logs(self, recipe: str | None = None, *, rank: int | None = None, follow: bool = False, tail: int = 200,
             container: str | None = None, stop: threading.Event | None = None) -> Iterator[str]:
        """The engine's log lines: a named container's, a multi-rank deployment's rank, or the served model's.
        With `follow`, until the container exits (or `stop` is set)."""
        from metralectl.app.serving_logs import deployment_for_logs, rank_log

        if container is None and (rank is not None or recipe is not None):
            dep = deployment_for_logs(recipe, rank)
            if dep is not None:
                yield from rank_log(dep, rank or 0, follow=follow, tail=tail, stop=stop)
                return
        with self.runtime() as runtime:
            if container is None:
                from metralectl.lifecycle.stop import select

                chosen = select(runtime, recipe, all_=False, offer_all=False, missing_ok=True)
                if not chosen:
                    from metralectl.app.serving_logs import failed_start_log
                    from metralectl.core.labels import LABEL_RECIPE

                    served = [c.labels.get(LABEL_RECIPE, c.name) for c in runtime.containers() if c.running]
                    yield from failed_start_log(recipe, tail, served)
                    return
                container = chosen[0].id
            if follow:
                yield from runtime.follow_logs(container, tail=tail, stop=stop)
            else:
                yield from runtime.log_tail(container, tail)


def _here(runtime: ContainerRuntime, local_url: str) -> bool:
    """This machine's runtime (its GPU memory is checked after a stop): the local one, or its host processes."""
    return runtime.endpoint.url in (local_url, "process://local")


def _why_nothing(runtime: ContainerRuntime, change: Change) -> str:
    """A stop that found nothing to stop: done (exit 0), saying what serves; a name that is no recipe (nor
    one of our containers) is refused as `run` refuses it (exit 64)."""
    from metralectl.app.not_served import not_served
    from metralectl.core.labels import LABEL_RECIPE

    served = [c.labels.get(LABEL_RECIPE, c.name) for c in runtime.containers() if c.running]
    answer = not_served(None if change.all_ else change.recipe, served)
    if answer.exit_code is not ExitCode.FAILED:
        raise answer
    return answer.message


def _expect(change: Change, kind: str) -> None:
    if change.kind != kind:
        raise UsageError(f"a {change.kind} change handed to {kind}")


def select_stop(runtime: ContainerRuntime, change: Change) -> tuple[list[Deployment], list[ContainerInfo]]:
    """What a stop acts on: the multi-rank deployments it names (every rank goes, on its node), and our
    single-node containers here (lifecycle.stop.select). The dashboard's plan shows this same choice."""
    from metralectl.lifecycle import deployment
    from metralectl.lifecycle.stop import select

    found = deployment.load_all()
    if change.all_:
        deployments = found
    elif change.recipe is not None:
        deployments = [d for d in found if d.recipe == change.recipe]
    else:  # no name: the deployment, when it is all that runs here
        running = [c.name for c in runtime.containers() if c.running]
        ours = {r.container for d in found for r in d.ranks if r.endpoint == runtime.endpoint.url}
        deployments = found if len(found) == 1 and all(name in ours for name in running) else []
    if deployments and not change.all_:
        return deployments, []
    ranked = {r.container for d in deployments for r in d.ranks if r.endpoint == runtime.endpoint.url}
    containers = [c for c in select(runtime, change.recipe, change.all_, missing_ok=True) if c.name not in ranked]
    return deployments, containers
