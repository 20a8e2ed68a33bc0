"""Loading models on demand within the box's memory budget, for the gateway (issue 32 item 2).

A request naming a recipe of this box (or a served name/alias its recipe sets) that nothing serves starts it
through `run`'s own path (app/serving: the lifecycle lock, the launch's preflight and budget check, containers or
host processes as the recipe says). When it does not fit, the least recently used idle models are stopped first
(core/budget.plan_room; on a box of several GPUs plan_gpus, per GPU: in the same order until the least-held GPUs
the model takes have room, never more than needed): a busy one is drained (no new request goes to it; its
requests finish, bounded by `drain_timeout_s`), never stopped mid-request; a pinned one never. The evicted are
stopped BEFORE the new one starts, so the footprints of what runs stay within the budget (of each GPU) at every
moment. Nothing evictable:
503 with Retry-After and the numbers. A launch that fails: its waiters get the engine's reason (502).

One load at a time (the lifecycle lock serialises them anyway); the blocking work (the runtime, NVML, the launch)
runs on a thread. `BoxOps` is the machine; tests hand in fakes.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from metralectl.core.budget import Budget, Footprint, Resident, gb, plan_gpus, short_words
from metralectl.gateway.oversize import Oversize

if TYPE_CHECKING:
    from metralectl.core.catalog import Catalog
    from metralectl.gateway.routes import Route
    from metralectl.gateway.metrics import Metrics


class LoadRefused(Exception):
    """The model cannot be loaded now (503: it does not fit, or a drain did not end) or its launch failed (502)."""

    def __init__(self, status: int, message: str, code: str, retry_after: int | None = None,
                 reason: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.retry_after = status, message, code, retry_after
        self.reason = reason or ("load-failed" if status == 502 else "no-room")  # the errors metric's


@dataclass(frozen=True)
class Held:
    footprint: Footprint
    ours: bool  # another user's engine is never stopped


class Ops(Protocol):
    """What the loader does to the machine (blocking: called on a thread)."""

    def budget(self) -> Budget: ...

    def footprint(self, recipe: str) -> Footprint: ...

    def held(self) -> list[Held]: ...

    def stop(self, recipe: str) -> None: ...

    def start(self, recipe: str, progress: Callable[[], None]) -> None: ...


class BoxOps:
    """This machine, through app/serving (the same executor as `run`/`stop`) and lifecycle/budget."""

    def __init__(self, budget_gb: float | None = None) -> None:
        self.budget_gb = budget_gb

    def _catalog(self) -> Catalog:
        from metralectl.core.catalog import load_catalog

        return load_catalog()

    def budget(self) -> Budget:
        from metralectl.lifecycle.budget import box_budget

        return box_budget(self._catalog(), self.budget_gb)

    def footprint(self, recipe: str) -> Footprint:
        from metralectl.lifecycle.budget import recipe_footprint

        catalog = self._catalog()
        return recipe_footprint(catalog, catalog.recipe(recipe))

    def held(self) -> list[Held]:
        from metralectl.core.render import owner
        from metralectl.lifecycle.budget import box_gpus, running_footprints
        from metralectl.lifecycle.local_runtime import open_local

        with open_local(need_docker=False, timeout=5.0) as runtime:
            running = [c for c in runtime.containers(mine=False) if c.running]
            found = running_footprints(self._catalog(), runtime, running, box_gpus())
        return [Held(f, c.owner == owner()) for f, c in zip(found, running)]

    def stop(self, recipe: str) -> None:
        from metralectl.app.serving import Change, Serving

        Serving().stop(Change.stop(recipe), lambda event: None)

    def start(self, recipe: str, progress: Callable[[], None]) -> None:
        """`run recipe`; while someone else holds the lifecycle lock (a `run` or `swap` by hand), wait for it, then
        start it unless that served it meanwhile."""
        from metralectl.app.serving import Change, Serving
        from metralectl.seams.store import Busy
        from metralectl.lifecycle.launch import LaunchOptions

        while True:
            try:
                Serving().run(Change.run(recipe, options=LaunchOptions(budget_gb=self.budget_gb)),
                              lambda event: progress())
                return
            except Busy:
                time.sleep(0.5)
                if any(h.footprint.name == recipe for h in self.held()):
                    return


class Loader:
    def __init__(self, ops: Ops, names: dict[str, str], *, pins: Iterable[str] = (), drain_timeout_s: float = 60.0,
                 metrics: Metrics | None = None) -> None:
        self.ops, self.names = ops, dict(names)  # every name a loadable recipe answers to -> the recipe
        self.oversize = Oversize(ops, self.names.values())  # those more than the whole budget, for /v1/models
        self.pins = frozenset(pins)
        self.drain_timeout_s = drain_timeout_s
        self.metrics = metrics
        self.in_flight: dict[str, int] = {}  # recipe -> requests being relayed to it now
        self.last_used: dict[str, float] = {}  # recipe -> monotonic time its last request began
        self.loading: str | None = None  # the recipe being loaded now
        self.draining: set[str] = set()  # recipes being drained or stopped: nothing new goes to them
        self.progress_at = time.monotonic()  # the last sign of progress of the load under way (the stall timer)
        self._lock = asyncio.Lock()
        self._idle: dict[str, asyncio.Event] = {}
        self._loads: dict[str, asyncio.Future[None]] = {}
        self._recipe_of: weakref.WeakKeyDictionary[asyncio.Future[None], str] = weakref.WeakKeyDictionary()

    def recipe_for(self, name: str) -> str | None:
        return self.names.get(name)

    def holds(self, recipe: str) -> bool:
        """Requests for `recipe` must wait: it is being loaded, drained or stopped."""
        return recipe == self.loading or recipe in self.draining or recipe in self._loads

    # requests
    def begin(self, recipe: str) -> None:
        self.in_flight[recipe] = self.in_flight.get(recipe, 0) + 1
        self.last_used[recipe] = time.monotonic()

    def end(self, recipe: str) -> None:
        self.in_flight[recipe] -= 1
        if self.in_flight[recipe] <= 0:
            self.in_flight.pop(recipe, None)
            event = self._idle.pop(recipe, None)
            if event is not None:
                event.set()

    async def _drained(self, recipe: str, timeout: float) -> bool:
        if not self.in_flight.get(recipe):
            return True
        event = self._idle.setdefault(recipe, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            return not self.in_flight.get(recipe)
        return True

    def _progress(self) -> None:
        self.progress_at = time.monotonic()

    # loads
    def ensure(self, recipe: str) -> asyncio.Future[None]:
        """The load of `recipe` (one future shared by every request waiting for it)."""
        found = self._loads.get(recipe)
        if found is None:
            found = asyncio.ensure_future(self._load(recipe))
            self._loads[recipe] = found
            self._recipe_of[found] = recipe
            found.add_done_callback(lambda _f: self._loads.pop(recipe, None))
        return found

    def current(self, recipe: str | None = None) -> asyncio.Future[None] | None:
        """`recipe`'s load, else the one under way (the one draining or stopping others), else any queued."""
        if recipe is not None and recipe in self._loads:
            return self._loads[recipe]
        if self.loading is not None and self.loading in self._loads:
            return self._loads[self.loading]
        return next(iter(self._loads.values()), None)

    def loaded_recipe(self, load: asyncio.Future[None]) -> str | None:
        return self._recipe_of.get(load)

    async def _load(self, recipe: str) -> None:
        async with self._lock:
            self.loading, started = recipe, time.monotonic()
            self._set_loading(recipe, 1)
            self._progress()
            try:
                await self._make_room(recipe)
                self._progress()
                try:
                    await asyncio.to_thread(self.ops.start, recipe, self._progress)
                except Exception as exc:  # the launch's own refusal or failure, in its words
                    self._count("loads", recipe, "failed")
                    message = getattr(exc, "message", None) or str(exc)
                    raise LoadRefused(502, f"loading `{recipe}` failed: {message}", "model_load_failed") from None
                self._count("loads", recipe, "loaded")
                self.last_used.setdefault(recipe, time.monotonic())
                if self.metrics is not None:
                    self.metrics.load_seconds.labels(recipe).observe(time.monotonic() - started)
                    self.metrics.resident.labels(recipe).set(1)
            finally:
                self.loading = None
                self._set_loading(recipe, 0)

    def _set_loading(self, recipe: str, value: int) -> None:
        if self.metrics is not None:
            self.metrics.loading.labels(recipe).set(value)

    async def _make_room(self, recipe: str) -> None:
        budget, need = await asyncio.to_thread(self.ops.budget), await asyncio.to_thread(self.ops.footprint, recipe)
        held = await asyncio.to_thread(self.ops.held)
        residents = [Resident(h.footprint.name, h.footprint.gb, self.last_used.get(h.footprint.name, 0.0),
                              self.in_flight.get(h.footprint.name, 0), h.footprint.name in self.pins or not h.ours,
                              devices=h.footprint.devices)
                     for h in held]
        if need.gb is not None and budget.gb is not None and need.gb > budget.gb + 1e-9:
            self._count("loads", recipe, "refused")  # no eviction, no wait, no later can make room: said so, and
            # without a Retry-After (a client that retries would only be refused again)
            raise LoadRefused(503, f"cannot load `{recipe}`: it needs {gb(need.gb)}, more than the whole budget "
                                   f"{gb(budget.gb)} ({budget.basis}); it cannot be served on this box as it is "
                                   "(a leaner quant, or a larger budget)", "model_too_large")
        plan = plan_gpus(need, budget, residents)  # per GPU on a box of several
        if plan is None:
            from metralectl.core.budget import Room

            room = Room(budget, need, tuple(h.footprint for h in held))
            pinned = sorted(r.name for r in residents if r.pinned)
            self._count("loads", recipe, "refused")
            raise LoadRefused(503, f"cannot load `{recipe}`: {short_words(room)}; nothing more can be evicted"
                                   + (f" (pinned or not ours: {', '.join(pinned)})" if pinned else ""),
                              "model_does_not_fit", retry_after=30)
        for name in (*plan.evict, *plan.drain):
            self.draining.add(name)  # nothing new goes to it from here
        try:
            for name in plan.drain:
                if not await self._drained(name, self.drain_timeout_s):
                    raise LoadRefused(503, f"cannot load `{recipe}` yet: `{name}` must make room and its requests "
                                           f"did not finish within {self.drain_timeout_s:g} s", "model_busy",
                                      retry_after=10)
            for name in (*plan.evict, *plan.drain):  # stopped BEFORE the new one starts: never over the budget
                if self.in_flight.get(name) and not await self._drained(name, self.drain_timeout_s):
                    raise LoadRefused(503, f"cannot load `{recipe}` yet: `{name}` is busy", "model_busy",
                                      retry_after=10)
                self._progress()
                await asyncio.to_thread(self.ops.stop, name)
                self._count("evictions", name)
                if self.metrics is not None:
                    self.metrics.resident.labels(name).set(0)
        finally:
            self.draining.difference_update((*plan.evict, *plan.drain))

    def _count(self, what: str, recipe: str, outcome: str | None = None) -> None:
        if self.metrics is None:
            return
        if what == "loads":
            self.metrics.loads.labels(recipe, outcome or "").inc()
        else:
            self.metrics.evictions.labels(recipe).inc()


async def wait_loaded(gw: Any, model: str, loader: Loader) -> Route | None:
    """For the gateway (server.Gateway `gw`: its table, limits, queue counts and metrics): the route for `model`
    once the loader has it loaded (None: not the loader's: the table's own answer). Requests wait in the model's bounded queue while it is loaded, or drained and stopped to make room."""
    route = gw.table.find(model)
    recipe = route.recipe if route is not None else loader.recipe_for(model)
    if recipe is None or (model in gw.table.starting and not loader.holds(recipe)):
        return None  # a name of no recipe here, or a `run`/`swap` by someone else: the queue below
    if route is not None and not loader.holds(recipe):
        return route
    if gw._waiting.get(model, 0) >= gw.limits.queue_size:
        raise LoadRefused(503, f"`{model}` is loading and {gw.limits.queue_size} requests already wait for it",
                          "model_starting", retry_after=5, reason="queue-full")
    gw._waiting[model] = gw._waiting.get(model, 0) + 1
    gauge, started = gw.metrics.queue_depth.labels(model), time.monotonic()
    gauge.inc()
    try:
        while True:
            route = gw.table.find(model)
            if route is not None and not loader.holds(route.recipe) and model not in gw.table.starting:
                return route
            load = loader.ensure(recipe) if route is None and not loader.holds(recipe) else loader.current(recipe)
            left = gw.limits.queue_stall_s - (time.monotonic() - max(loader.progress_at, started))
            if left <= 0:
                raise LoadRefused(503, f"`{model}` is still loading: no progress in {gw.limits.queue_stall_s:g} s",
                                  "model_starting", retry_after=10, reason="queue-stalled")
            if load is not None:
                await asyncio.wait({load}, timeout=min(left, 1.0))
            refused = load.exception() if load is not None and load.done() and not load.cancelled() else None
            if isinstance(refused, LoadRefused) and loader.loaded_recipe(load) == recipe:  # type: ignore[arg-type]
                raise refused
            if load is None or load.done():  # loaded (or another's load ended): the table shows it next scan
                gw._rescan.set()
                await gw._table_change(1.0)
    finally:
        gw._waiting[model] -= 1
        gauge.dec()
        gw.metrics.queue_wait.labels(model).observe(time.monotonic() - started)


def loadable_names(budget_gb: float | None = None) -> dict[str, str]:
    """Every name a recipe of this box answers to (its name, its serve alias / served-model-name) -> the recipe.
    This box's: the recipes of its hardware class (the first GPU's, or a class without a GPU on a box with none),
    and the user's own recipes whatever their class."""
    from metralectl.core.catalog import load_catalog
    from metralectl.seams import machine

    catalog = load_catalog()
    gpus = machine.gpu_names()
    classes = {hw_id for hw_id, hw in catalog.hardware.items()
               if (gpus and any(s.match.lower() in gpus[0].lower() for s in hw.skus))
               or (not gpus and (hw.host_memory or not hw.has_accelerator))}
    names: dict[str, str] = {}
    for recipe in sorted(catalog.recipes.values(), key=lambda r: r.name):
        if recipe.multi_rank or not (recipe.hardware in classes or recipe.origin.kind in ("user", "file")):
            continue
        for name in (recipe.name, recipe.serve.get("alias"), recipe.serve.get("served-model-name")):
            if isinstance(name, str) and name:
                names.setdefault(name, recipe.name)
    return names
