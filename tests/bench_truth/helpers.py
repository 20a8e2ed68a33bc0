"""Start the truth server in a subprocess and compare a run's measurements with its send stamps."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def truth_server(*args: str) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.bench_truth.truth_server", "--port", "0", *args],
                            stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("PORT "), line
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        proc.wait(10)


def fetch_truth(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/truth", timeout=30) as resp:
        return json.loads(resp.read())


def _off(m: float, lo: float, hi: float) -> float:
    """How far a measurement lies outside the truth interval [lo, hi] (0 inside; signed)."""
    return m - hi if m > hi else (m - lo if m < lo else 0.0)


def errors_vs_truth(results: list[Any], truth: dict[str, Any]) -> dict[str, list[float]]:
    """Errors (ms) of the client's measurements against the server's write stamps. Each event reached the
    client's socket between the server's stamps before and after write(); a measurement inside that
    interval has error 0. TTFT's truth starts at the client's own send stamp, taken just before its
    send() (both clocks are CLOCK_MONOTONIC): what the server did, not what the client believed."""
    from metralectl.bench.sse import TokenEvent, token_times

    out: dict[str, list[float]] = {"token": [], "ttft": [], "tpot": [], "itl": [], "count_diff": [], "e2e": [],
                                   "ttft_content": [], "token_vs_before": []}
    for r in results:
        t = truth[r.response_id]
        ev = t["events"]
        lo, first_n = token_times([TokenEvent(e[0], e[2], e[1]) for e in ev])
        hi, _ = token_times([TokenEvent(e[3], e[2], e[1]) for e in ev])
        out["count_diff"].append(len(r.token_ns) - len(lo))
        if len(lo) != len(r.token_ns):
            continue
        out["token"] += [_off(m, a, b) / 1e6 for m, a, b in zip(r.token_ns, lo, hi)]
        out["token_vs_before"] += [(m - a) / 1e6 for m, a in zip(r.token_ns, lo)]  # an upper bound of the error
        out["ttft"].append(_off(r.ttft_ms, (lo[0] - r.t_send) / 1e6, (hi[0] - r.t_send) / 1e6))
        out["e2e"].append(_off(r.e2e_ms, (lo[-1] - r.t_send) / 1e6, (hi[-1] - r.t_send) / 1e6))
        first_content = next((e for e in ev if e[2] == "c"), None)
        if first_content is not None and r.ttft_content_ms is not None:
            out["ttft_content"].append(_off(r.ttft_content_ms, (first_content[0] - r.t_send) / 1e6,
                                            (first_content[3] - r.t_send) / 1e6))
        for m, a0, a1, b0, b1 in zip(r.itl_ms, lo[first_n - 1:], lo[first_n:], hi[first_n - 1:], hi[first_n:]):
            out["itl"].append(abs(_off(m, (a1 - b0) / 1e6, (b1 - a0) / 1e6)))
        decode = len(lo) - first_n
        if decode > 0 and r.tpot_ms is not None:
            out["tpot"].append(_off(r.tpot_ms, (lo[-1] - hi[0]) / decode / 1e6, (hi[-1] - lo[0]) / decode / 1e6))
    return out
