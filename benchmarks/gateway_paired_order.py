#!/usr/bin/env python3
"""The order-balanced paired median (benchmarks/gateway_paired.py order_balanced()) of a paired run's JSON, also for
results taken before each group kept its send order (a script, not a test):

    python3 benchmarks/gateway_paired_order.py benchmarks/results/h200_gateway_paired_f5129ee_c1.json [--via gateway]

With each group's `order` kept, that is used. Without it, only c = 1 can be read: one worker sends the groups
strictly in sequence, so within a round consecutive groups alternate their order and a group's position's parity
is its order (which parity went first needs no knowing: the estimate is the mean of the two classes' medians).
Each round is one stratum; the figure is the mean over rounds, its 95 % interval from resampling within each
round's two classes. Prints one line per concurrency it can read.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

BOOT = 2000


def classes(phase: dict, via: str) -> tuple[np.ndarray, np.ndarray] | None:
    groups = phase.get("requests") or phase.get("groups") or []
    diffs = np.array([g[via]["ttft_ms"] - g["direct"]["ttft_ms"] for g in groups], dtype=float)
    if groups and all("order" in g for g in groups):
        first = np.array([g["order"].index(via) < g["order"].index("direct") for g in groups])
        return diffs[~first], diffs[first]
    if phase["concurrency"] == 1:
        return diffs[0::2], diffs[1::2]
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+")
    parser.add_argument("--via", default="gateway")
    ns = parser.parse_args()
    rng = np.random.default_rng(1)
    for path in ns.results:
        phases = json.load(open(path, encoding="utf-8"))["phases"]
        for c in sorted({p["concurrency"] for p in phases}):
            strata = [k for p in phases if p["concurrency"] == c for k in [classes(p, ns.via)]
                      if k is not None and len(k[0]) and len(k[1])]
            if not strata:
                print(f"{path} c={c}: no group's order is known (kept only since the benchmark keeps it)")
                continue
            point = np.mean([(np.median(a) + np.median(b)) / 2 for a, b in strata])
            boot = np.mean([(np.median(a[rng.integers(0, len(a), (BOOT, len(a)))], axis=1)
                             + np.median(b[rng.integers(0, len(b), (BOOT, len(b)))], axis=1)) / 2
                            for a, b in strata], axis=0)
            low, high = np.percentile(boot, [2.5, 97.5])
            n = sum(len(a) + len(b) for a, b in strata)
            print(f"{path} c={c}: order-balanced paired median added {point:+.3f} ms [{low:+.3f}, {high:+.3f}] "
                  f"({len(strata)} rounds, {n} groups; each round's two orders' medians: "
                  + ", ".join(f"{np.median(a):+.2f}/{np.median(b):+.2f}" for a, b in strata) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
