#!/usr/bin/env python3
"""TEST FIXTURE: the workload the runtime contract suite runs, the same program as a container and as a host process.

    workload.py [--exit N] [--ignore-sigterm] [--child] [--chatter BYTES,PERIOD_S]

Prints `workload up`, then waits. SIGTERM: `SIGTERM seen, draining`, then (0.3 s later) `drained`, exit 0; with
--ignore-sigterm it prints `SIGTERM ignored` and keeps running (the runtime must SIGKILL it). --exit N prints
`exiting with N` and exits N at once. --child starts a second process in the same process group that only sleeps
(a runtime's stop must take it down too); its pid is printed as `child PID`. --chatter writes BYTES of numbered
lines every PERIOD_S seconds (log rotation). Standard library only.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--exit", type=int, default=None)
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--chatter", default="")
    args = parser.parse_args()
    print("workload up", flush=True)
    if args.exit is not None:
        print(f"exiting with {args.exit}", flush=True)
        return args.exit
    draining = []

    def term(signum: int, frame: object) -> None:
        if args.ignore_sigterm:
            print("SIGTERM ignored", flush=True)
            return
        print("SIGTERM seen, draining", flush=True)
        draining.append(time.monotonic())

    signal.signal(signal.SIGTERM, term)
    if args.child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        print(f"child {child.pid}", flush=True)
    size, period = (int(args.chatter.split(",")[0]), float(args.chatter.split(",")[1])) if args.chatter else (0, 0.1)
    line = 0
    while True:
        if draining and time.monotonic() - draining[0] >= 0.3:
            print("drained", flush=True)
            return 0
        written = 0
        while written < size:
            text = f"chatter {line:08d} " + "x" * 60
            print(text, flush=False)
            written += len(text) + 1
            line += 1
        sys.stdout.flush()
        time.sleep(period)


if __name__ == "__main__":
    os.environ.pop("PYTHONSTARTUP", None)
    sys.exit(main())
