"""What the local API reads and does, behind one protocol: the real one drives the lifecycle over Docker.

Reads answer quickly with values (an unreachable Docker is an answer: {"error", "hint"}). Changes
(run, swap, stop) arrive as a `Change` (app/serving_change.py, read from the POST body) and are done by
app/serving.py's Serving — the same code the CLI and the dashboard run — called by JobRunner
with the lifecycle lock already held.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from metralectl.errors import MetralError

if TYPE_CHECKING:
    from metralectl.app.serving import Change, Serving
    from metralectl.seams.docker.protocol import ContainerRuntime

Emit = Callable[[Any], None]


class Operations(Protocol):
    def capability(self) -> dict[str, Any]: ...

    def serving(self) -> dict[str, Any]: ...

    def recipes(self) -> dict[str, Any]: ...

    def telemetry(self) -> dict[str, Any]: ...

    def history(self) -> dict[str, Any]: ...

    def check(self, change: Change) -> None:
        """Refuse (MetralError) an unknown recipe or a bad --set before any job starts."""

    def apply(self, change: Change, on_event: Emit) -> Any:
        """Do the change (run, swap or stop; the lock is held); its result as JSON (serving.result_json)."""


def error_json(exc: MetralError) -> dict[str, Any]:
    return {"error": exc.message, "hint": exc.hint}


def bench_history(limit: int = 50) -> dict[str, Any]:
    """Benchmark runs recorded under METRALE_HOME/runs/<suite>/, newest first, through the one record reader
    (bench.records: an old record's true status, a dead run shown as interrupted; read-only)."""
    from metralectl.bench import records

    root = records.runs_root()
    runs: list[dict[str, Any]] = []
    for record in records.list_runs()[:limit]:
        path = Path(str(record["_dir"])) / "run.json"
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue  # removed since it was listed
        runs.append({"benchmark": path.parent.parent.name, "file": str(path.relative_to(root)), "mtime": mtime,
                     "signed": path.with_name(path.name + ".sig").exists(),
                     "summary": {k: v for k, v in record.items()
                                 if not k.startswith("_") and (isinstance(v, (str, int, float, bool)) or v is None)}})
    return {"root": str(root), "runs": runs}


class TelemetryFeed:
    """A low-rate GPU sampler for the page (started lazily; an unavailable GPU is an answer)."""

    RETRY_S = 60.0  # a driver that appears later (installed, reloaded) is picked up

    def __init__(self) -> None:
        self._sampler: Any = None
        self._unavailable: dict[str, Any] | None = None
        self._tried = 0.0
        self._lock = threading.Lock()

    def latest(self) -> dict[str, Any]:
        with self._lock:
            if self._sampler is None and (self._unavailable is None or time.monotonic() - self._tried > self.RETRY_S):
                self._tried = time.monotonic()
                self._unavailable = None
                self._open()
        if self._unavailable is not None:
            return self._unavailable
        if self._sampler.error is not None:
            return {"available": False, "reason": f"sampling stopped: {self._sampler.error}"}
        sample = self._sampler.latest(timeout=1.0)
        return {"available": True, "sample": sample.to_json() if sample else None}

    def _open(self) -> None:
        from metralectl.seams.gpu import NvmlProbe
        from metralectl.core.gpudata import GpuUnavailable
        from metralectl.telemetry.sampler import Sampler

        probe = NvmlProbe()
        system = probe.open()
        if isinstance(system, GpuUnavailable):
            self._unavailable = system.to_json()
            return
        self._sampler = Sampler(probe, hz=2.0, power_hz=None, energy_hz=None).start()

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()


class LifecycleOps:
    """The real operations: doctor-based capability, the Docker runtime, the catalog, the lifecycle."""

    def __init__(self, capability: Callable[[], dict[str, Any] | None], telemetry: TelemetryFeed | None = None,
                 serving: Serving | None = None) -> None:
        self._capability = capability
        self._telemetry = telemetry or TelemetryFeed()
        self._changes = serving  # built on first use (lock_held: JobRunner holds the lifecycle lock)

    def capability(self) -> dict[str, Any]:
        answer = self._capability()
        return answer if answer is not None else {"can_run": None, "summary": "checking…", "problems": [], "checks": []}

    def _runtime(self, timeout: float = 10.0) -> ContainerRuntime:
        from metralectl.lifecycle.local_runtime import open_local  # containers and host processes

        return open_local(timeout=timeout)

    def serving(self) -> dict[str, Any]:
        """Every served model (status.collect) and this box's gateways, each read from its own /metrics
        (gateway/watch.py; one whose process is gone is `gone`)."""
        from metralectl.gateway.watch import observe
        from metralectl.lifecycle import status

        gateways = [g.to_json() for g in observe()]
        try:
            with self._runtime() as runtime:
                return {**status.collect(runtime).to_json(), "gateways": gateways}
        except MetralError as exc:
            return {"serving": [], "gateways": gateways, **error_json(exc)}

    def recipes(self) -> dict[str, Any]:
        """The library rows, each with `fit_note` (why FITS is not yes, app/library_words) and `blocked`
        (why Run/Swap cannot go here whatever serves, with the page's launch options — it pulls what is
        missing — as the launch would say it; None also when Docker cannot be asked: `docker` says why)."""
        from metralectl.app import library
        from metralectl.app.library_words import fit_words
        from metralectl.core.catalog import load_catalog
        from metralectl.lifecycle.launch import LaunchOptions

        catalog = load_catalog()
        target = library.choose_target(catalog, None)
        rows = library.rows(catalog, target)
        refusals: dict[str, Any] = {}
        docker: dict[str, Any] | None = None
        try:
            with self._runtime() as runtime:
                refusals = library.blocked(catalog, [r.name for r in rows], runtime, LaunchOptions())
        except MetralError as exc:
            docker = error_json(exc)
        recipes = []
        for r in rows:
            refused = refusals.get(r.name)
            recipes.append({**r.to_json(), "fit_note": fit_words(r.fits, r.fits_reason),
                            "blocked": error_json(refused.error) if refused is not None else None})
        return {"target": {"hardware": target.hardware, "how": target.how}, "recipes": recipes, "docker": docker}

    def telemetry(self) -> dict[str, Any]:
        return self._telemetry.latest()

    def history(self) -> dict[str, Any]:
        return bench_history()

    def _serving(self) -> Serving:
        if self._changes is None:
            from metralectl.app.serving import Serving

            self._changes = Serving(lock_held=True)  # JobRunner holds the lifecycle lock for the job
        return self._changes

    def check(self, change: Change) -> None:
        if change.kind != "stop":
            self._serving().resolve(change)

    def apply(self, change: Change, on_event: Emit) -> Any:
        from metralectl.app.serving import result_json

        return result_json(self._serving().apply(change, on_event))

    def close(self) -> None:
        self._telemetry.close()


def static_dir() -> Path:
    return Path(__file__).resolve().parent / "static"
