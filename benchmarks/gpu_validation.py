#!/usr/bin/env python3
"""Real-GPU validation of the telemetry core (run on a machine with an NVIDIA driver).

Timeline, sampler at 10 Hz (power at 20 Hz, counters at 0.2 Hz and at every window edge):
    idle ~14 s → bf16 matmul loop in a separate process (~30 s steady) → idle ~14 s
Reports: the fields the driver supports, NVML call costs, sampler CPU cost and timestamp jitter, and
per window the energy by counter vs by instant-power integral vs by averaged-power integral.
Then runs benchmarks/telemetry.py against the real NVML. Needs only stdlib + pynvml (+ torch for load).

    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 benchmarks/gpu_validation.py     # writes under $OUT (or ./out)

Exits 1, saying why, when a window did not see what it is named for: the load (a torch matmul loop) must say
READY, run to DONE and exit 0, and benchmarks/telemetry.py must exit 0; the files are written either way.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import itertools

from metralectl.seams.gpu import NvmlProbe
from metralectl.core.gpudata import GpuSystem, parse_meminfo
from metralectl.telemetry.energy import EnergyReport, energy_report, relative_difference, trapezoid
from metralectl.telemetry.sampler import Sample, Sampler, percentile
from metralectl.telemetry.thermal import thermal_status

OUT = Path(os.environ.get("OUT") or "out")
LOAD_S = float(os.environ.get("LOAD_S", "30"))
IDLE_S = float(os.environ.get("IDLE_S", "14"))
LOAD = r"""
import sys, time, torch
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(30):
    c = a @ b
torch.cuda.synchronize()
print("READY", flush=True)
end = time.monotonic() + float(sys.argv[1])
iters = 0
t0 = time.monotonic()
while time.monotonic() < end:
    for _ in range(40):
        c = a @ b
    torch.cuda.synchronize()
    iters += 40
dt = time.monotonic() - t0
print(f"DONE {iters} matmuls in {dt:.1f} s = {iters * 2 * n**3 / dt / 1e12:.0f} TFLOP/s", flush=True)
"""

lines: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)
    lines.append(text)


def cost(fn: Any, n: int) -> dict[str, float | None]:
    """Wall and thread-CPU time per call, in ms."""
    walls = []
    c0 = time.thread_time()
    for _ in range(n):
        t = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t)
    cpu = (time.thread_time() - c0) / n
    return {"n": n, "wall_p50_ms": (percentile(walls, 50) or 0) * 1e3, "wall_p99_ms": (percentile(walls, 99) or 0) * 1e3,
            "cpu_per_call_ms": cpu * 1e3}


def start_load() -> tuple[subprocess.Popen[str] | None, threading.Event, list[str]]:
    ready, out = threading.Event(), list[str]()
    try:
        proc = subprocess.Popen([sys.executable, "-c", LOAD, str(LOAD_S)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    except OSError as exc:
        say(f"load: could not start ({exc})")
        return None, ready, out

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line.rstrip())
            if line.startswith("READY"):
                ready.set()
        ready.set()  # EOF: never block the timeline on a crashed load
    threading.Thread(target=reader, daemon=True).start()
    return proc, ready, out


def per_call_costs(nv: Any, h: Any) -> dict[str, float | str]:
    """CPU µs per call of each NVML function a sample uses (200 calls each; exceptions are a cost too)."""
    calls = {
        "power_usage": lambda: nv.nvmlDeviceGetPowerUsage(h),
        "field_instant_power": lambda: nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_POWER_INSTANT]),
        "field_mem_temp": lambda: nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_MEMORY_TEMP]),
        "utilization": lambda: nv.nvmlDeviceGetUtilizationRates(h),
        "temperature": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "clock_sm": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "clock_mem": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
        "clock_reasons": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h),
        "power_limit": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h),
        "memory_info": lambda: nv.nvmlDeviceGetMemoryInfo(h),
        "compute_procs": lambda: nv.nvmlDeviceGetComputeRunningProcesses(h),
        "graphics_procs": lambda: nv.nvmlDeviceGetGraphicsRunningProcesses(h),
        "pcie_gen": lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h),
        "pcie_width": lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h),
        "fan": lambda: nv.nvmlDeviceGetFanSpeed(h),
    }
    out: dict[str, float | str] = {}
    for name, fn in calls.items():
        c0 = time.thread_time()
        for _ in range(200):
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - an unsupported call still costs time
                out[name + "_error"] = type(exc).__name__
        out[name] = round((time.thread_time() - c0) / 200 * 1e6, 2)
    return out


def integral_from_rows(rows: list[dict[str, Any]], t0: float, t1: float) -> float | None:
    """The instant-power integral from the 10 Hz samples alone (what the counterless default would see
    without 20 Hz power ticks)."""
    pts = [(r["t"], r["power_w"]) for r in rows if t0 <= r["t"] <= t1]
    return trapezoid(pts) if len(pts) >= 2 else None


def diagnostics(probe: NvmlProbe) -> dict[str, Any]:
    """How often the driver refreshes instant power and the energy counter, and what the energy *field*
    read costs next to nvmlDeviceGetTotalEnergyConsumption. Reaches into the probe's NVML module on
    purpose: this is a measurement of the driver, not something metralectl does."""
    nv, h = probe._nv, probe._devices[0].handle
    out: dict[str, Any] = {"per_call_cpu_us": per_call_costs(nv, h)}
    try:
        stamps, values = [], []
        t_end = time.monotonic() + 1.0
        while time.monotonic() < t_end:
            v = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_POWER_INSTANT])[0]
            if v.nvmlReturn == 0:
                stamps.append(v.timestamp)
                values.append(v.value.uiVal)
            time.sleep(0.001)
        distinct = sorted(set(stamps))
        gaps = [(b - a) / 1000.0 for a, b in itertools.pairwise(distinct)]
        out["instant_power_reads"] = len(stamps)
        out["instant_power_distinct_timestamps"] = len(distinct)
        out["instant_power_update_ms_p50"] = percentile(gaps, 50)
        out["instant_power_distinct_values"] = len(set(values))
    except Exception as exc:  # noqa: BLE001 - a diagnostic; record what failed and go on
        out["instant_power_error"] = repr(exc)
    try:
        readings = []
        t_end = time.monotonic() + 1.0
        while time.monotonic() < t_end:
            readings.append((time.monotonic(), nv.nvmlDeviceGetTotalEnergyConsumption(h)))
        changes = [t for (t, v), (_, prev) in zip(readings[1:], readings) if v != prev]
        gaps = [b - a for a, b in itertools.pairwise(changes)]
        out["energy_counter_reads_per_s"] = len(readings)
        out["energy_counter_update_ms_p50"] = (percentile(gaps, 50) or 0) * 1e3 if gaps else None
    except Exception as exc:  # noqa: BLE001
        out["energy_counter_error"] = repr(exc)
    try:
        field_cost = cost(lambda: nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_ENERGY]), 100)
        v = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_ENERGY])[0]
        out["energy_field_cost"] = field_cost
        out["energy_field_return"] = v.nvmlReturn
        out["energy_field_value_mj"] = v.value.ullVal if v.nvmlReturn == 0 else None
        out["energy_counter_value_mj"] = nv.nvmlDeviceGetTotalEnergyConsumption(h)
    except Exception as exc:  # noqa: BLE001
        out["energy_field_error"] = repr(exc)
    return out


def report_row(name: str, r: EnergyReport) -> dict[str, Any]:
    g = r.per_gpu[0] if r.per_gpu else None
    row: dict[str, Any] = {"window": name, "duration_s": r.duration_s, "method": r.method, "valid": r.valid,
                           "flags": list(r.flags), "joules": r.joules, "average_w": r.average_w}
    if g:
        row.update(counter_j=g.counter_j, instant_j=g.instant_j, average_j=g.average_j,
                   instant_vs_counter=relative_difference(g.instant_j, g.counter_j),
                   average_vs_counter=relative_difference(g.average_j, g.counter_j))
    return row


def ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.3f}"


def pct(x: float | None) -> str:
    return "   n/a" if x is None else f"{x * 100:+6.2f} %"


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    try:
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
        say(f"nvidia-smi -L: {smi.stdout.strip() or smi.stderr.strip()}")
    except OSError as exc:
        say(f"nvidia-smi: {exc}")

    probe = NvmlProbe()
    if os.environ.get("GPU_VALIDATION_FAKE"):  # dry-run of this script's plumbing on a machine without a GPU
        from tests.unit import fake_pynvml as fk

        probe = NvmlProbe(nvml=fk.make_fake([fk.FakeDevice(energy_mj=fk.Counter(step_mj=6000), energy_delay_s=0.003)]))
    system = probe.open()
    results["system"] = system.to_json()
    if not isinstance(system, GpuSystem):
        say(f"no GPU: {system.reason}")
        (OUT / "gpu_validation.json").write_text(json.dumps(results, indent=2))
        return 1
    say(f"driver {system.driver_version}, CUDA driver {system.cuda_driver_version}")
    for g in system.gpus:
        say(f"GPU {g.index} {g.name} {g.uuid} pci={g.pci_bus_id} class={g.hw_class} memory={g.memory_kind} "
            f"power_source={g.power_source}")
        say("  supported:   " + ", ".join(k for k, v in sorted(g.support.items()) if v == "ok"))
        say("  unsupported: " + (", ".join(f"{k}={v}" for k, v in sorted(g.support.items()) if v != "ok") or "-"))
    try:
        host_total = parse_meminfo(Path("/proc/meminfo").read_text()).get("MemTotal")
    except OSError:
        host_total = None
    first = probe.sample()
    results["first_sample"] = [s.to_json() for s in first]
    results["host_mem_total"] = host_total
    say(f"host MemTotal {host_total}, NVML total {first[0].memory.total_bytes}")

    results["nvml_cost"] = {"power": cost(probe.power, 2000), "sample": cost(probe.sample, 300),
                            "energy": cost(probe.energy, 100)}
    for k, v in results["nvml_cost"].items():
        say(f"cost {k:7}: wall p50 {v['wall_p50_ms']:.3f} ms, p99 {v['wall_p99_ms']:.3f} ms, "
            f"CPU {v['cpu_per_call_ms']:.3f} ms/call")

    results["driver"] = diagnostics(probe)
    say(f"NVML per-call CPU µs: {results['driver']['per_call_cpu_us']}")
    say(f"driver: { {k: v for k, v in results['driver'].items() if k != 'per_call_cpu_us'} }")

    rows: list[dict[str, Any]] = []

    def record(s: Sample) -> None:
        g = s.gpus[0]
        rows.append({"t": round(s.t, 4), "late_ms": round(s.lateness_s * 1e3, 3), "power_w": g.power_w,
                     "avg_w": g.power.average_w, "util": g.util_gpu_pct, "temp": g.temp_gpu_c, "temp_mem": g.temp_mem_c,
                     "sm_mhz": g.sm_clock_mhz, "reasons": g.clock_reasons,
                     "energy_mj": s.energy[0].energy_mj if s.energy else None})

    # power_hz=20: the no-counter fallback's rate, so the instant integral can be judged against the counter
    sampler = Sampler(probe, hz=10, power_hz=20)
    sampler.subscribe(record)
    windows: dict[str, Any] = {}
    load_out: list[str] = []
    with sampler:
        t0 = time.monotonic()
        time.sleep(0.5)
        w = sampler.open_window()
        time.sleep(IDLE_S)
        windows["idle_before"] = sampler.close_window(w).result(5)
        full = sampler.open_window()
        proc, ready, load_out = start_load()
        ready.wait(180)
        t_ready = time.monotonic() - t0
        time.sleep(3)
        steady = sampler.open_window()
        time.sleep(max(1.0, LOAD_S - 5))
        windows["load_steady"] = sampler.close_window(steady).result(5)
        if proc is not None:
            try:
                proc.wait(timeout=LOAD_S + 120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        time.sleep(2)
        windows["load_with_ramps"] = sampler.close_window(full).result(5)
        time.sleep(1)
        w = sampler.open_window()
        time.sleep(IDLE_S)
        windows["idle_after"] = sampler.close_window(w).result(5)
    stats = sampler.stats()
    results["load_output"] = load_out
    results["load_ready_at_s"] = t_ready
    problems: list[str] = []
    if proc is None:
        problems.append("the load could not start: the load windows saw an idle GPU")
    elif proc.returncode != 0 or not any(line.startswith("DONE") for line in load_out):
        problems.append(f"the load (torch matmul) exited {proc.returncode} without finishing: "
                        f"{' | '.join(load_out[-3:]) or 'no output'}; the load windows saw no steady load")
    results["sampler_stats"] = asdict(stats)
    say(f"load: {' | '.join(load_out[-2:])} (ready at {t_ready:.1f} s)")
    say(f"sampler: {stats.samples} samples, {stats.ticks} ticks over {stats.wall_s:.1f} s, missed {stats.missed_ticks}; "
        f"CPU {stats.cpu_pct or 0:.3f} % of one core; jitter p50 {ms(stats.lateness_p50_s)} ms, "
        f"p99 {ms(stats.lateness_p99_s)} ms, max {ms(stats.lateness_max_s)} ms; "
        f"energy read p50 {ms(stats.energy_read_p50_s)} ms p99 {ms(stats.energy_read_p99_s)} ms")

    idle_w = energy_report(windows["idle_before"]).average_w
    energy_rows = []
    say("\nwindow            dur s  method   counter J  instant J  average J  instant-vs-counter  average-vs-counter  flags")
    for name, data in windows.items():
        r = energy_report(data)
        row = report_row(name, r)
        row["instant_rate_hz"] = data.gpus[0].instant_rate_hz
        # the 10 Hz integral covers the samples inside the window: compare with the counter pro rata
        pts = [r for r in rows if data.t_start <= r["t"] <= data.t_end]
        i10 = integral_from_rows(rows, data.t_start, data.t_end)
        if i10 is not None and row.get("counter_j") and len(pts) >= 2:
            span = pts[-1]["t"] - pts[0]["t"]
            row["instant_10hz_vs_counter"] = relative_difference(i10 / span * r.duration_s, row["counter_j"])
        energy_rows.append(row)
        say(f"{name:17} {r.duration_s:5.1f}  {r.method or '-':8} {row['counter_j'] or 0:10.1f} {row['instant_j'] or 0:10.1f} "
            f"{row['average_j'] or 0:10.1f}  {pct(row['instant_vs_counter']):>18}  {pct(row['average_vs_counter']):>18}  "
            f"{','.join(r.flags) or '-'}  (10 Hz instant: {pct(row.get('instant_10hz_vs_counter'))})")
    results["energy"] = energy_rows
    steady_net = energy_report(windows["load_steady"], output_tokens=1_000_000, baseline_w=idle_w)
    results["steady_with_baseline"] = steady_net.to_json()
    say(f"steady load: {steady_net.average_w or 0:.1f} W gross, idle baseline {idle_w or 0:.1f} W, "
        f"net {steady_net.net_joules or 0:.0f} J over {steady_net.duration_s:.1f} s")

    temps = [row["temp"] for row in rows if row["temp"] is not None]
    reasons = sorted({x for row in rows for x in (row["reasons"] or ())})
    state: Any = "ok"
    states = []
    for row in rows:
        state = thermal_status(row["temp"], row["reasons"], park_c=80, resume_c=70, previous=state).state
        states.append(state)
    results["thermal"] = {"max_temp_c": max(temps) if temps else None, "reasons_seen": reasons,
                          "parked_samples": states.count("parked")}
    say(f"thermal: max {results['thermal']['max_temp_c']} °C; clock reasons seen {reasons}; "
        f"parked samples (80/70 lines) {states.count('parked')}")
    probe.close()

    (OUT / "timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (OUT / "gpu_validation.json").write_text(json.dumps(results, indent=2, default=str))
    (OUT / "gpu_validation.txt").write_text("\n".join(lines) + "\n")

    say("\n== benchmarks/telemetry.py with the real NVML ==")
    bench = subprocess.run([sys.executable, str(Path(__file__).with_name("telemetry.py")), "--seconds", "10",
                            "--json", str(OUT / "telemetry_bench.json")], capture_output=True, text=True, check=False)
    say(bench.stdout.rstrip())
    if bench.returncode:
        say(bench.stderr[-3000:])
        problems.append(f"benchmarks/telemetry.py exited {bench.returncode}")
    results["not_measured"] = problems
    for problem in problems:
        say(f"NOT MEASURED: {problem}")
    (OUT / "gpu_validation.json").write_text(json.dumps(results, indent=2, default=str))
    (OUT / "gpu_validation.txt").write_text("\n".join(lines) + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
