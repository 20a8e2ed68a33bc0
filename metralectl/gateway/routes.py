"""Which engine serves which model name, and which models are starting or swapping, as the gateway sees them.

Read from what `ps` reads (lifecycle/local_runtime: the Docker daemon's labelled containers and the host processes
of ours) and from the lifecycle's own traces (the lock's holder, `run R` / `swap to R`, and the swap journal),
never per request: a scan runs on a thread off the event loop, at once when the lifecycle's traces change (a
stat and a flock every LIFECYCLE_POLL_S) or a request names a model nobody serves, else every RESCAN_S. Each
engine answers to its recipe's name and to the ids its own `/v1/models` lists (the served name or alias), asked
once per start of it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from metralectl.core.labels import LABEL_ENDPOINT, LABEL_RECIPE, LABEL_RUN_ID
from metralectl.errors import MetralError
from metralectl.lifecycle.engine_token import engine_headers

if TYPE_CHECKING:
    from metralectl.seams.docker.protocol import ContainerRuntime

LIFECYCLE_POLL_S = 0.05
RESCAN_S = 2.0


@dataclass(frozen=True)
class Route:
    recipe: str
    url: str  # the engine's base URL (its endpoint label)
    host: str
    port: int
    names: tuple[str, ...]  # the recipe's name first, then the ids the engine lists
    models: tuple[str, ...] = ()  # the ids the engine's /v1/models lists (an upstream request names the first)
    owned_by: str | None = None  # what the engine's /v1/models says owns them (llamacpp, vllm, metrale: bench reads it)
    # what every request to it carries: metralectl's engine token when it asks it (lifecycle/engine_token.py), in
    # place of the client's own key, which is never passed on
    upstream: tuple[tuple[str, str], ...] = field(default=(), repr=False, compare=False)


@dataclass(frozen=True)
class Table:
    routes: tuple[Route, ...] = ()
    starting: frozenset[str] = frozenset()  # names whose engine a run/swap/repair is starting or replacing
    holder: str | None = None  # the lifecycle lock's holder ("swap to R (pid N)")
    phase: str | None = None  # the swap journal's phase
    error: str | None = None  # the last scan's failure (the previous routes are kept)
    by_name: dict[str, Route] = field(default_factory=dict)
    exited: dict[str, str] = field(default_factory=dict)  # name -> recipe, for recipes whose engine's record is
    # there but its process is not (it crashed or was killed: a stop removes the record), and the names they had

    def find(self, name: str) -> Route | None:
        return self.by_name.get(name)

    def served_names(self) -> list[str]:
        return sorted(self.by_name)


def _holder_recipe(holder: str | None) -> str | None:
    """`run R (pid N)` / `run R (agent) (pid N)` / `swap to R (pid N)`: R; anything else (stop, repair): None."""
    if not holder:
        return None
    words = holder.split()
    if len(words) >= 3 and words[0] == "swap" and words[1] == "to":
        return words[2]
    if len(words) >= 2 and words[0] == "run":
        return words[1]
    return None


def _endpoint(url: str) -> tuple[str, int] | None:
    try:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            return None
        return parts.hostname, parts.port
    except ValueError:
        return None


class Scanner:
    """Builds Tables; its methods block (files, the runtime, the engines' /v1/models): call them on a thread."""

    def __init__(self, runtime_factory: Callable[[], ContainerRuntime] | None = None) -> None:
        self._runtime_factory = runtime_factory
        self._runtime: ContainerRuntime | None = None
        self._models: dict[tuple[str, str], tuple[tuple[str, ...], str | None]] = {}  # (run id, url) -> ids, owner
        self._aliases: dict[str, str] = {}  # every name once served -> its recipe (a swap's journal names recipes)
        self._lock = threading.Lock()

    def lifecycle(self) -> tuple[str | None, dict[str, Any] | None]:
        """(the lock's holder, the swap journal): what says a model is being started or replaced."""
        from metralectl.lifecycle.swap_journal import journal_path
        from metralectl.seams import store

        holder = store.lock_holder()
        journal = store.read_json(journal_path()) if journal_path().exists() else None
        return holder, journal if isinstance(journal, dict) else None

    def _open(self) -> ContainerRuntime:
        if self._runtime is None:
            if self._runtime_factory is not None:
                self._runtime = self._runtime_factory()
            else:
                from metralectl.lifecycle.local_runtime import open_local

                self._runtime = open_local(need_docker=False, timeout=5.0)
        return self._runtime

    def close(self) -> None:
        if self._runtime is not None:
            self._runtime.close()
            self._runtime = None

    def _engine_models(self, run_id: str, url: str,
                       headers: dict[str, str]) -> tuple[tuple[str, ...], str | None] | None:
        key = (run_id, url)
        if key in self._models:
            return self._models[key]
        from metralectl.seams.endpoint import EngineClient

        try:
            with EngineClient(url, timeout=1.0, headers=headers) as client:
                data = client.get_json("/v1/models")
        except MetralError:
            return None
        listed = data.get("data") if isinstance(data, dict) else None
        if not isinstance(listed, list):
            return None  # not ready yet (llama-server answers 503 while it loads): asked again next scan
        entries = [m for m in listed if isinstance(m, dict) and isinstance(m.get("id"), str)]
        owner = entries[0].get("owned_by") if entries else None
        found = tuple(str(m["id"]) for m in entries), owner if isinstance(owner, str) else None
        self._models[key] = found
        return found

    def scan(self) -> Table:
        with self._lock:
            holder, journal = self.lifecycle()
            try:
                containers = self._open().containers(mine=False)
            except (MetralError, OSError) as exc:
                self.close()  # opened again on the next scan (a restarted daemon)
                return Table(holder=holder, error=getattr(exc, "message", str(exc)))
            routes: list[Route] = []
            exited: set[str] = set()
            for info in containers:
                url, recipe = info.labels.get(LABEL_ENDPOINT, ""), info.labels.get(LABEL_RECIPE, "")
                where = _endpoint(url)
                if not info.running and recipe:
                    exited.add(recipe)
                if not info.running or where is None or not recipe:
                    continue
                try:  # a token that cannot be read: the engine answers 401, which the client sees
                    headers = engine_headers(info.labels)
                except MetralError:
                    headers = {}
                ids, owner = self._engine_models(info.labels.get(LABEL_RUN_ID, info.id), url, headers) or ((), None)
                names = tuple(dict.fromkeys((recipe, *ids)))
                routes.append(Route(recipe, url, where[0], where[1], names, ids, owner, tuple(headers.items())))
                for name in names:
                    self._aliases[name] = recipe
            return self._table(routes, holder, journal, exited)

    def _table(self, routes: list[Route], holder: str | None, journal: dict[str, Any] | None,
               exited: frozenset[str] | set[str] = frozenset()) -> Table:
        by_name: dict[str, Route] = {}
        for route in routes:
            for name in route.names:
                by_name.setdefault(name, route)
        recipes: set[str] = set()
        starting_recipe = _holder_recipe(holder)
        if starting_recipe:
            recipes.add(starting_recipe)
        phase = str(journal.get("phase")) if journal is not None else None
        if journal is not None:
            if holder is not None and phase != "degraded":  # a journal with no holder is an interrupted swap: stale
                for side in ("old", "new"):
                    got = journal.get(side)
                    if isinstance(got, dict) and isinstance(got.get("recipe"), str):
                        recipes.add(got["recipe"])
        starting = {name for name, recipe in self._aliases.items() if recipe in recipes} | recipes
        if journal is not None and holder is not None and phase in ("draining", "stopping-old", "starting-new",
                                                                     "restoring"):
            for name in list(by_name):  # a swap replaces the model at that address: nothing new goes to the old one
                if by_name[name].recipe in recipes:
                    del by_name[name]
        # one record running for it is enough; while the lifecycle lock is held, an exited record may be a stop (or
        # an eviction) between its stop and its removal: not a crash
        exited = set() if holder is not None else exited - {route.recipe for route in routes}
        gone = {**{name: recipe for name, recipe in self._aliases.items() if recipe in exited},
                **{recipe: recipe for recipe in exited}}
        return Table(tuple(routes), frozenset(starting), holder, phase, None, by_name, gone)
