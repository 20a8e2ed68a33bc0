"""GPU energy over AIPerf's measured window, so its J per output token sits beside metralectl's.

    python3 energy_window.py sample OUT.jsonl      # until SIGTERM: (time_ns, total energy mJ) every 50 ms
    python3 energy_window.py judge SAMPLES.jsonl AIPERF_DIR   # J, seconds, output tokens, J/token -> stdout JSON

AIPerf records no energy here (its GPU telemetry needs a DCGM exporter). The sampler reads NVML's total
energy counter (the method metralectl's own records call `counter`); `judge` takes AIPerf's measured
requests (profile_export.jsonl: request start/end in wall-clock ns, output tokens) and counts the energy
between the first start and the last end, interpolating the counter. Standard library + pynvml only.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any


def sample(out: Path) -> None:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    stop = False

    def done(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, done)
    with out.open("w") as f:
        while not stop:
            f.write(json.dumps([time.time_ns(), pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)]) + "\n")
            f.flush()
            time.sleep(0.05)


def _find(obj: Any, key: str) -> Any:
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for v in obj.values():
            found = _find(v, key)
            if found is not None:
                return found
    return None


def _energy_at(samples: list[tuple[int, float]], t: int) -> float:
    for (t0, e0), (t1, e1) in zip(samples, samples[1:]):
        if t0 <= t <= t1:
            return e0 + (e1 - e0) * (t - t0) / max(t1 - t0, 1)
    raise ValueError("outside the sampled window")


def judge(samples_path: Path, aiperf_dir: Path) -> dict[str, Any]:
    samples = [tuple(json.loads(line)) for line in samples_path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in (aiperf_dir / "profile_export.jsonl").read_text().splitlines()
               if line.strip()]
    records = [r for r in records if _find(r, "phase_kind") != "warmup"]  # its warm-up requests are unmeasured
    starts = [v for r in records if (v := _find(r, "request_start_ns")) is not None]
    ends = [v for r in records if (v := _find(r, "request_end_ns")) is not None]
    tokens = 0.0
    for r in records:
        value = _find(r, "output_token_count")
        tokens += float(value.get("value", 0) if isinstance(value, dict) else value or 0)
    if not starts or not ends or not tokens or len(samples) < 2:
        return {"error": f"cannot judge: {len(starts)} starts, {len(ends)} ends, {tokens} tokens, {len(samples)} samples"}
    t0, t1 = min(starts), max(ends)
    joules = (_energy_at(samples, t1) - _energy_at(samples, t0)) / 1000.0  # type: ignore[arg-type]
    return {"joules": round(joules, 2), "seconds": round((t1 - t0) / 1e9, 3), "output_tokens": tokens,
            "requests": len(records), "j_per_output_token": round(joules / tokens, 5), "method": "counter"}


if __name__ == "__main__":
    if sys.argv[1] == "sample":
        sample(Path(sys.argv[2]))
    else:
        print(json.dumps(judge(Path(sys.argv[2]), Path(sys.argv[3]))))
