#!/usr/bin/env python3
"""Campaign numbers, each against a baseline measured in the same run.

1. Planning: the makespan of the plan's rule (longest-first, speed class bundled on the reference, which
   takes it first) against a lower bound (max of: the speed-class total, which only the reference may run;
   the total over the nodes; the longest unit) and against a naive baseline (units in the order given,
   each to the node free first), over random fleets and unit sets.
2. A remote unit's overhead: the same decode run as `metralectl bench run` (a local child, the baseline)
   and as a remote unit on a loopback peer (submit, follow the signed stream, fetch + verify the record),
   alternating; wall time and the measured tok/s of each (the remote path must not change the number).

    python3 benchmarks/campaign.py [--rounds 5] [--instances 400]

A local run that did not exit 0 with a completed record, or a remote unit whose fetched record is not
completed, is no measurement: the script says which and why, and exits 1 (writing no results).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def planning(instances: int, seed: int = 7) -> dict[str, float]:
    from metralectl.campaign.plan import NodeFacts, PlannedUnit, simulate

    rng = random.Random(seed)
    ours, naive = [], []
    for _ in range(instances):
        nodes = [NodeFacts(f"n{k}") for k in range(rng.randint(2, 6))]
        units = [PlannedUnit(f"u{i}", rng.choice(["decode", "tool-call", "tool-call", "concurrency-sweep"]),
                             expected_s=rng.choice([rng.uniform(5, 60), rng.uniform(60, 900)]), group=f"g{i}")
                 for i in range(rng.randint(4, 40))]
        ref = nodes[0].name
        speed = sum(u.expected_s for u in units if u.speed)
        bound = max(speed, sum(u.expected_s for u in units) / len(nodes), max(u.expected_s for u in units))
        ours.append(simulate(units, nodes, ref).makespan_s / bound)
        free = {n.name: 0.0 for n in nodes}
        for u in units:  # naive: in the order given, to whichever allowed node is free first
            allowed = [ref] if u.speed else list(free)
            chosen = min(allowed, key=lambda n: free[n])
            free[chosen] += u.expected_s
        naive.append(max(free.values()) / bound)
    return {"instances": instances, "ours_mean": statistics.mean(ours), "ours_max": max(ours),
            "naive_mean": statistics.mean(naive), "naive_max": max(naive),
            "ours_vs_naive_mean": statistics.mean(o / n for o, n in zip(ours, naive))}


def fail(reason: str) -> None:
    raise SystemExit(f"campaign: NOT MEASURED: {reason}")


def completed(record: object, what: str) -> dict[str, object]:
    """The record, if it says the run completed (else the script stops: its time is not of a benchmark)."""
    status = record.get("status") if isinstance(record, dict) else None
    if status != "completed":
        fail(f"{what} ended {status!r}" + ("" if isinstance(record, dict) else f": {str(record)[:300]}"))
    assert isinstance(record, dict)
    return record


def remote_overhead(rounds: int) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="bench-campaign-"))
    os.environ.update({"METRALECTL_CONFIG_DIR": str(root / "here"), "METRALE_HOME": str(root / "home"),
                       "METRALECTL_CACHE_DIR": str(root / "cache"), "METRALECTL_LOCK_DIR": str(root),
                       "HF_HOME": str(root / "hf"), "NO_COLOR": "1"})
    from metralectl.seams import identity
    from metralectl.peers.admission import Facts, GpuFact
    from metralectl.peers.remote_units import NodeRef, RemoteNode
    from metralectl.peers.store import known_keys
    from tests.integration.peer_nodes import EngineDouble, PeerNode, pair_and_grant

    double = EngineDouble(itl_ms=4.0)
    here = Path(os.environ["METRALECTL_CONFIG_DIR"])
    me = identity.load_or_create(here)
    node = PeerNode(root, "node", endpoint=double.url)
    node.node.facts = Facts(gpu=lambda: GpuFact("NVIDIA GB10", "gb10"), busy=lambda: False, queued=lambda: 0,
                            memory=lambda: 10**11, disk=lambda p: 10**12, thermal=node.thermal)
    pair_and_grant(here, me, "here", node)
    handle = RemoteNode(me, NodeRef.lookup(node.addr, here), known_keys(here))
    params = ["repeats=20", "max_tokens=32", "warmup=2"]
    local_s, remote_s, local_tok, remote_tok = [], [], [], []
    try:
        for k in range(rounds):
            t0 = time.perf_counter()
            run = subprocess.run([sys.executable, "-m", "metralectl", "bench", "run", "decode", "--url", double.url,
                                  *[x for p in params for x in ("-p", p)], "--format", "json"],
                                 capture_output=True, text=True, cwd=REPO, timeout=120)
            local_s.append(time.perf_counter() - t0)
            if run.returncode != 0 or not run.stdout.strip():
                said = [line for line in run.stderr.splitlines() if line.strip()]
                fail(f"the local `bench run decode` exited {run.returncode}: {said[-1] if said else 'no output'}")
            local = completed(json.loads(run.stdout), "the local `bench run decode`")
            local_tok.append(local["summary"]["headline"]["decode_tok_s_p50"])  # type: ignore[index]
            key = f"bench-{k}"
            t0 = time.perf_counter()
            handle.submit({"key": key, "suite": "decode", "params": dict(p.split("=") for p in params)})
            handle.follow(key, lambda e: None, lambda n, why: None)
            record = completed(handle.fetch(key, root / "fetched" / key, "decode"), f"the remote unit {key}")
            remote_s.append(time.perf_counter() - t0)
            remote_tok.append(record["summary"]["headline"]["decode_tok_s_p50"])  # type: ignore[index]
    finally:
        node.stop()
        double.stop()
    med = statistics.median
    return {"rounds": rounds, "local_s_median": med(local_s), "remote_s_median": med(remote_s),
            "remote_over_local": med(remote_s) / med(local_s), "added_s": med(remote_s) - med(local_s),
            "local_tok_s_median": med(local_tok), "remote_tok_s_median": med(remote_tok),
            "tok_s_ratio": med(remote_tok) / med(local_tok)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--instances", type=int, default=400)
    args = ap.parse_args()
    plan = planning(args.instances)
    print(f"planning over {plan['instances']} random campaigns (makespan / lower bound):")
    print(f"  longest-first + speed bundle: mean {plan['ours_mean']:.3f}, worst {plan['ours_max']:.3f}")
    print(f"  naive (order given)         : mean {plan['naive_mean']:.3f}, worst {plan['naive_max']:.3f}")
    print(f"  ours / naive                : mean {plan['ours_vs_naive_mean']:.3f}")
    remote = remote_overhead(args.rounds)
    print(f"remote decode unit vs local `bench run` ({remote['rounds']} rounds, medians):")
    print(f"  wall: local {remote['local_s_median']:.2f} s, remote {remote['remote_s_median']:.2f} s "
          f"-> x{remote['remote_over_local']:.2f} ({remote['added_s']:+.2f} s)")
    print(f"  decode tok/s p50: local {remote['local_tok_s_median']:.1f}, remote {remote['remote_tok_s_median']:.1f} "
          f"-> x{remote['tok_s_ratio']:.3f}")
    out = REPO / "benchmarks" / "results" / "campaign.json"
    out.write_text(json.dumps({"planning": plan, "remote": remote}, indent=2) + "\n")


if __name__ == "__main__":
    main()
