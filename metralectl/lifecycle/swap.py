"""`swap`: replace the served model, keeping the engine's own hot-swap promises (SPEC §2).

Refuse before releasing anything if the new recipe cannot work here; stage while the old model
still serves; drain; stop the old one and wait for its memory; start the new one on the same port;
if it does not become ready, restore the previous recipe and say so. A journal on disk records the
phase, so an interrupted swap (Ctrl-C, SIGKILL, crash) is reported and repaired by the next
`ps --repair` / `run` — never two models, never a silent nothing.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from metralectl import cancel
from metralectl.seams import store
from metralectl.core.catalog import Catalog
from metralectl.seams.endpoint import EngineClient, requests_active
from metralectl.errors import ExitCode, MetralError
from metralectl.lifecycle.engine_token import engine_headers
from metralectl.lifecycle.events import Listener, Step, Warning_, ignore
from metralectl.lifecycle.launch import LaunchFailed, LaunchOptions, preflight, start_and_wait
from metralectl.lifecycle.memory import MemoryWatch
from metralectl.lifecycle.preflight import Refusal, swap_refusal
from metralectl.lifecycle.stop import stop_containers
from metralectl.lifecycle.swap_journal import (describe_journal, journal_path,  # noqa: F401  (re-exported)
                                               last_swap_summary, swaps_path)
from metralectl.core.overrides import apply_sets
from metralectl.core.recipe import Recipe
from metralectl.core.labels import LABEL_ENDPOINT, LABEL_RECIPE, LABEL_SETS
from metralectl.lifecycle.specs import spec_here
from metralectl.seams.docker.containers import ContainerInfo
from metralectl.seams.docker.protocol import ContainerRuntime
from metralectl.wording import count


@dataclass(frozen=True)
class SwapResult:
    from_recipe: str
    to_recipe: str
    outcome: str  # swapped | rolled-back | degraded
    downtime_s: float
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase: drain, stop, boot, restore
    message: str = ""
    url: str = ""
    model: str | None = None


class SwapRolledBack(MetralError):
    """The new model did not become ready; the previous one serves again."""

    exit_code = ExitCode.FAILED
    result: SwapResult | None = None  # what happened, for `swap --json` (stdout is data, failed or not)


class SwapDegraded(MetralError):
    """Neither model serves; the journal stays so `ps --repair` can restore."""

    exit_code = ExitCode.DEGRADED
    result: SwapResult | None = None


class SwapInterrupted(MetralError):
    """Ctrl-C (or SIGTERM) after the old model was stopped: nothing serves; the journal stays for the repair."""

    exit_code = ExitCode.INTERRUPTED


def _journal(phase: str, body: dict[str, Any]) -> None:
    import os

    body = {**body, "phase": phase, "pid": os.getpid(), "updated": time.time()}
    store.write_json(journal_path(), body)


def served_sets(container: ContainerInfo) -> list[str]:
    """The --set overrides a running container was started with (its label)."""
    return [s for s in container.labels.get(LABEL_SETS, "").split("\x1f") if s]


def _recipe_of(container: ContainerInfo, catalog: Catalog) -> tuple[Recipe, list[str]]:
    """The exact recipe (with its --set overrides) a running container was started from."""
    sets = served_sets(container)
    return apply_sets(catalog, catalog.recipe(container.labels.get(LABEL_RECIPE, "")), sets), sets


def swap_refused(new: Recipe, new_sets: list[str],
                 runtime: ContainerRuntime) -> tuple[Refusal | None, ContainerInfo | None]:
    """(why a swap to `new` cannot start, or None; the served container when there is exactly one)."""
    running = [c for c in runtime.containers() if c.running]
    served = running[0] if len(running) == 1 else None
    return swap_refusal(new, new_sets, running, served_sets(served) if served else ()), served


def drain(url: str, timeout_s: float, on_event: Listener, active_series: tuple[str, ...],
          headers: dict[str, str] | None = None) -> float:
    """Wait (bounded) until the engine has no request in flight (its requests-active series); returns the
    seconds waited. `headers`: the engine token's, when the engine asks it (llama-server's /metrics does)."""
    started = time.monotonic()
    shown: float | None = None
    on_event(Step("draining", f"waiting for requests in flight to finish (up to {timeout_s:g} s)"))
    with EngineClient(url, timeout=1.0, headers=headers) as client:
        while True:
            try:
                active = requests_active(client.metrics_text(), active_series)
            except MetralError:
                active = None
            if not active:
                break
            if active != shown:  # the count as it falls, so a long drain is never shown as another step
                shown = active
                on_event(Step("draining", f"{count(active, 'request')} in flight"))
            if time.monotonic() - started > timeout_s:
                on_event(Warning_(f"{count(active, 'request')} still in flight after {timeout_s:g} s; stopping anyway"))
                break
            cancel.sleep(0.2)
    return time.monotonic() - started


def swap(new: Recipe, new_sets: list[str], catalog: Catalog, runtime: ContainerRuntime, *, on_event: Listener = ignore,
         options: LaunchOptions = LaunchOptions(), drain_timeout_s: float = 60.0,
         memory: MemoryWatch | None = None) -> SwapResult:
    """Call with the lifecycle lock held."""
    refused, old_container = swap_refused(new, new_sets, runtime)  # the dashboard's plan asks the same
    if refused is not None or old_container is None:
        raise refused.error if refused is not None else MetralError("nothing to swap")
    old, old_sets = _recipe_of(old_container, catalog)
    port, bind = old.resources.ranks[0].port, old.resources.bind
    if (new.resources.port, new.resources.bind) != (port, bind):
        on_event(Warning_(f"{new.name} asks for {new.resources.bind}:{new.resources.port}; a swap keeps the served "
                          f"address {bind}:{port}"))
        new_sets = [*new_sets, f"resources.port={port}", f"resources.bind={bind}"]
        new = apply_sets(catalog, catalog.recipe(new.name), new_sets)
    spec = spec_here(catalog, new)
    on_event(Step("staging", f"{new.name} while {old.name} serves"))
    preflight(new, catalog, runtime, spec, LaunchOptions(replace=True, check_weights=options.check_weights,
                                                         pull=options.pull), on_event,
              ignore_running=(old_container.name,), check_port=False)
    body: dict[str, Any] = {"old": {"recipe": old.name, "sets": old_sets, "container": old_container.name},
                            "new": {"recipe": new.name, "sets": new_sets, "container": spec.name}}
    phases: dict[str, float] = {}
    _journal("draining", body)
    url = old_container.labels.get(LABEL_ENDPOINT, "")
    active_series = catalog.engines[old.engine].metrics.names("requests-active")
    phases["drain"] = drain(url, drain_timeout_s, on_event, active_series,
                            engine_headers(old_container.labels)) if url and active_series else 0.0
    cancel.checkpoint()  # the last place a cancel leaves the old model serving
    body["stopped_at"] = time.time()  # wall clock: a repair in another process measures the downtime from it
    _journal("stopping-old", body)
    down_from = time.monotonic()
    stop_containers(runtime, [old_container], on_event=on_event, memory=memory)
    phases["stop"] = time.monotonic() - down_from
    _journal("starting-new", body)
    stale = runtime.inspect(spec.name)
    if stale is not None and stale.managed and not stale.running:
        runtime.remove(stale.id, force=True)
    boot_from = time.monotonic()
    new_options = LaunchOptions(keep_failed=False, stall_timeout_s=options.stall_timeout_s,
                                boot_timeout_s=options.boot_timeout_s, check_weights=False, sets=tuple(new_sets))
    try:
        launched = start_and_wait(new, catalog, runtime, spec, new_options, on_event)
    except LaunchFailed as failure:
        phases["boot"] = time.monotonic() - boot_from
        return _restore(old, old_sets, new, catalog, runtime, body, phases, down_from, failure, options, on_event)
    except KeyboardInterrupt:
        # Restoring would be a whole boot (minutes with a real engine) after the user asked to stop: say exactly
        # what the box holds now, and leave the journal so the repair knows what to restore.
        raise SwapInterrupted(
            f"interrupted while {new.name} was starting: nothing serves now ({old.name} was stopped for the swap, "
            f"{new.name}'s {'process' if spec.is_process else 'container'} was removed)",
            f"`metralectl ps --repair` serves {old.name} again (so does the next `run` or `swap`)") from None
    phases["boot"] = time.monotonic() - boot_from
    result = SwapResult(old.name, new.name, "swapped", time.monotonic() - down_from, phases,
                        f"{new.name} serves on {launched.url}", launched.url, launched.model)
    _finish(result)
    return result


def _restore(old: Recipe, old_sets: list[str], new: Recipe, catalog: Catalog, runtime: ContainerRuntime,
             body: dict[str, Any], phases: dict[str, float], down_from: float, failure: LaunchFailed,
             options: LaunchOptions, on_event: Listener) -> SwapResult:
    _journal("restoring", body)
    cancel.checkpoint()  # cancelled before the rollback boots: the journal says what `ps --repair` restores
    on_event(Warning_(f"{new.name} did not become ready ({failure.diagnosis.cause}); restoring {old.name}"))
    restore_from = time.monotonic()
    spec = spec_here(catalog, old)
    try:
        start_and_wait(old, catalog, runtime, spec, LaunchOptions(stall_timeout_s=options.stall_timeout_s,
                                                                   boot_timeout_s=options.boot_timeout_s,
                                                                   check_weights=False, sets=tuple(old_sets)), on_event)
    except LaunchFailed as second:
        phases["restore"] = time.monotonic() - restore_from
        _journal("degraded", {**body, "why": f"new: {failure.diagnosis.message}; restore: {second.diagnosis.message}"})
        result = SwapResult(old.name, new.name, "degraded", time.monotonic() - down_from, phases,
                            f"{new.name} failed ({failure.diagnosis.cause}) and restoring {old.name} failed too "
                            f"({second.diagnosis.cause})")
        store.append_jsonl(swaps_path(), {**asdict(result), "at": time.time()})
        degraded = SwapDegraded(f"DEGRADED: nothing serves — {result.message}", "`metralectl ps --repair` retries the "
                                f"restore; `metralectl logs` / {second.log_path} show why")
        degraded.result = result
        raise degraded from None
    phases["restore"] = time.monotonic() - restore_from
    result = SwapResult(old.name, new.name, "rolled-back", time.monotonic() - down_from, phases,
                        f"{new.name} failed ({failure.diagnosis.cause}: {failure.diagnosis.message}); "
                        f"{old.name} restored")
    _finish(result)
    rolled_back = SwapRolledBack(f"swap to {new.name} failed ({failure.diagnosis.cause}: {failure.diagnosis.message}); "
                                 f"the previous recipe {old.name} serves again", failure.diagnosis.remedy)
    rolled_back.result = result
    raise rolled_back


def _finish(result: SwapResult) -> None:
    store.append_jsonl(swaps_path(), {**asdict(result), "at": time.time()})
    journal_path().unlink(missing_ok=True)


def repair_if_needed(runtime: ContainerRuntime, catalog: Catalog, *, on_event: Listener = ignore) -> str | None:
    """Finish or undo an interrupted swap. Call with the lifecycle lock held (so the journal is stale)."""
    journal = store.read_json(journal_path())
    if not isinstance(journal, dict):
        return None
    old, new = journal.get("old", {}), journal.get("new", {})
    running = {c.labels.get(LABEL_RECIPE): c for c in runtime.containers() if c.running}
    _remove_swap_leftovers(runtime, journal)
    if new.get("recipe") in running and _healthy(running[new["recipe"]]):
        outcome = f"the interrupted swap had finished: {new['recipe']} serves"
    elif old.get("recipe") in running:
        if new.get("recipe") in running and new.get("recipe") != old.get("recipe"):
            stop_containers(runtime, [running[new["recipe"]]], on_event=on_event)  # never two models
        outcome = f"the interrupted swap had not released {old['recipe']}; it still serves"
    else:
        for leftover in running.values():
            stop_containers(runtime, [leftover], on_event=on_event)
        on_event(Step("repair", f"restoring {old.get('recipe')} after an interrupted swap"))
        recipe = apply_sets(catalog, catalog.recipe(str(old.get("recipe"))), list(old.get("sets") or []))
        spec = spec_here(catalog, recipe)
        try:
            start_and_wait(recipe, catalog, runtime, spec, LaunchOptions(check_weights=False,
                                                                         sets=tuple(old.get("sets") or ())), on_event)
        except LaunchFailed as failure:
            _journal("degraded", {"old": old, "new": new, "why": f"repair: {failure.diagnosis.message}"})
            raise SwapDegraded(f"DEGRADED: restoring {old.get('recipe')} failed: {failure.diagnosis.message}",
                               failure.diagnosis.remedy) from None
        outcome = f"restored {old.get('recipe')} after an interrupted swap"
    stopped_at = journal.get("stopped_at")
    downtime = round(time.time() - stopped_at, 3) if isinstance(stopped_at, (int, float)) and "restored" in outcome \
        else None  # nothing went down (it had not released the old one), or when it did is not known
    store.append_jsonl(swaps_path(), {"from_recipe": old.get("recipe"), "to_recipe": new.get("recipe"),
                                      "outcome": "repaired", "message": outcome, "at": time.time(), "phases": {},
                                      "downtime_s": downtime})
    journal_path().unlink(missing_ok=True)
    on_event(Step("repaired", outcome))
    return outcome


def _remove_swap_leftovers(runtime: ContainerRuntime, journal: dict[str, Any]) -> None:
    """The stopped containers the interrupted swap itself left (its old and new); never another one, such as a
    start kept with --keep-failed for its owner to read."""
    names = {str(side.get("container")) for side in (journal.get("old") or {}, journal.get("new") or {})
             if isinstance(side, dict) and side.get("container")}
    for stale in runtime.containers():
        if not stale.running and stale.name in names:
            runtime.remove(stale.id, force=True)


def swap_after_interruption(new: Recipe, new_sets: list[str], catalog: Catalog, runtime: ContainerRuntime, *,
                            on_event: Listener = ignore, options: LaunchOptions = LaunchOptions()) -> SwapResult | None:
    """An interrupted swap left nothing serving, and the user now swaps to `new`: start it straight away, with
    the journal's old model as the rollback (restoring the old one first would be a whole boot, only to stop
    it again). None when the box is not in that state: the usual repair, then the usual swap, apply."""
    journal = store.read_json(journal_path())
    if not isinstance(journal, dict) or any(c.running for c in runtime.containers()):
        return None
    old_side = journal.get("old") or {}
    try:
        old = apply_sets(catalog, catalog.recipe(str(old_side.get("recipe"))), list(old_side.get("sets") or []))
    except MetralError:
        return None  # the old recipe is gone from the catalog: the repair says so
    _remove_swap_leftovers(runtime, journal)
    port, bind = old.resources.ranks[0].port, old.resources.bind
    if (new.resources.port, new.resources.bind) != (port, bind):
        new_sets = [*new_sets, f"resources.port={port}", f"resources.bind={bind}"]
        new = apply_sets(catalog, catalog.recipe(new.name), new_sets)
    spec = spec_here(catalog, new)
    on_event(Step("repair", f"an interrupted swap left nothing serving: starting {new.name} now, "
                            f"{old.name} stays the rollback"))
    body = {"old": old_side, "new": {"recipe": new.name, "sets": new_sets, "container": spec.name},
            "stopped_at": journal.get("stopped_at")}
    _journal("starting-new", body)
    stopped_at = journal.get("stopped_at")
    down_from = time.monotonic() - (time.time() - stopped_at if isinstance(stopped_at, (int, float)) else 0.0)
    phases: dict[str, float] = {}
    boot_from = time.monotonic()
    new_options = LaunchOptions(stall_timeout_s=options.stall_timeout_s, boot_timeout_s=options.boot_timeout_s,
                                check_weights=options.check_weights, pull=options.pull, sets=tuple(new_sets))
    try:
        launched = start_and_wait(new, catalog, runtime, spec, new_options, on_event)
    except LaunchFailed as failure:
        phases["boot"] = time.monotonic() - boot_from
        return _restore(old, list(old_side.get("sets") or []), new, catalog, runtime, body, phases, down_from,
                        failure, options, on_event)
    phases["boot"] = time.monotonic() - boot_from
    result = SwapResult(old.name, new.name, "swapped", time.monotonic() - down_from, phases,
                        f"{new.name} serves on {launched.url} (after an interrupted swap)", launched.url, launched.model)
    _finish(result)
    return result


def _healthy(container: ContainerInfo) -> bool:
    url = container.labels.get(LABEL_ENDPOINT)
    if not url:
        return False
    from metralectl.core.contract import Readiness
    from metralectl.lifecycle.readiness import health_now

    return health_now(url, Readiness(), 1.0, engine_headers(container.labels)).kind == "ready"
