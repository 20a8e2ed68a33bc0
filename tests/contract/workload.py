#!/usr/bin/env python3
"""TEST FIXTURE: the workload the runtime contract suite runs, the same program as a container and as a host process.

    workload.py [--exit N] [--ignore-sigterm] [--child] [--chatter BYTES,PERIOD_S [--lines N]] [--mark WORD]

Prints `workload up` once its SIGTERM handler is in place, then waits. SIGTERM: `SIGTERM seen, draining`, then (0.3 s later) `drained`, exit 0; with
--ignore-sigterm it prints `SIGTERM ignored` and keeps running (the runtime must SIGKILL it). --exit N prints
`exiting with N` and exits N at once. --child starts a second process in the same process group that only sleeps
(a runtime's stop must take it down too); its pid is printed as `child PID`. --chatter writes BYTES of numbered
lines every PERIOD_S seconds (log rotation): `chatter NNNNNNNN ` and 60 x's, 78 bytes with the newline; with --lines
it exits 0 once it has written N of them. --mark does nothing but stand in its argv and its child's, so that a test
finds its own launch's processes on a machine where other tests run the same program. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def say(text: str) -> None:
    """Whole lines, each in one write(2) where it fits (the rest after a partial one): `print` under -u writes the
    text and its newline apart, and a signal handler that printed in between (SIGTERM's) glued its line to the
    unfinished one."""
    data = (text + "\n").encode()
    while data:
        data = data[os.write(1, data):]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--exit", type=int, default=None)
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--chatter", default="")
    parser.add_argument("--lines", type=int, default=None)
    parser.add_argument("--mark", default="")
    args = parser.parse_args()
    draining = []

    def term(signum: int, frame: object) -> None:
        if args.ignore_sigterm:
            say("SIGTERM ignored")
            return
        say("SIGTERM seen, draining")
        draining.append(time.monotonic())

    signal.signal(signal.SIGTERM, term)
    say("workload up")  # only now: a test that saw it may send SIGTERM and get the workload's answer
    if args.exit is not None:
        say(f"exiting with {args.exit}")
        return args.exit
    if args.child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", args.mark])
        say(f"child {child.pid}")
    size, period = (int(args.chatter.split(",")[0]), float(args.chatter.split(",")[1])) if args.chatter else (0, 0.1)
    line = 0
    while True:
        if draining and time.monotonic() - draining[0] >= 0.3:
            say("drained")
            return 0
        burst = []
        while len(burst) * 78 < size and line != args.lines:
            burst.append(f"chatter {line:08d} " + "x" * 60 + "\n")
            line += 1
        if burst:
            say("".join(burst)[:-1])
        if line == args.lines:
            return 0
        time.sleep(period)


if __name__ == "__main__":
    os.environ.pop("PYTHONSTARTUP", None)
    sys.exit(main())
