"""What runs behind `metralectl top` (and later the TUI): the GPU sampler, an engine /metrics poller
in its own thread, and a TopModel turning both into TopViews. No printing; the seams (NVML, Docker,
HTTP) come in through factories, so tests drive it with fakes.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from metralectl.errors import NOTHING_SERVED, MetralError
from metralectl.seams.gpu import GpuProbe
from metralectl.core.gpudata import GpuSystem, GpuUnavailable
from metralectl.core.engine_profile import MetricsMap
from metralectl.telemetry.engine_metrics import UNKNOWN_ENGINE, catalog_maps, parse_metrics, unknown_engine_note
from metralectl.telemetry.sampler import Sample, Sampler
from metralectl.telemetry.thermal import ThermalLines
from metralectl.telemetry.engine_view import EngineObservation, EngineState, EngineTarget
from metralectl.telemetry.gateway_view import GatewayRow
from metralectl.telemetry.view import RATE_WINDOW_S, TopModel, TopView

if TYPE_CHECKING:
    from metralectl.seams.docker.protocol import ContainerRuntime
    from metralectl.seams.docker.shared import SharedRuntime

NO_ENGINE = f"no engine: {NOTHING_SERVED} (`metralectl run RECIPE`, or --url for another engine)"
Discovery = Callable[[], "tuple[list[EngineTarget], str | None]"]
Gateways = Callable[[], "list[GatewayRow]"]  # gateway/watch.observe: this box's gateways, each read once


class MetricsClient(Protocol):
    def metrics_text(self) -> str: ...

    def close(self) -> None: ...


class ClientFactory(Protocol):
    """(url, timeout_s, headers): a client of one engine's /metrics; headers carry the engine token when it asks it."""

    def __call__(self, url: str, timeout_s: float, headers: dict[str, str] | None, /) -> MetricsClient: ...


def discover_engines(
    runtime_factory: Callable[[], ContainerRuntime] | None = None,
) -> tuple[list[EngineTarget], str | None]:
    """The engines metralectl serves on this box (any owner's), from the daemon's labelled containers:
    (targets, None), or ([], why none) — no Docker is a note, not an error."""
    from metralectl.core.labels import LABEL_ENDPOINT, LABEL_ENGINE, LABEL_RECIPE

    try:
        if runtime_factory is None:  # this machine's containers and host processes
            from metralectl.lifecycle.local_runtime import open_local
            runtime_factory = open_local
        with runtime_factory() as runtime:
            containers = runtime.containers(mine=False, all_states=False)
    except MetralError as exc:
        return [], f"no engine found: {exc.message}"
    targets = [EngineTarget(c.labels[LABEL_ENDPOINT], c.name, c.labels.get(LABEL_RECIPE), "container",
                            c.labels.get(LABEL_ENGINE), dict(c.labels))
               for c in containers if c.running and c.labels.get(LABEL_ENDPOINT)]
    _OURS.clear()
    _OURS.update({c.id: c.name for c in containers})
    return targets, None if targets else NO_ENGINE


def _open_local() -> ContainerRuntime:
    from metralectl.lifecycle.local_runtime import open_local  # this machine's containers and host processes

    return open_local()


_OURS: dict[str, str] = {}  # container id -> name of metralectl's running containers (last discovery)


class EngineDiscovery:
    """discover_engines over one kept Docker connection: `top` and the dashboard rediscover every few
    seconds for as long as they run, and a connection per round cost a socket, a ping and (for ssh://)
    a process each time. The connection is reopened only after it failed (the daemon restarted);
    `close()` (TopSession.close) ends it. `runtime`: a SharedRuntime to borrow instead (not closed here)."""

    def __init__(self, runtime_factory: Callable[[], ContainerRuntime] | None = None, *,
                 runtime: SharedRuntime | None = None) -> None:
        from metralectl.seams.docker.shared import SharedRuntime

        self._owned = runtime is None
        self.runtime = runtime if runtime is not None else SharedRuntime(runtime_factory or _open_local)

    def __call__(self) -> tuple[list[EngineTarget], str | None]:
        return discover_engines(self.runtime)

    def close(self) -> None:
        if self._owned:
            self.runtime.close()


def our_container_of(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The metralectl container a GPU process (host PID) runs in, from /proc/PID/cgroup; None otherwise."""
    from metralectl.doctor.host_checks import container_id_of_pid

    container_id = container_id_of_pid(proc_root, pid)
    return _OURS.get(container_id) if container_id else None


def engine_metric_maps() -> tuple[MetricsMap, ...]:
    """Every catalog engine's metrics mapping (engine_metrics.catalog_maps: none when the catalog cannot be read)."""
    return catalog_maps()


def fixed_targets(urls: Sequence[str], labels: Callable[[str], dict[str, str] | None] | None = None) -> Discovery:
    """The engines at urls; labels(url): the labels of this box's engine there, if one is (its token goes with it)."""
    targets = [EngineTarget(u.rstrip("/"), None, None, "url", None, (labels(u.rstrip("/")) if labels else None) or {})
               for u in urls]
    return lambda: (list(targets), None)


@dataclass
class _Engine:
    target: EngineTarget
    client: MetricsClient
    snapshots: collections.deque[Any]
    error: str | None = None
    state: EngineState = "ok"
    model: str | None = None
    model_asked: bool = False


class EnginePoller:
    """Scrapes every engine's /metrics each `interval_s` on its own thread (a hung engine never stalls
    the display), keeping the snapshots of the trailing `window_s` for rates. Targets are rediscovered
    every `rediscover_s` (a swap or a new `run` shows up by itself)."""

    def __init__(self, discover: Discovery, *, interval_s: float = 1.0, window_s: float = RATE_WINDOW_S,
                 client_factory: ClientFactory | None = None,
                 rediscover_s: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 gateways: Gateways | None = None) -> None:
        self._discover = discover
        self._observe_gateways = gateways
        self._gateways: list[GatewayRow] = []
        self.interval_s = interval_s
        self.window_s = window_s
        self._client_factory = client_factory or _http_client
        self._timeout_s = min(2.0, max(0.5, interval_s))
        self._rediscover_s = rediscover_s
        self._clock = clock
        self._engines: dict[str, _Engine] = {}
        self._note: str | None = "looking for engines…"
        self._discovered_at: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._maps: tuple[MetricsMap, ...] | None = None  # every engine's metrics mapping, read once

    def poll_once(self) -> None:
        now = self._clock()
        if self._discovered_at is None or now - self._discovered_at >= self._rediscover_s:
            self._rediscover()
            self._discovered_at = now
        for engine in list(self._engines.values()):
            self._scrape(engine)
        if self._observe_gateways is not None:
            rows = self._observe_gateways()  # on this thread: a gateway that hangs never stalls the display
            with self._lock:
                self._gateways = rows

    def gateways(self) -> list[GatewayRow]:
        with self._lock:
            return list(self._gateways)

    def _rediscover(self) -> None:
        targets, note = self._discover()
        with self._lock:
            self._note = note
            if note is not None and not targets and self._engines and note != NO_ENGINE:
                return  # Docker hiccup: keep watching what we had rather than blanking the view
            wanted = {t.url: t for t in targets}
            for url in [u for u in self._engines if u not in wanted]:
                self._engines.pop(url).client.close()
            for url, target in wanted.items():
                if url in self._engines:
                    self._engines[url].target = target
                else:
                    keep = max(2, math.ceil(self.window_s / self.interval_s) + 1)
                    self._engines[url] = _Engine(target, self._client(target),
                                                 collections.deque(maxlen=keep))

    def _client(self, target: EngineTarget) -> MetricsClient:
        """A client of one engine, with the engine token when the engine asks it (llama-server's /metrics does);
        a token that cannot be read leaves the scrape to say 401."""
        from metralectl.lifecycle.engine_token import engine_headers

        try:
            headers = engine_headers(target.labels)
        except MetralError:
            headers = {}
        return self._client_factory(target.url, self._timeout_s, headers)

    def _scrape(self, engine: _Engine) -> None:
        t = self._clock()
        try:
            text = engine.client.metrics_text()
        except MetralError as exc:
            self._failed(engine, exc.message, "unreachable")
            return
        if self._maps is None:
            self._maps = engine_metric_maps()
        try:
            snapshot = parse_metrics(text, t=t, candidates=self._maps)
        except MetralError as exc:
            self._failed(engine, exc.message, "bad-metrics")
            return
        with self._lock:
            engine.snapshots.append(snapshot)
            while len(engine.snapshots) > 2 and t - engine.snapshots[1].t >= self.window_s:
                engine.snapshots.popleft()  # keep one snapshot at or just past the window's start
            engine.error, engine.state = None, "ok"
            ask_model = not engine.model_asked
            engine.model_asked = True
            if snapshot.engine == UNKNOWN_ENGINE.engine:
                engine.error, engine.state = unknown_engine_note(text), "unknown-engine"

        if ask_model:
            engine.model = _served_model(engine.client)

    def _failed(self, engine: _Engine, message: str, state: EngineState) -> None:
        with self._lock:
            engine.snapshots.clear()  # no stale numbers under an "unreachable" badge
            engine.error, engine.state = message, state

    def observations(self) -> tuple[list[EngineObservation], str | None]:
        with self._lock:
            obs = [EngineObservation(e.target, tuple(e.snapshots), e.error, e.state, e.model)
                   for e in self._engines.values()]
            return obs, self._note

    def start(self) -> EnginePoller:
        self._thread = threading.Thread(target=self._run, name="metralectl-engine-poller", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        next_t = self._clock()
        while not self._stop.is_set():
            self.poll_once()
            next_t += self.interval_s
            self._stop.wait(max(0.0, next_t - self._clock()))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._timeout_s + 1.0)
        with self._lock:
            for engine in self._engines.values():
                engine.client.close()
        close = getattr(self._discover, "close", None)  # EngineDiscovery's kept Docker connection
        if close is not None:
            close()


def _served_model(client: MetricsClient) -> str | None:
    """The engine's served model id, asked once per engine after its first good scrape (None when it does not say)."""
    ask = getattr(client, "served_model", None)
    if ask is None:
        return None
    try:
        model = ask()
    except MetralError:
        return None
    return model[:200] if isinstance(model, str) and model else None


def _http_client(url: str, timeout_s: float, headers: dict[str, str] | None = None, /) -> MetricsClient:
    from metralectl.seams.endpoint import EngineClient

    return EngineClient(url, timeout=timeout_s, headers=headers)


class TopSession:
    """The sampler + the engine poller + the model. `start()`, then `view()` as often as the display
    wants (it only copies a few samples), then `close()`."""

    def __init__(self, probe: GpuProbe, discover: Discovery, lines: dict[str, ThermalLines], *,
                 interval_s: float = 1.0, hz: float = 10.0, energy_hz: float = 1.0,
                 rate_window_s: float | None = None, notes: Sequence[str] = (),
                 client_factory: ClientFactory | None = None,
                 wall: Callable[[], float] = time.time, gateways: Gateways | None = None) -> None:
        self.interval_s = interval_s
        self._probe = probe
        # rates cover at least one interval, so each record's rates span the time since the last one
        window = rate_window_s if rate_window_s is not None else max(RATE_WINDOW_S, interval_s)
        self._hz, self._energy_hz, self._window = hz, energy_hz, window
        self.model = TopModel(lines, rate_window_s=window)
        self.poller = EnginePoller(discover, interval_s=interval_s, window_s=window,
                                   client_factory=client_factory, gateways=gateways)
        self.gpu: GpuSystem | GpuUnavailable = GpuUnavailable("not opened yet")
        self.sampler: Sampler | None = None
        self._notes = tuple(notes)
        self._wall = wall

    def start(self, *, poll_thread: bool = True) -> TopSession:
        self.gpu = self._probe.open()
        if isinstance(self.gpu, GpuSystem):
            capacity = math.ceil(self._hz * (self._window + 2))
            self.sampler = Sampler(self._probe, hz=self._hz, energy_hz=self._energy_hz,
                                   capacity=capacity).start()
            self.sampler.latest(timeout=1.0)
        if poll_thread:
            self.poller.start()
        return self

    def samples(self) -> list[Sample]:
        return self.sampler.samples() if self.sampler is not None else []

    def wait_for_energy(self, readings: int = 2, timeout_s: float = 3.0) -> None:
        """Block until the ring holds `readings` counter reads (the --once rate needs two), or timeout."""
        if self.sampler is None:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.sampler.running:
            if sum(1 for s in self.sampler.samples() if s.energy) >= readings:
                return
            time.sleep(0.05)

    def view(self) -> TopView:
        gpu: GpuSystem | GpuUnavailable = self.gpu
        samples = self.samples()
        stats = self.sampler.stats() if self.sampler is not None else None
        if self.sampler is not None and self.sampler.error is not None:
            err = self.sampler.error
            gpu = GpuUnavailable(f"the GPU sampler stopped: {err}", getattr(err, "hint", None),
                                 type(err).__name__)
            samples = []
        engines, note = self.poller.observations()
        return self.model.view(gpu=gpu, samples=samples, engines=engines,
                               engine_note=None if engines else note,
                               wall=samples[-1].wall if samples else self._wall(),
                               interval_s=self.interval_s, sampler=stats, notes=self._notes,
                               container_of=our_container_of, gateways=self.poller.gateways())

    def close(self) -> None:
        self.poller.stop()
        if self.sampler is not None:
            self.sampler.stop()
        self._probe.close()


class Recorder:
    """`--record FILE`: one JSON object per line, each written with a single O_APPEND write
    (store.append_jsonl). A fragment left by a writer killed mid-line is cut off when recording starts
    again, so the file stays valid JSONL."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        drop_torn_tail(path)

    def write(self, record: dict[str, Any]) -> None:
        from metralectl.seams.store import append_jsonl

        append_jsonl(self.path, record)
        self.records += 1


def drop_torn_tail(path: Path) -> None:
    """Truncate a file after its last newline (a record cut by a kill is not JSON)."""
    try:
        with path.open("rb+") as fh:
            size = fh.seek(0, 2)
            if size == 0:
                return
            fh.seek(size - 1)
            if fh.read(1) == b"\n":
                return
            pos = size
            while pos > 0:
                step = min(65536, pos)
                fh.seek(pos - step)
                chunk = fh.read(step)
                cut = chunk.rfind(b"\n")
                if cut >= 0:
                    fh.truncate(pos - step + cut + 1)
                    return
                pos -= step
            fh.truncate(0)
    except FileNotFoundError:
        return
