"""Ground truth: the client's measurements against a server streaming on a known schedule.

The server stamps perf_counter_ns just before writing each event; CLOCK_MONOTONIC is shared by the
processes, so the difference is the client's measurement error. Budget: p50 <= 0.5 ms, p99 <= 2 ms;
token counts exact. The p99 is a property of the machine as much as of the client, at any concurrency: a
2-core box that preempts the client for 10 ms while a token arrives puts a 10 ms error in the tail (seen in
CI at concurrency 64, and at concurrency 1 on a box busy with other work: 6 ms). So this test holds the
counts and the median, and the p99 budget at every concurrency is measured by benchmarks/bench_client.py,
beside GuideLLM and AIPerf on the same truth server (docs/bench.md). The tail is printed here for a person.
"""

from __future__ import annotations

from typing import Any

import pytest

from metralectl.bench.loadgen import LoadSpec
from metralectl.bench.prompts import RequestFactory
from metralectl.bench.results import aggregate
from metralectl.bench.shard import run_load
from metralectl.bench.stats import percentile
from tests.bench_truth.helpers import errors_vs_truth, fetch_truth, truth_server

PATH = "/v1/chat/completions"
SWITCH_S = 0.03  # a loaded client's longest pause between reads (> the 10 ms between a stream's tokens)


@pytest.mark.parametrize("concurrency", [1, 64])
def test_timing_error_within_budget(concurrency: int) -> None:
    # 10 ms between a stream's tokens (an engine batching 64 streams is slower than that): the client must
    # have read each event before the same stream's next one arrives, or the two share a kernel stamp
    with truth_server("--record", "--ttft-ms", "25", "--itl-ms", "10", "--reasoning", "3", "--tail-ms", "15") as url:
        spec = LoadSpec(concurrency=concurrency, warmup_requests=concurrency, requests=concurrency * 4)
        out = run_load(spec, url, PATH, RequestFactory(model="m", max_tokens=30, text="hello there"))
        truth = fetch_truth(url)
    measured = [r for r in out.results if r.phase == "measure"]
    assert len(measured) == concurrency * 4 and all(r.ok for r in measured), [r.error for r in measured if not r.ok][:3]
    err = errors_vs_truth(measured, truth)
    assert set(err["count_diff"]) == {0}
    assert all(r.output_tokens == 30 and r.reasoning_tokens == 3 for r in measured)
    token = [abs(x) for x in err["token"]]
    ttft = [abs(x) for x in err["ttft"]]
    report = {k: (percentile(v, 50), percentile(v, 99)) for k, v in
              {"token": token, "ttft": ttft, "itl": err["itl"], "tpot": [abs(x) for x in err["tpot"]],
               "ttft_content": [abs(x) for x in err["ttft_content"]],
               # E2E ends at the last token, not at the finish/usage chunks the server sent 15 and 30 ms later
               "e2e": [abs(x) for x in err["e2e"]]}.items()}
    upper = [abs(x) for x in err["token_vs_before"]]
    print(f"c={concurrency} error ms (p50, p99): {report}; token stamp minus the server's pre-write stamp "
          f"(an upper bound): p50 {percentile(upper, 50):.4f} p99 {percentile(upper, 99):.4f} max {max(upper):.4f}")
    for name, (p50, p99) in report.items():
        assert p50 is not None and p50 <= 0.5 and p99 is not None, (name, report)
    assert len(err["ttft_content"]) == len(err["e2e"]) == len(measured)


def test_multi_token_chunks_are_spread_and_counted_exactly() -> None:
    with truth_server("--record", "--ttft-ms", "20", "--itl-ms", "4", "--tokens-per-chunk", "3") as url:
        spec = LoadSpec(concurrency=4, requests=8)
        out = run_load(spec, url, PATH, RequestFactory(model="m", max_tokens=31, text="x"))
        truth = fetch_truth(url)
    measured = [r for r in out.results if r.phase == "measure"]
    assert all(r.ok and r.output_tokens == 31 and r.count_method == "continuous-usage" for r in measured)
    # the first chunk's 3 tokens share TTFT, and TPOT is per token: judged against the server's own write
    # stamps (a chunk of 3 every 12 ms is 4 ms a token on a quiet box; a busy box stretches the schedule, and
    # the truth with it). Counted per chunk, TPOT would be 3x the truth: an error of ~8 ms, not <= 0.5.
    assert all(r.first_n == 3 for r in measured)
    err = errors_vs_truth(measured, truth)
    # the typical stamp, not the tail: a busy CI box (five other jobs) put 8 ms in the p99 here (module docstring)
    assert set(err["count_diff"]) == {0} and percentile([abs(x) for x in err["token"]], 50) <= 0.5, err["token"][:10]
    assert len(err["tpot"]) == len(measured) and percentile([abs(x) for x in err["tpot"]], 50) <= 0.5, err["tpot"]


def test_without_continuous_usage_the_final_usage_is_spread() -> None:
    with truth_server("--ttft-ms", "10", "--itl-ms", "2", "--tokens-per-chunk", "2") as url:
        factory = RequestFactory(model="m", max_tokens=20, text="x", continuous_usage=False)
        out = run_load(LoadSpec(concurrency=2, requests=4), url, PATH, factory)
    measured = [r for r in out.results if r.phase == "measure"]
    assert all(r.ok and r.output_tokens == 20 and r.count_method == "usage-spread" for r in measured)


def test_tool_call_deltas_count_as_tokens() -> None:
    import json

    from metralectl.bench.suites import WEATHER_TOOL, tool_call_problems

    with truth_server("--ttft-ms", "10", "--itl-ms", "2") as url:
        factory = RequestFactory(model="m", max_tokens=6, text="weather?", tools=json.dumps(WEATHER_TOOL),
                                 tool_choice='"required"', ignore_eos=False)
        out = run_load(LoadSpec(concurrency=1, requests=3), url, PATH, factory)
    measured = [r for r in out.results if r.phase == "measure"]
    assert all(r.ok and r.output_tokens == 6 and r.ttft_content_ms is None for r in measured)
    assert all(tool_call_problems(r, {"get_weather"}) == [] for r in measured), [r.tool_calls for r in measured]


def test_open_loop_rate_and_window() -> None:
    """A request belongs to the window it fell due in: 1 s at 50/s is 50 requests, every one counted, on a
    quiet box or a stalled one (the stall shows in the dispatch slip, which is measured, not bounded, here:
    benchmarks/bench_client.py holds the slip budget). A busy CI box once sent the window's last 8 late and
    the window counted 42."""
    with truth_server("--ttft-ms", "5", "--itl-ms", "2") as url:
        spec = LoadSpec(mode="constant", rate=50, concurrency=32, warmup_s=0.2, duration_s=1.0)
        out = run_load(spec, url, PATH, RequestFactory(model="m", max_tokens=10, text="x"))
    agg = aggregate(out.results, out.window)
    measured = sorted((r for r in out.results if r.phase == "measure"), key=lambda r: r.index)
    assert agg["requests"] == 50 and agg["errors"] == 0
    assert [r.index for r in measured] == list(range(10, 60))  # due at 0.2 s .. 1.18 s, 20 ms apart
    assert {r.t_sched - out.t0 for r in measured} == {k * 20_000_000 for k in range(10, 60)}
    assert sum(r.output_tokens for r in measured) == 500 and agg["output_tok_s"] > 0
    assert out.health["dispatch_slip_ms"]["p50"] >= 0


class _StallingFactory(RequestFactory):
    """Blocks the client's event loop for `stall_s` while building request `at`: a box that took the
    client's core away just before the window's end."""

    def __init__(self, at: int, stall_s: float, **kw: Any) -> None:
        super().__init__(**kw)
        object.__setattr__(self, "_at", at)
        object.__setattr__(self, "_stall_s", stall_s)

    def __call__(self, index: int) -> Any:
        if index == self._at:
            import time as _time

            _time.sleep(self._stall_s)
        return super().__call__(index)


def test_a_stalled_client_still_sends_and_counts_what_fell_due_in_the_window() -> None:
    """The loop stalls 0.35 s at request 50 (due 1.0 s; the window is 0.2-1.2 s): requests 51-59 fall due
    during the stall. Phased by the time they were sent, they were drain (or never sent: the run ended with
    them queued), and the window counted 41; phased by their due time, all 50 are measured and sent, late."""
    with truth_server("--ttft-ms", "5", "--itl-ms", "2") as url:
        spec = LoadSpec(mode="constant", rate=50, concurrency=32, warmup_s=0.2, duration_s=1.0)
        factory = _StallingFactory(50, 0.35, model="m", max_tokens=10, text="x")
        out = run_load(spec, url, PATH, factory)
    measured = [r for r in out.results if r.phase == "measure"]
    assert sorted(r.index for r in measured) == list(range(10, 60))
    assert all(r.ok and r.output_tokens == 10 for r in measured), [r.error for r in measured if not r.ok][:3]
    late = [r for r in measured if r.index > 50]
    assert all(r.t_send - r.t_sched >= 150_000_000 for r in late)  # sent after the stall: the slip says so
    assert out.health["dispatch_slip_ms"]["max"] >= 150


def test_open_loop_schedule_starts_after_the_collection_in_a_large_heap() -> None:
    """The garbage collection before a run takes long in a process with a big heap (the full test suite's
    is one); an open-loop schedule anchored before it sent the backlog in a burst after warm-up, and the
    window counted ~60 requests at 50/s."""
    import gc
    import time as _time

    heap = [[i] for i in range(3_000_000)]  # cycle-tracked objects: a full collection has to walk them
    t = _time.perf_counter()
    gc.collect()
    assert _time.perf_counter() - t > 0.05, "the heap is too small to show the effect here"
    try:
        with truth_server("--ttft-ms", "5", "--itl-ms", "2") as url:
            spec = LoadSpec(mode="constant", rate=50, concurrency=32, warmup_s=0.2, duration_s=1.0)
            out = run_load(spec, url, PATH, RequestFactory(model="m", max_tokens=10, text="x"))
    finally:
        del heap
    agg = aggregate(out.results, out.window)
    # the p90, not the p99: a busy box stalls a request or two now and then (a CI run saw 21.9 ms at p99 beside
    # another test run); the backlog this guards against was a tenth of the window's requests or more, late by the
    # collection's time (tens to hundreds of ms)
    assert 45 <= agg["requests"] <= 55 and out.health["dispatch_slip_ms"]["p90"] < 20.0


def test_sharded_over_two_processes() -> None:
    with truth_server("--record", "--ttft-ms", "10", "--itl-ms", "10") as url:
        spec = LoadSpec(concurrency=8, warmup_s=0.2, duration_s=0.8)
        out = run_load(spec, url, PATH, RequestFactory(model="m", max_tokens=20, text="x"), workers=2)
        truth = fetch_truth(url)
    assert out.health["workers"] == 2 and {r.worker for r in out.results} == {0, 1}
    measured = [r for r in out.results if r.phase == "measure"]
    assert measured and all(r.ok for r in measured)
    assert len({r.index for r in out.results}) == len(out.results)  # no index used twice across workers
    err = errors_vs_truth(measured, truth)
    assert set(err["count_diff"]) == {0}
    # the typical stamp as close as in one process (a p99 bound is a wall-clock window: a busy box stalls either
    # worker now and then; the tail is measured in benchmarks/bench_client.py, as for test_timing_error_within_budget)
    assert percentile([abs(x) for x in err["token"]], 50) <= 0.5, err["token"][:10]


def _guard_vs_truth(concurrency: int, hogs: int) -> tuple[bool, float, dict[str, Any]]:
    """One count-bounded stage against the truth server with `hogs` busy threads in the client's own process:
    (did the guard flag it, the true p99 stamp error in ms, the estimate).

    The hogs hold the GIL for SWITCH_S at a time (sys.setswitchinterval), so the client's event loop cannot read
    for longer than a stream's 10 ms between tokens, whatever the kernel's scheduler does: two events reach one
    read and share its stamp. (Busy processes pinned to the client's CPU did this only now and then: on loopback
    the kernel stamps an arrival in the sender's write, and a waking reader preempts a hog at once.)"""
    import sys
    import threading

    from metralectl.bench import gates as G
    with truth_server("--record", "--ttft-ms", "25", "--itl-ms", "10", "--reasoning", "3", "--tail-ms", "15") as url:
        stop = threading.Event()

        def hog() -> None:
            n = 0
            while not stop.is_set():
                n += 1  # pure Python: holds the GIL until the interpreter asks it to switch

        threads = [threading.Thread(target=hog, daemon=True) for _ in range(hogs)]
        interval = sys.getswitchinterval()
        if hogs:
            sys.setswitchinterval(SWITCH_S)
        for t in threads:
            t.start()
        try:
            spec = LoadSpec(concurrency=concurrency, warmup_requests=concurrency, requests=concurrency * 4)
            out = run_load(spec, url, PATH, RequestFactory(model="m", max_tokens=30, text="hello there"))
        finally:
            stop.set()
            for t in threads:
                t.join()
            sys.setswitchinterval(interval)
        truth = fetch_truth(url)
    measured = [r for r in out.results if r.phase == "measure"]
    err = errors_vs_truth(measured, truth)
    true_p99 = max(percentile([abs(x) for x in err["token"]], 99) or 0.0, percentile([abs(x) for x in err["ttft"]], 99) or 0.0)
    estimate = aggregate(out.results, out.window)["stamp_error_ms"]
    flagged = bool(G.client_bound_reasons(out.health, estimate, 2.0, 2.0))
    print(f"c={concurrency} hogs={hogs}: true p99 {true_p99:.3f} ms, estimate {estimate}, flagged {flagged}")
    return flagged, true_p99, estimate


def test_client_bound_guard_fires_on_the_loaded_client_and_not_on_the_quiet_one() -> None:
    # Loaded: busy threads keep the client's loop from reading for longer than a stream's 10 ms between tokens,
    # so it reads two of them at once: the truth server shows stamps off by ~10 ms.
    flagged, true_p99, estimate = _guard_vs_truth(64, hogs=1)
    assert true_p99 > 4.0, "the hogs did not disturb the client: this machine cannot show the loaded case"
    assert flagged and estimate["late"] > 0
    # Quiet: the same load alone. The loop's own delay may exceed 2 ms here (it did, in the field); the
    # stamps' error does not, and the guard follows the stamps.
    flagged, true_p99, estimate = _guard_vs_truth(64, hogs=0)
    if true_p99 < 1.0:
        assert not flagged, estimate
    elif true_p99 > 4.0:
        assert flagged, estimate  # the 'quiet' machine was not quiet: the guard must still tell the truth


def test_an_open_loop_opens_the_connections_its_rate_needs_not_its_ceiling() -> None:
    """max_inflight (256 by default) is a ceiling: opened up front, the idle connections held a llama-server's
    HTTP threads (slots + 2) and every request sent on another waited 5 s for a keep-alive timeout. At 20/s
    with requests of ~30 ms, a handful is in flight at once; the run opens about that many."""
    with truth_server("--ttft-ms", "5", "--itl-ms", "2") as url:
        spec = LoadSpec(mode="constant", rate=20, concurrency=256, warmup_s=0.2, duration_s=0.5)
        out = run_load(spec, url, PATH, RequestFactory(model="m", max_tokens=10, text="x"))
    measured = [r for r in out.results if r.phase == "measure"]
    assert len(measured) == 10 and all(r.ok for r in measured)
    assert 1 <= out.health["connections_opened"] <= 16, out.health["connections_opened"]
    # a closed loop still opens every stream's connection before its window
    with truth_server("--ttft-ms", "5", "--itl-ms", "2") as url:
        out = run_load(LoadSpec(concurrency=6, requests=6), url, PATH, RequestFactory(model="m", max_tokens=4, text="x"))
    assert out.health["connections_opened"] == 6


def test_after_a_rung_sigterm_is_the_commands_own_again() -> None:
    """`bench run` turns SIGTERM into Ctrl-C (recorded as interrupted); each rung's loop takes it over while it runs.
    asyncio's remove_signal_handler left SIG_DFL behind, so a SIGTERM between two rungs killed the run outright and
    left its record `running` (a CI run saw -15 where 130 was expected)."""
    import signal

    from metralectl.seams.process import sigterm_as_interrupt

    with truth_server("--ttft-ms", "1", "--itl-ms", "1") as url, sigterm_as_interrupt():
        ours = signal.getsignal(signal.SIGTERM)
        out = run_load(LoadSpec(concurrency=1, requests=2), url, PATH, RequestFactory(model="m", max_tokens=3, text="x"))
        assert signal.getsignal(signal.SIGTERM) is ours
    assert all(r.ok for r in out.results)
