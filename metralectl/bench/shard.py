"""Run a load in this process, or sharded over worker processes when one cannot keep up.

Workers are spawned (not forked: the parent may hold a telemetry thread), each opens its share of the
connection pool, reports ready, and starts at one absolute perf_counter_ns instant chosen by the
parent (CLOCK_MONOTONIC is system-wide on Linux, so every worker's stamps share one time base).
Each parses its own results after the load, so parsing is parallel too. Ctrl-C / SIGTERM reach the
parent, which tells the workers to stop; they return what they have. A cancel token bound to the
caller's thread (the dashboard's, metralectl/cancel.py) ends an in-process run the way SIGTERM does.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from metralectl import cancel
from metralectl.bench.loadgen import LoadSpec, Planned, Progress, WorkerOutcome, prewarm_for, run_worker

STREAMS_PER_PROCESS = 256  # one process stayed within the error budget to 384 streams at 10 ms ITL (docs/bench.md)


def auto_workers(spec: LoadSpec) -> int:
    """Closed loop: one process per STREAMS_PER_PROCESS streams, up to the cores. Open loop: one (its
    concurrency is only the pool's width; set workers=N for very high rates)."""
    if spec.requests is not None or spec.open_loop:
        return 1  # count-bounded windows need one counter
    cores = os.cpu_count() or 1
    return max(1, min(cores, math.ceil(spec.concurrency / STREAMS_PER_PROCESS)))


def run_load(spec: LoadSpec, url: str, path: str, plan: Callable[[int], Planned], *, workers: int = 1,
             headers: dict[str, str] | None = None, on_progress: Progress | None = None) -> WorkerOutcome:
    if workers <= 1 or spec.requests is not None:
        return asyncio.run(_in_process(spec, url, path, plan, headers, on_progress))
    return _sharded(spec, url, path, plan, workers, headers, on_progress)


async def _in_process(spec: LoadSpec, url: str, path: str, plan: Callable[[int], Planned],
                      headers: dict[str, str] | None, on_progress: Progress | None = None) -> WorkerOutcome:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    installed = False
    previous = signal.getsignal(signal.SIGTERM)  # the command's own (bench run: SIGTERM as Ctrl-C)
    stopped: list[bool] = []  # the run was told to stop (SIGTERM, or the dashboard's token), not cancelled otherwise

    def stop() -> None:
        stopped.append(True)
        if task is not None:
            task.cancel()

    if task is not None:
        try:
            loop.add_signal_handler(signal.SIGTERM, stop)  # SIGTERM ends the run like Ctrl-C does
            installed = True
        except (ValueError, RuntimeError, NotImplementedError):
            pass  # not the main thread
    token = cancel.current()
    watcher = asyncio.ensure_future(_cancel_on(token, stop)) if token is not None and task is not None else None
    try:
        return await run_worker(spec, url, path, plan, headers=headers, on_progress=on_progress)
    except asyncio.CancelledError:
        if stopped:  # before its load began (its connections opening): nothing of this rung was measured, and the
            # run ends as on Ctrl-C, its record kept as interrupted (runner.py), not a CancelledError's traceback
            raise KeyboardInterrupt from None
        raise
    finally:
        if watcher is not None:
            watcher.cancel()
        if installed:  # asyncio leaves SIG_DFL behind: a SIGTERM between two rungs killed the run unrecorded
            loop.remove_signal_handler(signal.SIGTERM)
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


async def _cancel_on(token: cancel.CancelToken, stop: Callable[[], None], tick_s: float = 0.1) -> None:
    """Stop the run once the token is cancelled: its requests end as on SIGTERM (kept, marked)."""
    while not token.cancelled:
        await asyncio.sleep(tick_s)
    stop()


def _share(total: int, n: int, k: int) -> int:
    return total // n + (1 if k < total % n else 0)


def _worker_main(conn: Any, spec: LoadSpec, url: str, path: str, plan: Callable[[int], Planned], worker: int,
                 workers: int, headers: dict[str, str] | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop, and says so on the pipe
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

    async def main() -> WorkerOutcome:
        from metralectl.bench.transport import make_transport

        loop = asyncio.get_running_loop()
        tr = make_transport(spec.transport, url, path, spec.concurrency, headers)
        await tr.open(prewarm_for(spec))
        conn.send(("ready", None))
        start_ns = await loop.run_in_executor(None, conn.recv)
        task = asyncio.current_task()
        assert task is not None
        loop.add_reader(conn.fileno(), task.cancel)  # any message now means: stop
        try:
            return await run_worker(spec, url, path, plan, worker=worker, index_stride=workers, start_ns=start_ns,
                                    rate_share=1.0 / workers, headers=headers, transport=tr,
                                    phase_offset_s=(worker / spec.rate if spec.mode == "constant" and spec.rate else 0.0),
                                    on_progress=lambda kind, data: conn.send(("progress", (kind, {**data, "worker": worker}))))
        finally:
            loop.remove_reader(conn.fileno())

    try:
        outcome = asyncio.run(main())
        conn.send(("done", outcome))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it as a run failure
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def _sharded(spec: LoadSpec, url: str, path: str, plan: Callable[[int], Planned], workers: int,
             headers: dict[str, str] | None, on_progress: Progress | None = None) -> WorkerOutcome:
    import multiprocessing as mp

    from metralectl.errors import MetralError

    ctx = mp.get_context("spawn")
    procs, pipes = [], []
    for k in range(workers):
        share = replace(spec, concurrency=max(1, _share(spec.concurrency, workers, k)))
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker_main, args=(child, share, url, path, plan, k, workers, headers),
                           name=f"metralectl-bench-{k}", daemon=True)
        proc.start()
        child.close()
        procs.append(proc)
        pipes.append(parent)
    cancelled = False
    outcomes: list[WorkerOutcome] = []
    errors: list[str] = []
    try:
        for p in pipes:
            kind, payload = p.recv()
            if kind != "ready":
                raise MetralError(f"a benchmark worker failed to start: {payload}")
        start_ns = time.perf_counter_ns() + 200_000_000  # every worker is waiting; 0.2 s covers the hand-out
        for p in pipes:
            p.send(start_ns)
        outcomes, errors = _collect(pipes, on_progress=on_progress)
    except KeyboardInterrupt:
        cancelled = True
        for p in pipes:
            try:
                p.send("stop")
            except (OSError, BrokenPipeError):
                pass
        outcomes, errors = _collect(pipes, timeout=30.0, on_progress=on_progress)
    finally:
        for proc in procs:
            proc.join(5.0)
            if proc.is_alive():
                proc.kill()
    if errors and not outcomes:
        raise MetralError(f"benchmark workers failed: {errors[0]}")
    return merge(outcomes, cancelled=cancelled or any(o.cancelled for o in outcomes), errors=errors)


def _collect(pipes: list[Any], timeout: float | None = None,
             on_progress: Progress | None = None) -> tuple[list[WorkerOutcome], list[str]]:
    outcomes: list[WorkerOutcome] = []
    errors: list[str] = []
    for p in pipes:
        while True:
            if timeout is not None and not p.poll(timeout):
                kind, payload = "error", "a worker did not answer"
                break
            try:
                kind, payload = p.recv()
            except EOFError:
                kind, payload = "error", "a worker died"
                break
            if kind != "progress":
                break
            if on_progress is not None:
                on_progress(*payload)
        if kind == "done":
            assert isinstance(payload, WorkerOutcome)
            outcomes.append(payload)
        else:
            errors.append(str(payload))
    return outcomes, errors


def merge(outcomes: list[WorkerOutcome], *, cancelled: bool = False, errors: list[str] | None = None) -> WorkerOutcome:
    results = [r for o in outcomes for r in o.results]
    windows = [o.window for o in outcomes if o.window is not None]
    window = (min(w[0] for w in windows), max(w[1] for w in windows)) if windows else None
    per = [o.health for o in outcomes]
    health: dict[str, Any] = {
        "workers": len(outcomes),
        "loop_lag_ms": _worst(per, "loop_lag_ms"),
        "cpu_s": round(sum(h["cpu_s"] for h in per), 4),
        "cpu_frac": max((h["cpu_frac"] for h in per), default=None),  # the busiest process decides
        "wall_s": max((h["wall_s"] for h in per), default=None),
        "dispatch_slip_ms": _worst(per, "dispatch_slip_ms"),
        "queued_arrivals": sum(h.get("queued_arrivals", 0) for h in per),
        "idle_closed": sum(h.get("idle_closed") or 0 for h in per),
        "connections_opened": sum(h.get("connections_opened") or 0 for h in per),
        "per_worker": per,
        "worker_errors": errors or [],
    }
    first = min(outcomes, key=lambda o: o.t0, default=None)
    aborted = next((o.aborted for o in outcomes if o.aborted), None)
    return WorkerOutcome(results, window, health, first.t0 if first else 0, cancelled,
                         t0_unix_ns=first.t0_unix_ns if first else 0, aborted=aborted,
                         drain_timed_out=any(o.drain_timed_out for o in outcomes))


def _worst(per: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    """Per-percentile maximum over workers (a budget is broken if any worker broke it)."""
    found = [h[key] for h in per if h.get(key)]
    if not found:
        return None
    out: dict[str, Any] = {"n": sum(f["n"] for f in found)}
    for k in found[0]:
        if k != "n":
            values = [f[k] for f in found if f.get(k) is not None]
            out[k] = max(values) if values else None
    return out

