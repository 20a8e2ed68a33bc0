#!/usr/bin/env python3
"""The order-balanced paired median (benchmarks/gateway_paired.py order_balanced()) of a paired run's JSON, also for
results taken before each group kept its send order (a script, not a test):

    python3 benchmarks/gateway_paired_order.py benchmarks/results/h200_gateway_paired_f5129ee_c1.json [--via gateway]

With each group's `order` kept, that is used. Without it, only c = 1 can be read: one worker sends the groups
strictly in sequence, so within a round consecutive groups alternate their order and a group's position's parity
is its order (which parity went first needs no knowing: the estimate is the mean of the two classes' medians).
Each round is one stratum; the figure is the mean over rounds, its 95 % interval from resampling within each
round's classes (one per send order). Prints one line per concurrency it can read.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

BOOT = 2000


def classes(phase: dict, via: str) -> list[np.ndarray] | None:
    """The paired differences of one round, split by send order: one class per rotation of the paths when each
    group's order was kept (gateway_paired.order_balanced() says why not by which of the two went first), else at
    c = 1 by position parity."""
    groups = phase.get("requests") or phase.get("groups") or []
    diffs = np.array([g[via]["ttft_ms"] - g["direct"]["ttft_ms"] for g in groups], dtype=float)
    if groups and all("order" in g for g in groups):
        orders = [tuple(g["order"]) for g in groups]
        return [diffs[np.array([o == order for o in orders])] for order in sorted(set(orders))]
    if phase["concurrency"] == 1:
        return [diffs[0::2], diffs[1::2]]
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
                      if k is not None and len(k) > 1 and all(len(part) for part in k)]
            if not strata:
                print(f"{path} c={c}: no group's order is known (kept only since the benchmark keeps it)")
                continue
            point = np.mean([np.mean([np.median(part) for part in parts]) for parts in strata])
            boot = np.mean([np.mean([np.median(part[rng.integers(0, len(part), (BOOT, len(part)))], axis=1)
                                     for part in parts], axis=0) for parts in strata], axis=0)
            low, high = np.percentile(boot, [2.5, 97.5])
            n = sum(len(part) for parts in strata for part in parts)
            print(f"{path} c={c}: order-balanced paired median added {point:+.3f} ms [{low:+.3f}, {high:+.3f}] "
                  f"({len(strata)} rounds, {n} groups; each round's orders' medians: "
                  + ", ".join("/".join(f"{np.median(part):+.2f}" for part in parts) for parts in strata) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
