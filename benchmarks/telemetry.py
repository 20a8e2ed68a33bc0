#!/usr/bin/env python3
"""Sampler overhead benchmark (a script, not a test): CPU cost as % of one core and timestamp jitter.

Every configuration is compared with a baseline measured in the same run: the same Sampler and
schedule over a probe that does nothing (no NVML), so the ratios show what NVML reads add.
Configurations: a fake NVML whose energy read sleeps ~3 ms (an H200's p50), and the real NVML when a
driver is present. Targets: ≤ 1 % of one core at 10 Hz, p99 jitter ≤ 5 ms.

    PYTHONPATH=. python3 benchmarks/telemetry.py [--seconds 10] [--json FILE] [--no-real]

A configuration whose sampler took no sample, stopped on an error, or (with NVML) never read the driver
measured nothing: the script says which and why, and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metralectl.seams.gpu import NvmlProbe
from metralectl.core.gpudata import EnergyReading, GpuSample, GpuSystem, PowerReading
from metralectl.telemetry.sampler import Sampler, SamplerStats

CPU_TARGET_PCT = 1.0
JITTER_TARGET_S = 0.005


class NullProbe:
    """The baseline: the sampler's own scheduling and bookkeeping, no NVML at all."""

    def open(self) -> GpuSystem:
        return GpuSystem(None, None, ())

    def power(self) -> tuple[PowerReading, ...]:
        return ()

    def energy(self) -> tuple[EnergyReading, ...]:
        return ()

    def sample(self, *, detail: bool = True) -> tuple[GpuSample, ...]:
        return ()

    def close(self) -> None:
        pass


def not_measured(label: str, stats: SamplerStats, reads: bool) -> str | None:
    """Why `stats` are no measurement of `label` (None: they are one). `reads`: the probe reads a driver."""
    if stats.error:
        return f"{label}: the sampler stopped: {stats.error}"
    if stats.samples == 0:
        return f"{label}: the sampler took no sample in {stats.wall_s:.1f} s"
    if reads and stats.read_p50_s is None:
        return f"{label}: no read of the driver was timed"
    return None


def run(probe: Any, seconds: float, **kw: Any) -> SamplerStats:
    sampler = Sampler(probe, **kw)
    with sampler:
        time.sleep(seconds)
    return sampler.stats()


def fake_probe(energy_delay_s: float) -> NvmlProbe:
    from tests.unit import fake_pynvml as fk

    probe = NvmlProbe(nvml=fk.make_fake([fk.FakeDevice(energy_mj=fk.Counter(), energy_delay_s=energy_delay_s)]))
    assert isinstance(probe.open(), GpuSystem)
    return probe


def ms(x: float | None) -> str:
    return "   n/a" if x is None else f"{x * 1000:6.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="per configuration (default 10)")
    ap.add_argument("--hz", type=float, default=10.0)
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--no-real", action="store_true", help="skip the real NVML even when a driver is present")
    args = ap.parse_args()

    default: dict[str, Any] = {"hz": args.hz}  # the Sampler's defaults otherwise
    configs: list[tuple[str, Any, dict[str, Any]]] = [
        ("baseline (no NVML)", NullProbe, default),
        ("fake NVML, 3 ms energy read, defaults", lambda: fake_probe(0.003), default),
        ("fake NVML, +20 Hz power ticks", lambda: fake_probe(0.003), {**default, "power_hz": 20.0}),
    ]
    real = None if args.no_real else NvmlProbe()
    real_state = real.open() if real else None
    if isinstance(real_state, GpuSystem):
        names = ", ".join(g.name or "?" for g in real_state.gpus)
        configs += [
            (f"real NVML ({names}), defaults", lambda: real, default),
            ("real NVML, +20 Hz power ticks (no-counter mode)", lambda: real, {**default, "power_hz": 20.0}),
            ("real NVML, 1 Hz energy counter", lambda: real, {**default, "energy_hz": 1.0}),
            ("real NVML, every field every sample", lambda: real,
             {**default, "power_hz": None, "detail_hz": args.hz, "energy_hz": args.hz}),
        ]
    else:
        print(f"real NVML: skipped ({getattr(real_state, 'reason', 'disabled')})", file=sys.stderr)

    results: list[dict[str, Any]] = []
    broken: list[str] = []
    for label, make, kw in configs:
        stats = run(make(), args.seconds, **kw)
        results.append({"label": label, "config": kw, "stats": asdict(stats)})
        print(f"  ran {label}: {stats.samples} samples", file=sys.stderr)
        why = not_measured(label, stats, reads=make is not NullProbe)
        if why:
            broken.append(why)
    if real is not None:
        real.close()
    if broken:
        for why in broken:
            print(f"NOT MEASURED: {why}", file=sys.stderr)
        return 1

    base = results[0]["stats"]
    print(f"\nsampler at {args.hz:g} Hz (defaults: power ticks auto, detail 1 Hz, energy counter 0.2 Hz), "
          f"{args.seconds:g} s per configuration "
          f"(targets: ≤ {CPU_TARGET_PCT:g} % of one core, p99 jitter ≤ {JITTER_TARGET_S * 1000:g} ms)\n")
    print(f"{'configuration':44} {'CPU %':>7} {'×base':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
          f"{'read p50':>8} {'energy p50/p99 ms':>18} {'missed':>6}  verdict")
    for r in results:
        s = r["stats"]
        ratio = s["cpu_pct"] / base["cpu_pct"] if base["cpu_pct"] else float("nan")
        ok = s["cpu_pct"] <= CPU_TARGET_PCT and (s["lateness_p99_s"] or 0) <= JITTER_TARGET_S
        r["cpu_ratio_vs_baseline"] = ratio
        r["p99_ratio_vs_baseline"] = (s["lateness_p99_s"] / base["lateness_p99_s"]) if base["lateness_p99_s"] else None
        r["meets_targets"] = ok
        print(f"{r['label'][:44]:44} {s['cpu_pct']:7.3f} {ratio:6.1f} {ms(s['lateness_p50_s'])} "
              f"{ms(s['lateness_p99_s'])} {ms(s['lateness_max_s'])} {ms(s['read_p50_s']):>8} "
              f"{ms(s['energy_read_p50_s'])}/{ms(s['energy_read_p99_s'])}    {s['missed_ticks']:6d}  "
              f"{'ok' if ok else 'MISSES TARGET'}")
    if args.json:
        args.json.write_text(json.dumps({"seconds": args.seconds, "hz": args.hz, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
