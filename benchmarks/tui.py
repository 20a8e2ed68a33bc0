#!/usr/bin/env python3
"""Dashboard benchmark (a script, not a test): time to first paint, and UI responsiveness while the
Serving view's log tail receives thousands of lines per second.

Both run the real app in a pseudo-terminal (120×40), so terminal output is part of the cost.
- First paint: wall time from spawning the process until its output shows the view tabs, median of
  N runs, interleaved with `python -c pass` (the interpreter's own start) — for the dashboard on fake
  services and for `metralectl tui` itself (real services: they start after the first paint).
  Target ≤ 0.8 s.
- Responsiveness: a heartbeat timer inside the app ticks every 1/60 s; the gaps between its ticks are
  the event loop's frame times. Measured with the log idle and with the fake engine writing RATE
  lines/s to the log tail (through the real worker → Coalescer → LogTail path). Target: frame p99
  ≤ 50 ms at 2,000 lines/s.

    PYTHONPATH=. python3 benchmarks/tui.py [--runs 7] [--seconds 10] [--rate 2000] [--json FILE]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import re
import select
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PAINT_TARGET_S = 0.8
FRAME_TARGET_S = 0.050
SIZE = (120, 40)
ANSI = re.compile(rb"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]")


# -- the child: the app itself ----------------------------------------------------------------------
def child(mode: str, seconds: float, rate: float, out: str) -> None:
    from metralectl.tui.app import MetralectlApp
    from tests.unit.tui.fakes import FakeServices

    services = FakeServices(served=["qwen3.5-35b-a3b"], log_rate=rate if mode == "log" else None,
                            feed_interval_s=1.0)  # the real feed's rate: charts redraw once a second

    class Measured(MetralectlApp):
        def on_mount(self) -> None:
            self.beats: list[float] = []
            if mode == "paint":
                self.set_timer(1.0, self.exit)
                return
            self.set_interval(1 / 60, lambda: self.beats.append(time.perf_counter()))
            self.set_timer(seconds, self.finish)

        def finish(self) -> None:
            from metralectl.tui.widgets.log_tail import LogTail

            log = self.query_one(LogTail)
            gaps = [b - a for a, b in zip(self.beats, self.beats[1:])]
            view = self.query_one("#serving-view")
            Path(out).write_text(json.dumps({
                "gaps": gaps, "received": log.received, "seconds": seconds,
                "skipped": view.lines.dropped,  # type: ignore[attr-defined]
                "cpu_s": time.process_time()}))
            self.exit()

    Measured(services).run()


# -- the parent: spawn in a pty, watch the output ---------------------------------------------------
def spawn(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", SIZE[1], SIZE[0], 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True,
                            start_new_session=True)
    os.close(slave)
    return proc, master


def drain_until(proc: subprocess.Popen[bytes], master: int, marker: bytes | None, timeout: float) -> float | None:
    """Read the pty (so the child never blocks on output); time when the plain text shows `marker`."""
    seen = b""
    found: float | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.05)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            if found is None and marker is not None:
                seen = (seen + ANSI.sub(b"", chunk))[-4096:]
                if marker in seen:
                    found = time.perf_counter()
                    if proc.poll() is None:
                        os.write(master, b"q")
        elif proc.poll() is not None:
            break
    return found


def first_paint(argv: list[str], env: dict[str, str], marker: bytes | None) -> float:
    start = time.perf_counter()
    proc, master = spawn(argv, env)
    found = drain_until(proc, master, marker, 30.0)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    os.close(master)
    end = found if found is not None else time.perf_counter()
    return end - start


def responsiveness(mode: str, seconds: float, rate: float, env: dict[str, str]) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        out = tmp.name
    proc, master = spawn([sys.executable, __file__, "--child", mode, "--seconds", str(seconds), "--rate", str(rate),
                          "--out", out], env)
    drain_until(proc, master, None, seconds + 30)
    proc.wait(10)
    os.close(master)
    data = json.loads(Path(out).read_text())
    os.unlink(out)
    gaps = sorted(data["gaps"])

    def q(p: float) -> float:
        return gaps[min(len(gaps) - 1, int(p / 100 * len(gaps)))]

    return {"mode": mode, "rate": rate if mode == "log" else 0, "ticks": len(gaps) + 1, "gap_p50_s": q(50),
            "gap_p99_s": q(99), "gap_max_s": gaps[-1], "lines": data["received"],
            "lines_per_s": data["received"] / data["seconds"], "skipped": data["skipped"],
            "cpu_pct": 100 * data["cpu_s"] / data["seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--json")
    parser.add_argument("--child")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.seconds, args.rate, args.out or os.devnull)
        return

    home = Path(tempfile.mkdtemp(prefix="metralectl-tui-bench-"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm-256color", "COLUMNS": str(SIZE[0]),
           "LINES": str(SIZE[1]), "METRALE_HOME": str(home / "metrale"), "METRALECTL_LOCK_DIR": str(home)}
    cases = {
        "python -c pass": ([sys.executable, "-c", "pass"], None),
        "dashboard (fake services)": ([sys.executable, __file__, "--child", "paint"], b"Serving"),
        "metralectl tui": ([sys.executable, "-m", "metralectl", "tui"], b"Serving"),
    }
    for argv, marker in cases.values():  # warm the page cache and the byte code once
        first_paint(argv, env, marker)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, (argv, marker) in cases.items():
            times[name].append(first_paint(argv, env, marker))
    print(f"first paint ({SIZE[0]}×{SIZE[1]} pty), median of {args.runs} interleaved runs; target ≤ {PAINT_TARGET_S} s")
    base = statistics.median(times["python -c pass"])
    paint: dict[str, Any] = {}
    for name, samples in times.items():
        med = statistics.median(samples)
        paint[name] = {"median_s": med, "max_s": max(samples)}
        verdict = "" if name.startswith("python") else ("  ok" if med <= PAINT_TARGET_S else "  OVER")
        print(f"  {name:<28}{med:7.3f} s  (max {max(samples):.3f} s, {med / base:4.1f}× python){verdict}")

    print(f"\nframe times (heartbeat every 1/60 s) over {args.seconds:g} s; target p99 ≤ {FRAME_TARGET_S * 1000:.0f} ms")
    idle = responsiveness("idle", args.seconds, 0, env)
    loaded = responsiveness("log", args.seconds, args.rate, env)
    for r in (idle, loaded):
        label = "log idle" if r["mode"] == "idle" else f"log at {r['rate']:.0f} lines/s"
        verdict = "" if r["mode"] == "idle" else ("  ok" if r["gap_p99_s"] <= FRAME_TARGET_S else "  OVER")
        print(f"  {label:<24} p50 {r['gap_p50_s'] * 1000:5.1f} ms  p99 {r['gap_p99_s'] * 1000:5.1f} ms  "
              f"max {r['gap_max_s'] * 1000:6.1f} ms  shown {r['lines_per_s']:7.0f} lines/s  "
              f"skipped {r['skipped']}  CPU {r['cpu_pct']:4.0f} %{verdict}")
    print(f"  p99 ratio loaded/idle: {loaded['gap_p99_s'] / idle['gap_p99_s']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"first_paint": paint, "idle": idle, "loaded": loaded}, indent=2))


if __name__ == "__main__":
    main()
