"""The real services: the same core calls the CLI makes (lifecycle, status, doctor, telemetry, bench).

Every import of the core happens inside the method that needs it (on a worker thread), so the
dashboard paints before Docker, httpx or NVML are even loaded. services.py's values (ten frozen
dataclasses: ~6 ms to define) and the bench service come the same way: the first frame needs neither.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from metralectl.wording import count

if TYPE_CHECKING:
    from metralectl.core.catalog import Catalog
    from metralectl.doctor.model import CheckResult
    from metralectl.lifecycle.status import StatusReport
    from metralectl.seams.docker.protocol import ContainerRuntime
    from metralectl.cancel import CancelToken
    from metralectl.tui.services import (Action, BenchService, LibrarySnapshot, Listener, Outcome, Plan,
                                         TelemetryFeed)

LOCK_NOTE = "(dashboard)"


def _open_local() -> ContainerRuntime:
    from metralectl.lifecycle.local_runtime import open_local  # on first use, not before the first frame

    return open_local()


class CoreServices:
    def __init__(self, *, hardware: str | None = None, bench: BenchService | None = None) -> None:
        self._hardware = hardware
        self._catalog: Catalog | None = None
        self._catalog_lock = threading.Lock()
        from metralectl.seams.docker.shared import SharedRuntime  # light: Docker is imported on first use

        self._shared = SharedRuntime(_open_local)  # this machine's containers and host processes
        self._bench = bench
        self._bench_lock = threading.Lock()

    @property
    def bench(self) -> BenchService:
        """Made when the Benchmarks view first asks for it (on a worker, after the first frame)."""
        with self._bench_lock:
            if self._bench is None:
                from metralectl.tui.bench_adapter import make_bench

                self._bench = make_bench()
            return self._bench

    # -- helpers --------------------------------------------------------------------------------
    def now(self) -> float:
        return time.time()

    def catalog(self, reload: bool = False) -> Catalog:
        with self._catalog_lock:
            if self._catalog is None or reload:
                from metralectl.core.catalog import load_catalog

                self._catalog = load_catalog()
            return self._catalog

    def _runtime(self) -> ContainerRuntime:
        """A lease on the dashboard's one kept Docker connection (reads: status, library, logs, plans, engine
        discovery). Shared by the worker threads; reopened only after it failed to reach the daemon."""
        return self._shared()

    @staticmethod
    def _own_runtime() -> ContainerRuntime:
        """A connection of its own for a run, swap, stop or pull: they change the client's timeout while they
        last (seams/docker/shared.py says why a shared one must not), and they are one per operator action."""
        from metralectl.lifecycle.local_runtime import open_local

        return open_local()

    def close(self) -> None:
        """When the dashboard ends (tui.run): the kept Docker connection."""
        self._shared.close()

    # -- library --------------------------------------------------------------------------------
    def library(self) -> LibrarySnapshot:
        from metralectl.tui.services import LibraryItem, LibrarySnapshot
        from metralectl.app import library
        from metralectl.errors import MetralError
        from metralectl.core.render import LABEL_RECIPE
        from metralectl.tui.plans import LIBRARY_HINTS, dashboard_change

        catalog = self.catalog(reload=True)
        target = library.choose_target(catalog, self._hardware)
        rows = library.rows(catalog, target)
        notes = [f"your recipe {r.path} was refused ({count(len(r.problems), 'problem')}); `metralectl recipes check` "
                 "explains" for r in catalog.refused]
        present: dict[str, bool | None] = {}
        serving: set[str] = set()
        refused: dict[str, Any] = {}
        try:
            with self._runtime() as runtime:
                for image in {catalog.recipes[r.name].image for r in rows}:
                    info = catalog.images[image]
                    present[info.ref] = runtime.image_state(info.ref, info.revision_label).present
                serving = {c.labels.get(LABEL_RECIPE, "") for c in runtime.containers() if c.running}
                # what the run's and the swap's plan would refuse whatever serves: r/w disabled, with its words
                refused = library.blocked(catalog, [r.name for r in rows], runtime,
                                          dashboard_change("run", "-").options)
        except MetralError as exc:
            notes.append(f"Docker not reachable, images unknown: {exc.message}")
        items = []
        for r in rows:
            ref = catalog.image_for(catalog.recipes[r.name]).ref
            no = refused.get(r.name)
            items.append(LibraryItem(r, ref, present.get(ref), r.name in serving,
                                     no.error.message if no else None,
                                     (LIBRARY_HINTS.get(no.fix or "", no.error.hint) if no else None)))
        judged = f"fit judged on: {target.hardware or 'each recipe’s own class'} ({target.how})"
        return LibrarySnapshot(tuple(items), judged, tuple(notes))

    def detail(self, name: str) -> str:
        from metralectl.present.show_view import as_text

        catalog = self.catalog()
        return as_text(catalog, catalog.recipe(name))

    # -- actions --------------------------------------------------------------------------------
    def plan(self, action: Action, name: str | None) -> Plan:
        from metralectl.tui.plans import make_plan

        catalog = self.catalog()
        recipe = catalog.recipe(name) if name else None
        return make_plan(action, recipe, catalog, self._runtime)

    def perform(self, action: Action, name: str | None, on_event: Listener, cancel: CancelToken) -> Outcome:
        """pull here; run/swap/stop through app/serving.py under the lifecycle lock, as the CLI does. `cancel` is
        bound to this thread: the lifecycle stops at its next event or phase boundary (Cancelled) and cleans up."""
        from metralectl.app.serving import Serving
        from metralectl.tui.plans import dashboard_change

        def emit(event: Any) -> None:
            cancel.check()  # every event is a place to stop, as every phase boundary is
            on_event(event)

        with cancel.bound():
            if action == "pull":
                catalog = self.catalog()
                assert name is not None
                return self._pull(catalog.recipe(name), catalog, emit)
            serving = Serving(catalog=self.catalog, runtime=self._own_runtime, lock_note=LOCK_NOTE)
            result = serving.apply(dashboard_change(action, name), emit)
        if action == "run":
            return _run_outcome(result)
        if action == "swap":
            return _swap_outcome(result)
        return _stop_outcome(name, result)

    def _pull(self, recipe: Any, catalog: Catalog, emit: Listener) -> Outcome:
        from metralectl.tui.services import Outcome
        from metralectl.seams import machine
        from metralectl.seams.docker import images
        from metralectl.seams.hf import weights
        from metralectl.core.progress import human_bytes

        with self._own_runtime() as runtime:
            image = images.pull(catalog.image_for(recipe), runtime, machine.cpu_arch(), emit)
        got = weights.pull(recipe, emit)
        how = "already complete" if got.already_complete else f"{human_bytes(got.downloaded_bytes)} downloaded"
        quant = f" ({got.quant}: {count(got.files, 'file')})" if got.quant is not None else ""  # a GGUF checkpoint's quant
        return Outcome("pull", recipe.name, "done", f"{recipe.name}: image {image.action}; weights{quant} complete at "
                       f"{got.commit[:12]} ({how})", lines=tuple(got.notes))

    # -- serving --------------------------------------------------------------------------------
    def status(self) -> StatusReport:
        from metralectl.app.serving import Serving

        return Serving(runtime=self._runtime).ps()

    def follow_logs(self, container: str, stop: threading.Event) -> Iterator[str]:
        from metralectl.app.serving import Serving

        yield from Serving(runtime=self._runtime).logs(container=container, follow=True, tail=200, stop=stop)

    def telemetry(self) -> TelemetryFeed:
        from metralectl.tui.telemetry_feed import TopFeed

        return TopFeed(self.catalog(), runtime=self._shared)

    # -- doctor ---------------------------------------------------------------------------------
    def doctor(self) -> list[CheckResult]:
        from metralectl.doctor import Context, diagnose

        ctx = Context(catalog_loader=self.catalog)
        try:
            return diagnose(ctx)
        finally:
            ctx.close()


# -- outcomes --------------------------------------------------------------------------------------------------
def _run_outcome(launched: Any) -> Outcome:
    from metralectl.tui.services import Outcome

    return Outcome("run", launched.recipe, "done", f"{launched.recipe} serves on {launched.url}/v1 (model "
                   f"{launched.model or '-'}); ready in {launched.ready_s:.1f} s")


def _swap_outcome(result: Any) -> Outcome:
    from metralectl.tui.services import Outcome

    split = ", ".join(f"{k} {v:.1f} s" for k, v in result.phases.items())
    return Outcome("swap", result.to_recipe, "done", f"swapped {result.from_recipe} → {result.to_recipe}: downtime "
                   f"{result.downtime_s:.1f} s ({split})")


def _stop_outcome(name: str | None, stopped: Any) -> Outcome:
    from metralectl.tui.services import Outcome

    if stopped.nothing:
        return Outcome("stop", name, "done", "nothing to stop")
    results = [r.result for r in stopped.ranks if r.result is not None] + list(stopped.containers)
    lines = tuple(f"stopped {r.name} ({r.recipe}): {'killed after the timeout' if r.killed else f'exited {r.exit_code}'}"
                  f" in {r.stop_s:.1f} s; removed: {'yes' if r.removed else 'no'}; memory: {r.memory}"
                  for r in results)
    return Outcome("stop", name, "done", lines[0] if len(lines) == 1 else f"stopped {len(lines)} containers",
                   lines=lines)
