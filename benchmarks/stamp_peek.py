#!/usr/bin/env python3
"""What the one-byte peek per read costs the load generator (a script, not a test).

The raw transport peeks one byte before each read so a read holding several events knows when its oldest
bytes arrived (docs/bench.md, "the guard measures the error it guards"). This runs the same load against
the truth server with the peek and without it (the transport as it was before), interleaved, and prints
the client's CPU per token event and the stamps' true error for both.

    PYTHONPATH=. python3 benchmarks/stamp_peek.py [--rounds 5] [--concurrency 64] [--itl-ms 2]

A round in which a measured request failed, or no token event arrived, measured nothing: the script says
why and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from metralectl.bench import transport as T  # noqa: E402
from metralectl.bench.loadgen import LoadSpec, run_worker  # noqa: E402
from metralectl.bench.prompts import RequestFactory  # noqa: E402
from metralectl.bench.stats import percentile  # noqa: E402
from tests.bench_truth.helpers import errors_vs_truth, fetch_truth, truth_server  # noqa: E402

WITH_PEEK = T._KConn._readable


def without_peek(self: T._KConn) -> None:
    """The read loop without the peek: one recvmsg per read, stamped with its newest bytes."""
    while True:
        try:
            data, anc, _, _ = self.sock.recvmsg(262144, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.close_transport()
            self.lost(exc)
            return
        t_read = perf = T.perf_ns()
        if not data:
            self.close_transport()
            self.lost(None)
            return
        t = min(perf, self._stamp(anc, perf))
        raw = self.raw
        if raw is not None:
            t = max(t, self.last, raw.t_send)
            raw.reads.append((t, t, t_read - t))
        self.last = t
        self.feed(t, data)


def one(peek: bool, concurrency: int, itl_ms: float, tokens: int) -> tuple[float, float, int]:
    T._KConn._readable = WITH_PEEK if peek else without_peek  # type: ignore[method-assign]
    with truth_server("--record", "--ttft-ms", "20", "--itl-ms", str(itl_ms), "--tail-ms", "0") as url:
        spec = LoadSpec(concurrency=concurrency, warmup_requests=concurrency, requests=concurrency * 3)
        cpu0 = time.process_time()
        out = asyncio.run(run_worker(spec, url, "/v1/chat/completions",
                                     RequestFactory(model="m", max_tokens=tokens, text="hello")))
        cpu = time.process_time() - cpu0
        truth = fetch_truth(url)
    measured = [r for r in out.results if r.phase == "measure"]
    events = sum(r.events for r in out.results)
    broken = [r for r in measured if not r.ok]
    if broken or not measured or not events:
        why = f"{broken[0].error_kind}: {broken[0].error}" if broken else "no request was measured"
        raise SystemExit(f"stamp_peek: NOT MEASURED ({'peek' if peek else 'no peek'}): {len(broken)} of "
                         f"{len(measured)} measured requests failed, {events} events ({why})")
    err = errors_vs_truth(measured, truth)
    return cpu / max(events, 1) * 1e6, percentile([abs(x) for x in err["token"]], 99) or 0.0, events


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--itl-ms", type=float, default=2.0)
    ap.add_argument("--tokens", type=int, default=100)
    a = ap.parse_args()
    rows: dict[bool, list[tuple[float, float, int]]] = {True: [], False: []}
    for k in range(a.rounds):
        for peek in ((True, False) if k % 2 == 0 else (False, True)):
            rows[peek].append(one(peek, a.concurrency, a.itl_ms, a.tokens))
    print(f"c={a.concurrency}, one token every {a.itl_ms:g} ms per stream "
          f"(~{a.concurrency * 1000 / a.itl_ms:,.0f} events/s offered), {a.rounds} interleaved rounds")
    print(f"{'transport':<14}{'CPU µs/event (median)':>24}{'true error p99 ms (median)':>28}")
    for peek in (False, True):
        cpu = percentile([r[0] for r in rows[peek]], 50) or 0.0
        err = percentile([r[1] for r in rows[peek]], 50) or 0.0
        print(f"{'peek' if peek else 'no peek':<14}{cpu:>24.2f}{err:>28.3f}")
    base = percentile([r[0] for r in rows[False]], 50) or 1.0
    print(f"peek / no peek CPU per event: {(percentile([r[0] for r in rows[True]], 50) or 0) / base:.3f}")


if __name__ == "__main__":
    main()
