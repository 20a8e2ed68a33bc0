"""Closed-loop (fixed concurrency) and open-loop (constant / Poisson arrivals) load in one process.

Phases: warm-up (by count or seconds; not measured) -> measured window (by count or seconds) ->
drain. During drain the load goes on as unmeasured filler until every measured request finished, so
the last measured requests see the same load as the first; then the fillers are cancelled.
A request belongs to the phase in which it was *sent*. Parsing happens after the load (results.analyse).

Every request is on record from the moment it is sent: a measured request still running when the drain
timeout passes, or when the run is stopped (Ctrl-C), is kept and marked, never dropped. A stage whose
requests keep failing at the transport level (refused, connect errors, HTTP errors) stops sending after
a short run of failures instead of firing the rest of its load into a server that says no.

Client health is measured alongside: ready-queue delay of the event loop (how long a just-arrived
read waits before it is stamped), CPU of the loop's thread, and open-loop dispatch lateness.
"""

from __future__ import annotations

import asyncio
import gc
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from metralectl.bench.results import RequestResult, analyse
from metralectl.bench.sse import END_CANCELLED, RawResponse
from metralectl.bench.stats import summarize
from metralectl.bench.transport import Transport, make_transport

perf_ns = time.perf_counter_ns


@dataclass(frozen=True)
class Planned:
    """One request to send: the JSON body and what the suite expects of it."""

    body: bytes
    expected_prompt_tokens: int | None = None
    tag: str | None = None
    keep_content: bool = False
    max_tokens: int | None = None  # the output length asked for (short outputs are counted)


@dataclass(frozen=True)
class LoadSpec:
    mode: str = "concurrency"  # "concurrency" | "constant" | "poisson" | "trace" (arrivals at `schedule`)
    concurrency: int = 1  # closed loop: streams; open loop: most requests in flight (pool width)
    rate: float | None = None  # open loop: requests per second
    warmup_requests: int = 0
    warmup_s: float = 0.0
    requests: int | None = None  # measured requests (count-bounded window) ...
    duration_s: float | None = None  # ... or a measured window of this length
    timeout_s: float = 300.0
    drain_timeout_s: float = 120.0
    seed: int = 0
    transport: str = "raw"
    probe_interval_s: float = 0.005
    progress_every_s: float = 2.0  # drain progress cadence
    tokenizer: str = ""  # tokenizer.json to count output tokens when the server reports no usage
    schedule: tuple[float, ...] = ()  # mode "trace": request i is sent schedule[i] seconds after t0, then no more

    @property
    def breaker(self) -> int:
        """Consecutive failed requests after which a stage stops sending: every stream has seen a failure
        (or five in a row for narrow loads), so a refusal is not one unlucky request."""
        return max(5, self.concurrency)

    @property
    def open_loop(self) -> bool:
        return self.mode in ("constant", "poisson", "trace")


@dataclass
class WorkerOutcome:
    results: list[RequestResult]
    window: tuple[int, int] | None  # measured window, perf_counter_ns
    health: dict[str, Any]
    t0: int
    cancelled: bool = False
    raw: list[RawResponse] = field(default_factory=list, repr=False)
    t0_unix_ns: int = 0  # wall-clock time of t0, to match request lines with server logs
    aborted: str | None = None  # why the stage stopped sending early (the failure breaker)
    drain_timed_out: bool = False


Progress = Callable[[str, dict[str, Any]], None]


class _State:
    def __init__(self, spec: LoadSpec, t0: int) -> None:
        self.spec = spec
        self.t0 = t0
        self.sent = 0
        self.sent_measured = 0
        self.t_measure: int | None = None if (spec.warmup_requests or spec.warmup_s) else t0
        self.t_end: int | None = None
        # open loop: when the next request falls due; the window waits for the dispatcher to reach its end
        self.due_next = sys.maxsize if not spec.open_loop else t0
        self.pending_measured = 0
        self.all_measured_done = asyncio.Event()
        self.records: list[tuple[int, str, int | None, RawResponse, Planned]] = []
        self.failures_in_a_row = 0
        self.stopped: str | None = None  # the breaker tripped: nothing more is sent
        self.aborted: str | None = None  # ... and it tripped while warming up or measuring: the stage failed
        self.last_failure: str | None = None

    def note_end(self, raw: RawResponse, phase: str) -> None:
        """Feed the failure breaker with a finished request (transport-level outcome only; the stream's
        events are judged after the load). Tripped during the drain, it only stops the unmeasured filler:
        what was measured stands on its own."""
        failed = raw.error is not None or (raw.status is not None and raw.status != 200)
        if not failed:
            self.failures_in_a_row = 0
            return
        self.failures_in_a_row += 1
        self.last_failure = raw.error or f"HTTP {raw.status}"
        if self.stopped is None and self.failures_in_a_row >= self.spec.breaker:
            self.stopped = (f"stopped sending after {self.failures_in_a_row} failed requests in a row "
                            f"(last: {self.last_failure[:120]})")
            if phase != "drain":
                self.aborted = self.stopped
            if self.t_end is None:
                self.t_end = -1  # the window closes; in-flight measured requests still end on their own

    def phase_for_send(self, now: int) -> str:
        """Decide the phase of the request about to be sent (and open/close the window)."""
        s = self.spec
        if self.t_measure is None:
            warm_time = s.warmup_s and now - self.t0 < s.warmup_s * 1e9
            warm_count = s.warmup_requests and self.sent < s.warmup_requests
            if warm_time or warm_count:
                return "warmup"
            self.t_measure = now
        if self.t_end is not None:
            return "drain"
        if s.duration_s is not None and now - self.t_measure >= s.duration_s * 1e9:
            self.t_end = self.t_measure + int(s.duration_s * 1e9)
            return "drain"
        if s.requests is not None and self.sent_measured >= s.requests:
            self.t_end = -1  # closed by the completion of the last measured request
            return "drain"
        return "measure"


OPEN_LOOP_PREWARM = 2  # connections an open-loop run opens before its schedule; warm-up opens what the rate needs


def prewarm_for(spec: LoadSpec) -> int:
    """Connections to open before the load. A closed loop uses all of its streams at once: every one. An open
    loop's pool is a ceiling (max_inflight, 256 by default), not what the rate uses: opened up front, those idle
    connections held a llama-server's HTTP threads (slots + 2 by default, one connection each) and every request
    sent on another waited for an idle one's keep-alive timeout (5 s). Its warm-up opens the few it needs."""
    if not spec.open_loop:
        return spec.concurrency
    return min(spec.concurrency, OPEN_LOOP_PREWARM)


async def run_worker(spec: LoadSpec, url: str, path: str, plan: Callable[[int], Planned], *, worker: int = 0,
                     index_stride: int = 1, start_ns: int | None = None, rate_share: float = 1.0,
                     phase_offset_s: float = 0.0, headers: dict[str, str] | None = None,
                     transport: Transport | None = None, keep_raw: bool = False,
                     on_progress: Progress | None = None) -> WorkerOutcome:
    """Run the load; `start_ns` aligns workers of a sharded run (all share one window)."""
    pool = spec.concurrency
    tr = transport
    if tr is None:  # a sharded worker hands in its transport already connected
        tr = make_transport(spec.transport, url, path, pool, headers)
        await tr.open(prewarm_for(spec))
    loop = asyncio.get_running_loop()
    # A full garbage collection over a heap of stamped pieces stalls the loop for tens of ms (seen: 34 ms
    # at 64 streams), which lands in every stamp of that moment; nothing in the hot path makes cycles. It
    # runs before the schedule is anchored (t0): in a process with a large heap it can take hundreds of ms,
    # and an open-loop schedule anchored before it would send that backlog in a burst, after warm-up.
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    if start_ns is not None:
        try:
            await asyncio.sleep(max(0.0, (start_ns - perf_ns()) / 1e9))
        except BaseException:
            if gc_was_enabled:
                gc.enable()
            raise
    t0 = start_ns or perf_ns()
    t0_unix_ns = time.time_ns() - (perf_ns() - t0)
    state = _State(spec, t0)
    lag: list[float] = []
    slips: list[float] = []
    queued = 0
    stopping = False
    cancelled = False
    in_flight: set[asyncio.Task[Any]] = set()

    def take_phase(t: int) -> str:
        phase = state.phase_for_send(t)
        if phase == "measure":
            state.sent_measured += 1
            state.pending_measured += 1
        state.sent += 1
        return phase

    def release(phase: str) -> None:
        if phase == "measure":
            state.pending_measured -= 1
            if state.t_end is not None and state.pending_measured == 0:
                state.all_measured_done.set()

    async def one(index: int, t_sched: int | None, due_phase: str | None = None) -> bool:
        """Send one request. An open-loop request's phase was taken when it fell due (`due_phase`): one
        due inside the window belongs to it even when a stalled loop sends it late (the slip says how late)."""
        if state.stopped is not None:
            if due_phase is not None:
                release(due_phase)
            return False
        now = perf_ns()
        phase = due_phase
        if phase is None:
            if spec.concurrency == 1 and state.phase_for_send(now) == "drain":
                return False  # one stream: no load to keep up for anyone
            phase = take_phase(now)
        planned = plan(index * index_stride + worker)
        raw = RawResponse(now)
        state.records.append((index, phase, t_sched, raw, planned))  # on record before it is sent
        try:
            await tr.stream(planned.body, spec.timeout_s, raw)
        finally:
            release(phase)
        state.note_end(raw, phase)
        return True

    async def stream_loop(first: int) -> None:
        i = first
        while not stopping and await one(i, None):
            i += spec.concurrency

    async def dispatcher() -> None:
        try:
            await dispatch()
        finally:
            state.due_next = sys.maxsize  # nothing more falls due: the window need not wait for it

    async def dispatch() -> None:
        nonlocal queued
        rng = random.Random(spec.seed * 1000003 + worker)
        per_s = (spec.rate or 1.0) * rate_share
        t = t0 + int(phase_offset_s * 1e9)
        i = 0
        while not stopping:
            if spec.mode == "trace":
                if i >= len(spec.schedule):
                    await asyncio.sleep(0)  # the last request's task takes its phase (measure) first
                    if state.t_end is None:
                        state.t_end = -1  # the trace is sent: the window closes when its requests end
                    state.due_next = sys.maxsize
                    return
                t = t0 + int(spec.schedule[i] * 1e9)
            state.due_next = t
            delay = (t - perf_ns()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            woke = perf_ns()
            if len(in_flight) >= pool:
                queued += 1
            else:
                slips.append((woke - t) / 1e6)
            # the phase is taken now, in order, by the due time: a stalled loop's backlog is still counted
            task = loop.create_task(one(i, t, take_phase(t)))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            i += 1
            gap = rng.expovariate(per_s) if spec.mode == "poisson" else 1.0 / per_s
            t += int(gap * 1e9)

    def mark(t_req: int) -> None:
        lag.append((perf_ns() - t_req) / 1e6)

    async def probe() -> None:
        # A callback made ready now runs after everything already queued: exactly the wait a socket read
        # that just became ready would have before data_received stamps it.
        while not stopping:
            await asyncio.sleep(spec.probe_interval_s)
            loop.call_soon(mark, perf_ns())

    cpu0 = time.thread_time()
    probe_task = loop.create_task(probe())
    if spec.open_loop:
        drivers = [loop.create_task(dispatcher())]
    else:
        drivers = [loop.create_task(stream_loop(k)) for k in range(spec.concurrency)]
        in_flight.update(drivers)
    drain_timed_out = False
    try:
        await _wait_window(spec, state)
        if state.t_end == -1 or state.pending_measured:
            drain_timed_out = not await _drain(spec, state, on_progress)
    except asyncio.CancelledError:
        cancelled = True
    finally:
        stopping = True
        cpu_s = time.thread_time() - cpu0
        t_stop = perf_ns()
        for task in [*drivers, *in_flight, probe_task]:
            task.cancel()
        await asyncio.gather(*drivers, *in_flight, probe_task, return_exceptions=True)
        await tr.close()
        if gc_was_enabled:
            gc.enable()
    _mark_unfinished(state, t_stop, cancelled=cancelled, drain_timeout_s=spec.drain_timeout_s)
    if state.t_end == -1 or state.t_end is None:
        done = [raw.t_done for _, ph, _, raw, _ in state.records if ph == "measure" and raw.t_done]
        state.t_end = max(done) if done else t_stop
    window = (state.t_measure, state.t_end) if state.t_measure is not None else None
    from metralectl.bench.tokcount import counter

    count = counter(spec.tokenizer) if spec.tokenizer else None
    results = [analyse(raw, index=i * index_stride + worker, worker=worker,
                       phase=("measure" if ph == "measure" else ph), t_sched=ts,
                       expected_prompt_tokens=p.expected_prompt_tokens, keep_content=p.keep_content, tag=p.tag,
                       asked_tokens=p.max_tokens, counter=count)
               for i, ph, ts, raw, p in state.records]
    wall = max((t_stop - t0) / 1e9, 1e-9)
    health = {"loop_lag_ms": summarize(lag), "cpu_s": round(cpu_s, 4), "cpu_frac": round(cpu_s / wall, 4),
              "wall_s": round(wall, 4), "dispatch_slip_ms": summarize(slips) if spec.open_loop else None,
              "queued_arrivals": queued, "workers": 1,
              # raw transports: idle connections found closed, not reused
              "idle_closed": getattr(tr, "idle_closed", None),
              "connections_opened": getattr(tr, "opened", None),
              "filler_stopped": state.stopped if state.stopped and not state.aborted else None}
    raws = [raw for *_, raw, _ in state.records] if keep_raw else []
    return WorkerOutcome(results, window, health, t0, cancelled, raws, t0_unix_ns, state.aborted, drain_timed_out)


def _mark_unfinished(state: _State, t_stop: int, *, cancelled: bool, drain_timeout_s: float) -> None:
    """Say why each request that never ended did not: it stays on record as a failure of its own kind."""
    for _, phase, _, raw, _ in state.records:
        if raw.end not in (None, END_CANCELLED):
            continue
        raw.t_done = raw.t_done or t_stop
        raw.end = END_CANCELLED
        if cancelled:
            raw.error = "interrupted: the run was stopped while this request was in flight"
        elif phase == "measure":
            raw.error = f"cancelled at drain: still running when the {drain_timeout_s:g} s drain timeout passed"
        else:
            raw.error = "cancelled: unmeasured load, stopped after the measured window"


async def _drain(spec: LoadSpec, state: _State, on_progress: Progress | None) -> bool:
    """Wait for the measured requests still in flight, saying so every few seconds; False on timeout."""
    started = time.monotonic()
    deadline = started + spec.drain_timeout_s
    while state.pending_measured:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            await asyncio.wait_for(_all_done(state), min(left, spec.progress_every_s))
        except asyncio.TimeoutError:
            if on_progress is not None and state.pending_measured:
                on_progress("drain", {"in_flight": state.pending_measured,
                                      "elapsed_s": round(time.monotonic() - started, 1),
                                      "timeout_s": spec.drain_timeout_s})
    return True


async def _wait_window(spec: LoadSpec, state: _State) -> None:
    """Until the measured window closed (by time or by count)."""
    while True:
        if state.stopped is not None:
            return
        if spec.duration_s is not None and state.t_measure is not None:
            end = state.t_measure + int(spec.duration_s * 1e9)
            now = perf_ns()
            # a stalled loop wakes here before the dispatcher has sent its backlog: what fell due in the
            # window is taken (and waited for) before the window is called closed
            if now >= end and state.due_next >= end:
                state.t_end = state.t_end or end
                return
            if now >= end:
                await asyncio.sleep(0)
                continue
            await asyncio.sleep(min((end - now) / 1e9, 0.05))
            continue
        if state.t_end is not None or state.stopped is not None:
            return
        await asyncio.sleep(0.005)


async def _all_done(state: _State) -> None:
    if state.pending_measured == 0:
        return
    await state.all_measured_done.wait()
