#!/usr/bin/env python3
"""Cold start: median wall time of `metralectl --help` and `metralectl list` vs `python -c pass`.

Measured in one run, interleaved, so machine noise hits all three alike. Target: <= 0.15 s.
Usage: python3 benchmarks/cold_start.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def console_script() -> list[str]:
    """The installed entry point (not a pyenv shim, which adds a bash start of its own)."""
    beside = Path(sys.executable).parent / "metralectl"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("metralectl")
    return [found] if found else [sys.executable, "-m", "metralectl"]


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    script = console_script()
    # A wheel install byte-compiles the package; a checkout run with PYTHONDONTWRITEBYTECODE=1 would
    # otherwise recompile every module on every start and measure the compiler instead.
    import compileall

    compileall.compile_dir(str(Path(__file__).resolve().parents[1] / "metralectl"), quiet=1)
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "metralectl --help": [*script, "--help"],
        "metralectl list": [*script, "list"],
    }
    env_note = os.environ.get("METRALECTL_CONFIG_DIR", "default config dir")
    times: dict[str, list[float]] = {name: [] for name in cases}
    for argv in cases.values():  # warm the page cache once
        wall(argv)
    for _ in range(args.runs):
        for name, argv in cases.items():
            times[name].append(wall(argv))
    base = statistics.median(times["python -c pass"])
    print(f"cold start, median of {args.runs} interleaved runs ({' '.join(script)}; {env_note})")
    print(f"{'case':<20}{'median s':>10}{'p90 s':>9}{'x pass':>8}{'over pass s':>13}  target")
    for name, samples in times.items():
        med = statistics.median(samples)
        p90 = sorted(samples)[int(0.9 * (len(samples) - 1))]
        target = "" if name.startswith("python") else ("<= 0.15 s " + ("ok" if med <= 0.15 else "MISSED"))
        print(f"{name:<20}{med:>10.3f}{p90:>9.3f}{med / base:>8.2f}{med - base:>13.3f}  {target}")


if __name__ == "__main__":
    main()
