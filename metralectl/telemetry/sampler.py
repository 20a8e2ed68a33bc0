"""The GPU sampler: its own thread, absolute deadlines, a bounded ring of samples.

Why a thread and not an asyncio task: an NVML energy-counter read blocks for 3-16 ms on an H200, which
would stall every other coroutine. Why absolute deadlines (t0 + k·period on a monotonic clock) and not
sleep(period): sleeping accumulates every read's duration and every wake-up's lateness as drift.

Ticks run at max(hz, power_hz). Every tick reads power (µs; feeds open energy windows); every
(tick_hz / hz)-th tick takes a sample into the ring, refreshing the slow fields (memory, processes,
limits) at detail_hz; energy counters are read at energy_hz (reset detection, live counters) and at
every window edge. Measured on an H200 (driver 580): a sample with the slow fields costs ~0.5 ms of
CPU and an energy-counter read ~4 ms of CPU (17 ms p99 wall) — hence the low default rates for both;
at the defaults the sampler used 0.55 % of one core there, every field at 10 Hz 6.3 %. Window edges
are served on this thread as soon as they are asked for, so the counter reads never land on the
caller's thread or event loop.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, InvalidStateError
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from metralectl.errors import MetralError
from metralectl.seams.gpu import GpuProbe
from metralectl.core.gpudata import EnergyReading, GpuSample, PowerReading
from metralectl.telemetry.energy import MIN_INSTANT_HZ, Scope, WindowAccumulator, WindowData

Callback = Callable[["Sample"], None]


@dataclass(frozen=True)
class Sample:
    seq: int
    t: float  # monotonic seconds at wake-up
    wall: float  # time.time() at wake-up, for records others will read
    lateness_s: float  # wake-up minus its absolute deadline: the sampler's own jitter
    read_s: float  # how long the NVML reads of this tick took
    gpus: tuple[GpuSample, ...]
    energy: tuple[EnergyReading, ...] | None  # None: counters not read on this tick

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "t": self.t, "wall": self.wall, "lateness_s": self.lateness_s,
                "read_s": self.read_s, "gpus": [g.to_json() for g in self.gpus],
                "energy": None if self.energy is None else {e.uuid: e.energy_mj for e in self.energy}}


@dataclass(frozen=True)
class SamplerStats:
    running: bool
    hz: float
    tick_hz: float
    detail_hz: float
    energy_hz: float
    ticks: int
    samples: int
    missed_ticks: int  # deadlines skipped because a tick ran past the next one
    wall_s: float
    cpu_s: float  # CPU time of the sampler thread itself (user + system)
    cpu_pct: float | None  # of one core
    lateness_p50_s: float | None
    lateness_p99_s: float | None
    lateness_max_s: float | None
    read_p50_s: float | None
    read_p99_s: float | None
    energy_read_p50_s: float | None
    energy_read_p99_s: float | None
    callback_errors: int
    error: str | None


class EnergyWindow:
    """An open energy window. `started` resolves to the start time once the edge counters are read;
    `result` to WindowData once closed. Both are concurrent Futures (asyncio: `asyncio.wrap_future`)."""

    def __init__(self) -> None:
        self.started: Future[float] = Future()
        self.result: Future[WindowData] = Future()
        self._acc: WindowAccumulator | None = None

    def data(self, timeout: float | None = None) -> WindowData:
        return self.result.result(timeout)


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class Sampler:
    def __init__(
        self,
        probe: GpuProbe,
        *,
        hz: float = 10.0,
        power_hz: float | Literal["auto"] | None = "auto",
        detail_hz: float = 1.0,
        energy_hz: float | None = 0.2,
        capacity: int = 6000,
        stats_window: int = 20000,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        name: str = "metralectl-telemetry",
    ) -> None:
        """hz: full samples into the ring. power_hz: extra power-only ticks for energy integration;
        "auto" = 20 Hz when some GPU has no energy counter (the integral is then the measurement), else
        none. detail_hz: memory/processes/limits refresh. energy_hz: periodic counter reads (an H200
        spends ~4 ms of CPU per read, so rarely; window edges always read them)."""
        if hz <= 0 or detail_hz <= 0:
            raise MetralError(f"sampling rates must be positive, not hz={hz} detail_hz={detail_hz}")
        self._probe = probe
        self.hz = hz
        self._power_auto = power_hz == "auto"
        self._detail_hz = detail_hz
        self.energy_hz = min(energy_hz or 0.0, hz)
        self._configure(None if power_hz == "auto" else power_hz)
        self._clock, self._wall, self._name = clock, wall, name
        self._ring: collections.deque[Sample] = collections.deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._callbacks: tuple[tuple[Callback, Callable[[BaseException], None] | None], ...] = ()
        self._requests: collections.deque[tuple[str, EnergyWindow]] = collections.deque()
        self._windows: list[EnergyWindow] = []
        self._wake = threading.Event()
        self._first = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._lateness: collections.deque[float] = collections.deque(maxlen=stats_window)
        self._reads: collections.deque[float] = collections.deque(maxlen=stats_window)
        self._energy_reads: collections.deque[float] = collections.deque(maxlen=stats_window)
        self._ticks = self._samples = self._missed = self._callback_errors = 0
        self._cpu_s = 0.0
        self._started_at: float | None = None
        self._stopped_at: float | None = None
        self._error: BaseException | None = None
        self._scope_unified = False

    def _configure(self, power_hz: float | None) -> None:
        self.tick_hz = max(self.hz, power_hz or 0.0)
        self._full_stride = max(1, round(self.tick_hz / self.hz))
        # detail and energy reads ride on full ticks, so their strides are multiples of the full stride
        self._detail_stride = max(1, round(self.hz / min(self._detail_hz, self.hz))) * self._full_stride
        self._energy_stride = (max(1, round(self.hz / self.energy_hz)) * self._full_stride) if self.energy_hz else 0

    # -- control --------------------------------------------------------------------------------
    def start(self) -> Sampler:
        if self._thread is not None:
            raise MetralError("the sampler was already started")
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def __enter__(self) -> Sampler:  # noqa: PYI034 - Self needs 3.11 or typing_extensions
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    @property
    def error(self) -> BaseException | None:
        """Why the sampler stopped on its own (e.g. GpuLost), else None."""
        return self._error

    # -- reading --------------------------------------------------------------------------------
    def latest(self, timeout: float | None = None) -> Sample | None:
        """The newest sample; with a timeout, wait that long for the first one."""
        if timeout is not None:
            self._first.wait(timeout)
        with self._lock:
            return self._ring[-1] if self._ring else None

    def samples(self, since_seq: int = -1) -> list[Sample]:
        with self._lock:
            return [s for s in self._ring if s.seq > since_seq]

    def subscribe(self, callback: Callback, on_error: Callable[[BaseException], None] | None = None) -> Callable[[], None]:
        """Call `callback(sample)` on the sampler thread after each full sample; keep it quick (post a
        message, call_soon_threadsafe). Returns the unsubscribe function."""
        entry = (callback, on_error)
        with self._lock:
            self._callbacks = (*self._callbacks, entry)

        def unsubscribe() -> None:
            with self._lock:
                self._callbacks = tuple(c for c in self._callbacks if c is not entry)
        return unsubscribe

    # -- energy windows -------------------------------------------------------------------------
    def open_window(self) -> EnergyWindow:
        window = EnergyWindow()
        self._request("open", window)
        return window

    def close_window(self, window: EnergyWindow) -> Future[WindowData]:
        self._request("close", window)
        return window.result

    @contextmanager
    def window(self, timeout: float = 5.0) -> Iterator[EnergyWindow]:
        """`with sampler.window() as w: run_load()` then `w.data()`."""
        w = self.open_window()
        w.started.result(timeout)
        try:
            yield w
        finally:
            self.close_window(w).result(timeout)

    def _request(self, kind: str, window: EnergyWindow) -> None:
        if not self.running:
            raise MetralError("the GPU sampler is not running", str(self._error) if self._error else None)
        self._requests.append((kind, window))
        self._wake.set()
        if self._thread is not None and not self._thread.is_alive():
            self._fail_pending()  # it died between our check and the append: answer, don't hang

    # -- statistics -----------------------------------------------------------------------------
    def stats(self) -> SamplerStats:
        end = self._stopped_at if self._stopped_at is not None else self._clock()
        wall = end - self._started_at if self._started_at is not None else 0.0
        late, reads, ereads = list(self._lateness), list(self._reads), list(self._energy_reads)
        return SamplerStats(
            running=self.running, hz=self.hz, tick_hz=self.tick_hz, detail_hz=self._detail_hz,
            energy_hz=self.energy_hz,
            ticks=self._ticks, samples=self._samples, missed_ticks=self._missed, wall_s=wall, cpu_s=self._cpu_s,
            cpu_pct=100.0 * self._cpu_s / wall if wall > 0 else None,
            lateness_p50_s=percentile(late, 50), lateness_p99_s=percentile(late, 99),
            lateness_max_s=max(late) if late else None,
            read_p50_s=percentile(reads, 50), read_p99_s=percentile(reads, 99),
            energy_read_p50_s=percentile(ereads, 50), energy_read_p99_s=percentile(ereads, 99),
            callback_errors=self._callback_errors, error=None if self._error is None else str(self._error),
        )

    # -- the thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        cpu0 = time.thread_time()
        self._started_at = self._clock()
        k = 0
        try:
            if self._power_auto:
                self._configure(MIN_INSTANT_HZ if any(e.energy_mj is None for e in self._probe.energy()) else None)
            period = 1.0 / self.tick_hz
            t0 = self._clock()
            while not self._stopping:
                deadline = t0 + k * period
                while True:
                    self._serve_requests()
                    delay = deadline - self._clock()
                    if self._stopping or delay <= 0:
                        break
                    if self._wake.wait(delay):
                        self._wake.clear()  # cleared before the next _serve_requests: no lost wake-up
                if self._stopping:
                    break
                now = self._clock()
                late = now - deadline
                if late >= period:
                    # Behind by whole periods (a slow read, a paused VM): skip them, don't burst.
                    skipped = int(late // period)
                    k += skipped
                    self._missed += skipped
                    late -= skipped * period
                self._tick(k, now, late)
                k += 1
                self._cpu_s = time.thread_time() - cpu0
        except BaseException as exc:  # noqa: BLE001 - recorded, surfaced via .error and the futures
            self._error = exc
            for cb, on_error in self._callbacks:
                if on_error is not None:
                    on_error(exc)
        finally:
            self._cpu_s = time.thread_time() - cpu0
            self._stopped_at = self._clock()
            self._stopping = True
            self._fail_pending()

    def _tick(self, k: int, now: float, late: float) -> None:
        self._ticks += 1
        self._lateness.append(late)
        full = k % self._full_stride == 0
        t_read = self._clock()
        gpus: tuple[GpuSample, ...] = ()
        if full:
            gpus = self._probe.sample(detail=k % self._detail_stride == 0)
            powers: tuple[PowerReading, ...] = tuple(g.power for g in gpus)
            self._scope_unified = any(g.memory.kind == "unified" for g in gpus)
        else:
            powers = self._probe.power()
        read_s = self._clock() - t_read
        energy = None
        if full and self._energy_stride and k % self._energy_stride == 0:
            t_e = self._clock()
            energy = self._probe.energy()
            self._energy_reads.append(self._clock() - t_e)
        for w in self._windows:
            assert w._acc is not None
            w._acc.add_power(powers)
            if energy is not None:
                w._acc.add_counters(energy)
        if not full:
            return
        self._reads.append(read_s)
        sample = Sample(self._samples, now, self._wall(), late, read_s, gpus, energy)
        with self._lock:
            self._ring.append(sample)
            callbacks = self._callbacks
        self._samples += 1
        self._first.set()
        for cb, _ in callbacks:
            try:
                cb(sample)
            except Exception:  # noqa: BLE001 - a broken view must not stop sampling; counted in stats
                self._callback_errors += 1

    def _serve_requests(self) -> None:
        while self._requests:
            kind, window = self._requests.popleft()
            powers = self._probe.power()
            t_edge = powers[0].t if powers else self._clock()
            t_e = self._clock()
            counters = self._probe.energy()
            self._energy_reads.append(self._clock() - t_e)
            scope: Scope = "gpu-only" if self._scope_unified else "gpu"
            if kind == "open":
                window._acc = WindowAccumulator(t_edge, counters, powers, scope=scope)
                self._windows.append(window)
                window.started.set_result(t_edge)
            elif window._acc is None or window not in self._windows:
                window.result.set_exception(MetralError("this energy window was never opened on this sampler"))
            else:
                self._windows.remove(window)
                window._acc.scope = scope
                window.result.set_result(window._acc.finish(t_edge, counters, powers))

    def _fail_pending(self) -> None:
        reason = MetralError("the GPU sampler stopped before the energy window closed",
                             str(self._error) if self._error else None)
        pending = [w for _, w in _drain(self._requests)] + self._windows
        self._windows = []
        for window in pending:
            for fut in (window.started, window.result):
                try:
                    fut.set_exception(reason)
                except InvalidStateError:
                    pass  # already answered (a started window, or a race with the other thread)


def _drain(queue: collections.deque[tuple[str, EnergyWindow]]) -> list[tuple[str, EnergyWindow]]:
    out = []
    while True:
        try:
            out.append(queue.popleft())
        except IndexError:
            return out
