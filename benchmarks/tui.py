#!/usr/bin/env python3
"""Dashboard benchmark (a script, not a test): the dashboard's own cost, against a bare Textual app
measured in the same run — first paint, idle CPU, and UI responsiveness while the Serving view's log
tail receives thousands of lines per second.

Everything runs in a pseudo-terminal (120×40), so terminal output is part of the cost. The yardstick is
a bare Textual app (Header, TabbedContent with two tabs, Footer): what any Textual dashboard pays.
Targets are ratios or absolutes within one run, so a busy machine slows both sides alike.
- First paint: wall time from spawning the process until its output shows the view tabs, median of
  N runs, interleaved: `python -c pass`, the bare app, the dashboard on fake services, `metralectl tui`
  (real services: they start after the first paint); with the CPU time each had used by then (steadier
  on a busy machine). Target: `metralectl tui` ≤ 1.3× the bare app (wall). Children run with byte code
  cached (PYTHONDONTWRITEBYTECODE dropped: an installed metralectl has its .pyc) in the measured tree.
- Idle CPU: `metralectl tui` itself (real services: Docker polled, NVML tried, nothing served) and the
  bare app, each from 3 s after its first paint for IDLE seconds, from the process's own CPU times
  (/proc/PID/stat: every thread, and children it waited for). Median of the interleaved runs.
  Target: `metralectl tui` ≤ 5 % of a core.
- Responsiveness: a heartbeat timer inside the app ticks every 1/60 s from 3 s after mount (start-up is
  not a frame); the gaps between its ticks are the event loop's frame times. Measured with the log
  idle and with the fake engine writing RATE lines/s to the log tail (through the real worker →
  Coalescer → LogTail path). CPU is counted over
  the measured window only. Target: frame p99 ≤ 50 ms at 2,000 lines/s.
- The same on the real app (real services: Docker, NVML, the catalog) following a real container's
  log through `docker logs --follow` (`real-log`: a busybox awk writing ~RATE lines/s in
  metralectl-test/engine-bundled:latest, tests/docker_image/build.sh; the status gets one extra row for
  it, since it is no engine of ours). Same target.

    PYTHONPATH=. python3 benchmarks/tui.py [--runs 7] [--idle 15] [--idle-runs 3] [--seconds 10]
        [--rate 2000] [--parts paint,idle,frames,real-log] [--repo TREE] [--compare TREE]
        [--installed VENV/bin/python] [--baseline OTHER_VENV/bin/python] [--json FILE]

`--repo TREE` measures another checkout's dashboard (e.g. the code before a change) with this harness;
`--compare TREE` adds that checkout's `metralectl tui` to the same interleaving (first paint, idle CPU);
`--installed VENV/bin/python` adds the `metralectl tui` a wheel installed there gives (what a user runs),
judged against the same targets; `--baseline OTHER_VENV/bin/python` adds another wheel's (e.g. main's, the
before of a change) to the same interleaving, reported and not judged. Each round runs the cases in a new
order (seeded): a case that always followed the same one would carry what that one left behind.
Exit 1 when a target is missed or a part could not be measured. Every timed child must have done what was
timed: painted its view and exited 0 when asked to quit (`python -c pass`: exited 0), written its frame
times; otherwise the script prints no number for it, says what the child said last, and exits 1.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import random
import re
import resource
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

REPO = Path(os.environ.get("TUI_BENCH_REPO") or Path(__file__).resolve().parents[1])
sys.path.insert(0, str(REPO))
PAINT_TARGET_RATIO = 1.3  # `metralectl tui` against the bare Textual app, same run
IDLE_CPU_TARGET_PCT = 5.0
IDLE_SETTLE_S = 3.0  # after first paint: the first status poll, the library and telemetry start are not idle
FRAME_TARGET_S = 0.050
FRAME_SETTLE_S = 3.0  # the heartbeat starts this long after the app mounts
FLOOD_IMAGE = "metralectl-test/engine-bundled:latest"  # busybox (tests/docker_image/build.sh)
SIZE = (120, 40)
ANSI = re.compile(rb"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]")


class NotMeasured(Exception):
    """A child did not do what was being timed (it crashed, never painted, wrote no result)."""


def last_words(text: bytes, lines: int = 3) -> str:
    """The last lines a child printed (escape sequences gone): usually why it stopped."""
    said = [ln.strip() for ln in text.decode(errors="replace").replace("\r", "\n").splitlines() if ln.strip()]
    return " | ".join(said[-lines:]) or "it printed nothing"


def outcome(argv: list[str], proc: subprocess.Popen[bytes], painted: bool, marker: bytes | None, text: bytes) -> None:
    """Raise NotMeasured unless the child painted (when a marker is awaited) and exited 0."""
    name = " ".join([argv[0]] + [Path(a).name if a.startswith("/") else a for a in argv[1:]])  # which interpreter
    if marker is not None and not painted:
        code = "still running" if proc.returncode is None else f"exit {proc.returncode}"
        raise NotMeasured(f"{name}: never painted ({code}): {last_words(text)}")
    if proc.returncode is None:
        raise NotMeasured(f"{name}: did not exit when asked to quit (killed)")
    if proc.returncode != 0:
        raise NotMeasured(f"{name}: exit {proc.returncode}{' after painting' if painted else ''}: {last_words(text)}")


# -- the children: the bare baseline and the app itself ------------------------------------------------
def bare() -> None:
    """The baseline: what any Textual app with a header, two tabs and a footer costs."""
    from textual.app import App, ComposeResult
    from textual.widgets import Footer, Header, Static, TabbedContent, TabPane

    class Bare(App[None]):
        BINDINGS = [("q", "quit", "Quit")]

        def compose(self) -> ComposeResult:
            yield Header()
            with TabbedContent():
                with TabPane("1 Serving"):
                    yield Static("serving")
                with TabPane("2 Library"):
                    yield Static("library")
            yield Footer()

    Bare().run()


def real_services(container: str) -> Any:
    """The real services (Docker, NVML, the catalog) with one more row in the status: the flood container,
    which is no engine of ours, so `ps` would not list it. Its log comes through the real path."""
    from dataclasses import replace

    from metralectl.lifecycle.status import Serving
    from metralectl.tui.core_services import CoreServices

    class WithFlood(CoreServices):
        def status(self) -> Any:
            report = super().status()
            row = Serving(recipe="log-flood", name=container, owner="bench", state="running", health="-",
                          uptime="-", uptime_s=None, endpoint="-", run_id="-", image=FLOOD_IMAGE, image_revision=None)
            return replace(report, serving=[row, *report.serving])

    return WithFlood()


def child(mode: str, seconds: float, rate: float, out: str) -> None:
    if mode == "bare":
        bare()
        return
    from metralectl.tui.app import MetralectlApp
    from tests.unit.tui.fakes import FakeServices

    services: Any
    if mode.startswith("real-log:"):
        services = real_services(mode.partition(":")[2])
    else:
        services = FakeServices(served=["qwen3.5-35b-a3b"], log_rate=rate if mode == "log" else None,
                                feed_interval_s=1.0)  # the real feed's rate: charts redraw once a second

    class Measured(MetralectlApp):
        def on_mount(self) -> None:
            self.beats: list[float] = []
            if mode == "paint":
                self.set_timer(1.0, self.exit)
                return
            self.set_timer(FRAME_SETTLE_S, self.start_beats)  # start-up (the views mounted after paint) is not a frame

        def start_beats(self) -> None:
            from metralectl.tui.widgets.log_tail import LogTail

            self.cpu0 = time.process_time()
            self.received0 = self.query_one(LogTail).received
            self.set_interval(1 / 60, lambda: self.beats.append(time.perf_counter()))
            self.set_timer(seconds, self.finish)

        def finish(self) -> None:
            from metralectl.tui.widgets.log_tail import LogTail

            log = self.query_one(LogTail)
            gaps = [b - a for a, b in zip(self.beats, self.beats[1:])]
            view = self.query_one("#serving-view")
            Path(out).write_text(json.dumps({
                "gaps": gaps, "received": log.received - self.received0, "seconds": seconds,
                "skipped": view.lines.dropped,  # type: ignore[attr-defined]
                "cpu_s": time.process_time() - self.cpu0}))
            self.exit()

    Measured(services).run()


# -- the parent: spawn in a pty, watch the output ---------------------------------------------------
def spawn(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", SIZE[1], SIZE[0], 0, 0))
    # in the measured tree: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True,
                            start_new_session=True, cwd=env.get("TUI_BENCH_REPO"))
    os.close(slave)
    return proc, master


def drain_until(proc: subprocess.Popen[bytes], master: int, marker: bytes | None, timeout: float,
                quit_on_marker: bool = True, cpu_at: list[float] | None = None,
                text: bytearray | None = None) -> float | None:
    """Read the pty (so the child never blocks on output); time when the plain text shows `marker`
    (and press q then, unless told not to: the caller keeps the app running). `cpu_at` gets the
    child's CPU seconds at that moment; `text` the last plain text it printed (to say why it failed)."""
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
            if text is not None:
                text += ANSI.sub(b"", chunk)
                del text[:-8192]
            if found is None and marker is not None:
                seen = (seen + ANSI.sub(b"", chunk))[-4096:]
                if marker in seen:
                    found = time.perf_counter()
                    if cpu_at is not None:
                        cpu_at.append(cpu_seconds(proc.pid))
                    if not quit_on_marker:
                        return found
                    if proc.poll() is None:
                        os.write(master, b"q")
        elif proc.poll() is not None:
            break
    return found


def first_paint(argv: list[str], env: dict[str, str], marker: bytes | None) -> tuple[float, float]:
    """Wall seconds from spawn to first paint, and the CPU seconds the child used by then (the steadier
    number on a busy machine: it does not count the time other processes held the cores)."""
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc, master = spawn(argv, env)
    cpu: list[float] = []
    text = bytearray()
    found = drain_until(proc, master, marker, 30.0, cpu_at=cpu, text=text)
    end = found if found is not None else time.perf_counter()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        proc.returncode = None  # type: ignore[assignment]  # killed by us: not an exit of its own
    drain_until(proc, master, None, 0.2, text=text)  # what it said while exiting
    os.close(master)
    outcome(argv, proc, found is not None, marker, bytes(text))
    if not cpu:  # no marker (python -c pass): all it used, once reaped
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(usage.ru_utime + usage.ru_stime - waited.ru_utime - waited.ru_stime)
    return end - start, cpu[0]


def cpu_seconds(pid: int) -> float:
    """The process's CPU time so far: every thread, user + system, and children it waited for."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


def served_here() -> int:
    """metralectl engines running on this daemon (another session's tests, on a shared machine): the
    dashboard shows every one, so an 'idle' sample then follows a log and scrapes an engine. -1: no answer."""
    try:
        out = subprocess.run(["docker", "ps", "-q", "--filter", "label=ai.metrale.metralectl.managed=true"],
                             capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return -1
    return len(out.stdout.split())


def idle_cpu(argv: list[str], env: dict[str, str], marker: bytes, seconds: float) -> tuple[float, bool]:
    """Percent of one core the app uses once painted and settled, doing nothing asked of it; and whether
    a metralectl engine ran on the daemon meanwhile (then it was not idle)."""
    served = served_here() > 0
    proc, master = spawn(argv, env)
    text = bytearray()
    try:
        if drain_until(proc, master, marker, 30.0, quit_on_marker=False, text=text) is None:
            try:
                proc.wait(5)  # the pty closed: it is exiting
            except subprocess.TimeoutExpired:
                pass
            outcome(argv, proc, False, marker, bytes(text))
        drain_until(proc, master, None, IDLE_SETTLE_S, text=text)
        before, start = cpu_seconds(proc.pid), time.perf_counter()
        drain_until(proc, master, None, seconds, text=text)
        used, wall = cpu_seconds(proc.pid) - before, time.perf_counter() - start
        served = served or served_here() > 0
        if proc.poll() is not None:
            raise NotMeasured(f"{' '.join(argv)}: exited while idle ({proc.returncode}): {last_words(bytes(text))}")
        os.write(master, b"q")
        drain_until(proc, master, None, 10.0, text=text)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            proc.returncode = None  # type: ignore[assignment]
        outcome(argv, proc, True, marker, bytes(text))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return 100 * used / wall, served


def responsiveness(mode: str, seconds: float, rate: float, env: dict[str, str]) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        out = tmp.name
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--seconds", str(seconds),
            "--rate", str(rate), "--out", out]
    proc, master = spawn(argv, env)
    text = bytearray()
    drain_until(proc, master, None, seconds + FRAME_SETTLE_S + 30, text=text)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        proc.returncode = None  # type: ignore[assignment]
    os.close(master)
    try:
        outcome(argv[:4], proc, False, None, bytes(text))
        try:
            data = json.loads(Path(out).read_text())
        except ValueError:
            raise NotMeasured(f"{mode}: the app exited 0 but wrote no frame times: {last_words(bytes(text))}") from None
    finally:
        os.unlink(out)
    gaps = sorted(data["gaps"])
    if not gaps:
        raise NotMeasured(f"{mode}: the heartbeat never ticked twice in {seconds:g} s")
    if mode != "idle" and not data["received"]:
        raise NotMeasured(f"{mode}: the log tail received no line: the frames were timed without the load")

    def q(p: float) -> float:
        return gaps[min(len(gaps) - 1, int(p / 100 * len(gaps)))]

    return {"mode": mode.partition(":")[0], "rate": rate if mode != "idle" else 0, "ticks": len(gaps) + 1, "gap_p50_s": q(50),
            "gap_p99_s": q(99), "gap_max_s": gaps[-1], "lines": data["received"],
            "lines_per_s": data["received"] / data["seconds"], "skipped": data["skipped"],
            "cpu_pct": 100 * data["cpu_s"] / data["seconds"]}


def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


TUI = [sys.executable, "-m", "metralectl", "tui"]
BASELINE = "metralectl tui (baseline wheel)"


def compared(env: dict[str, str], tree: str | None) -> dict[str, tuple[list[str], dict[str, str]]]:
    """`metralectl tui` of another checkout (`--compare`), measured in the same interleaving."""
    if not tree:
        return {}
    other = str(Path(tree).resolve())
    return {f"metralectl tui @ {Path(other).name}": (TUI, {**env, "PYTHONPATH": other, "TUI_BENCH_REPO": other})}


def installed(env: dict[str, str], python: str | None, baseline: str | None = None
              ) -> dict[str, tuple[list[str], dict[str, str]]]:
    """`--installed PYTHON`: the `metralectl tui` installed in that interpreter's environment (a wheel in a
    fresh venv, as a user has it), run from a directory holding no checkout, with no PYTHONPATH.
    `--baseline PYTHON`: the same for another wheel (the code before a change), reported, not judged."""
    clean = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    clean["TUI_BENCH_REPO"] = str(Path(env["METRALE_HOME"]).parent)  # the cwd of the child: no metralectl/ there
    cases = {"metralectl tui (wheel)": python, BASELINE: baseline}
    return {name: ([py, "-m", "metralectl", "tui"], clean) for name, py in cases.items() if py}


def paint_part(args: argparse.Namespace, env: dict[str, str], me: str, failed: list[str]) -> dict[str, Any]:
    cases: dict[str, tuple[list[str], bytes | None, dict[str, str]]] = {
        "python -c pass": ([sys.executable, "-c", "pass"], None, env),
        "bare Textual app": ([sys.executable, me, "--child", "bare"], b"Serving", env),
        "dashboard (fake services)": ([sys.executable, me, "--child", "paint"], b"Serving", env),
        "metralectl tui": (TUI, b"Serving", env),
        **{name: (argv, b"Serving", other) for name, (argv, other) in compared(env, args.compare).items()},
        **{name: (argv, b"Serving", other) for name, (argv, other) in installed(env, args.installed, args.baseline).items()},
    }
    for argv, marker, case_env in cases.values():  # warm the page cache and the byte code once
        first_paint(argv, case_env, marker)
    times: dict[str, list[float]] = {name: [] for name in cases}
    cpus: dict[str, list[float]] = {name: [] for name in cases}
    shuffle = random.Random(0).shuffle  # the same orders every time the script runs
    for _ in range(args.runs):
        order = list(cases.items())
        shuffle(order)  # a new order each round: no case always runs first, or always right after the same one
        for name, (argv, marker, case_env) in order:
            wall, cpu = first_paint(argv, case_env, marker)
            times[name].append(wall)
            cpus[name].append(cpu)
    print(f"first paint ({SIZE[0]}×{SIZE[1]} pty), median of {args.runs} interleaved runs: wall time, and the CPU "
          f"time the process used until then; target: metralectl tui ≤ {PAINT_TARGET_RATIO}× the bare app (wall)")
    base, base_cpu = statistics.median(times["bare Textual app"]), statistics.median(cpus["bare Textual app"])
    out: dict[str, Any] = {}
    for name, samples in times.items():
        med, cpu = statistics.median(samples), statistics.median(cpus[name])
        out[name] = {"median_s": med, "max_s": max(samples), "samples_s": samples, "ratio_to_bare": med / base,
                     "cpu_median_s": cpu, "cpu_samples_s": cpus[name], "cpu_ratio_to_bare": cpu / base_cpu}
        verdict = ""
        if name.startswith("metralectl tui"):
            verdict = "  ok" if med / base <= PAINT_TARGET_RATIO else "  OVER"
        if name in ("metralectl tui", "metralectl tui (wheel)"):
            if verdict == "  OVER":
                failed.append(f"{name}: first paint {med / base:.2f}× the bare app")
        print(f"  {name:<32}{med:7.3f} s  (min {min(samples):.3f} s)  {med / base:5.2f}× bare   "
              f"CPU {cpu:6.3f} s  (min {min(cpus[name]):.3f} s)  {cpu / base_cpu:5.2f}× bare{verdict}")
    return out


def idle_part(args: argparse.Namespace, env: dict[str, str], me: str, failed: list[str]) -> dict[str, Any]:
    print(f"idle CPU, % of one core over {args.idle:g} s from {IDLE_SETTLE_S:g} s after first paint, "
          f"median of {args.idle_runs} interleaved runs; target: metralectl tui ≤ {IDLE_CPU_TARGET_PCT:g} %")
    cases = {"bare Textual app": ([sys.executable, me, "--child", "bare"], env), "metralectl tui": (TUI, env),
             **compared(env, args.compare), **installed(env, args.installed, args.baseline)}
    idle: dict[str, list[float]] = {name: [] for name in cases}
    busy: dict[str, list[bool]] = {name: [] for name in cases}
    for _ in range(args.idle_runs):
        for name, (argv, case_env) in cases.items():
            pct, served = idle_cpu(argv, case_env, b"Serving", args.idle)
            idle[name].append(pct)
            busy[name].append(served)
    out: dict[str, Any] = {}
    for name, samples in idle.items():
        med = statistics.median(samples)
        out[name] = {"median_pct": med, "samples_pct": samples, "engine_running_elsewhere": busy[name]}
        verdict = ""
        if name.startswith("metralectl tui"):
            verdict = "  ok" if med <= IDLE_CPU_TARGET_PCT else "  OVER"
        if name in ("metralectl tui", "metralectl tui (wheel)"):
            if verdict == "  OVER":
                failed.append(f"{name}: idle CPU {med:.1f} %")
        runs = ", ".join(f"{v:.1f}{'*' if b else ''}" for v, b in zip(samples, busy[name]))
        print(f"  {name:<32}{med:5.1f} %  (runs: {runs}){verdict}")
    if any(any(b) for b in busy.values()):
        print("  * a metralectl engine (another session's) ran on this Docker daemon during the run: the dashboard "
              "showed it, followed its log and scraped it — not idle")
    return out


def frames_part(args: argparse.Namespace, env: dict[str, str], failed: list[str]) -> dict[str, Any]:
    print(f"frame times (heartbeat every 1/60 s) over {args.seconds:g} s from {FRAME_SETTLE_S:g} s after mount, "
          f"dashboard on fake services; target p99 ≤ {FRAME_TARGET_S * 1000:.0f} ms at {args.rate:.0f} lines/s")
    quiet = responsiveness("idle", args.seconds, 0, env)
    loaded = responsiveness("log", args.seconds, args.rate, env)
    for r in (quiet, loaded):
        label = "log idle" if r["mode"] == "idle" else f"log at {r['rate']:.0f} lines/s"
        verdict = "" if r["mode"] == "idle" else ("  ok" if r["gap_p99_s"] <= FRAME_TARGET_S else "  OVER")
        if verdict == "  OVER":
            failed.append(f"frame p99 {r['gap_p99_s'] * 1000:.0f} ms")
        print(f"  {label:<24} p50 {r['gap_p50_s'] * 1000:5.1f} ms  p99 {r['gap_p99_s'] * 1000:5.1f} ms  "
              f"max {r['gap_max_s'] * 1000:6.1f} ms  shown {r['lines_per_s']:7.0f} lines/s  "
              f"skipped {r['skipped']}  CPU {r['cpu_pct']:4.0f} %{verdict}")
    print(f"  p99 ratio loaded/idle: {loaded['gap_p99_s'] / quiet['gap_p99_s']:.2f}")
    return {"idle": quiet, "loaded": loaded}


def flood_container(rate: float) -> str:
    """A container that writes about RATE lines a second to its log (awk: a burst, then usleep 10 ms; one
    round takes ≈12 ms with the fork). What the dashboard received is measured, not assumed."""
    per_tick = max(1, round(rate * 0.012))
    script = (f'BEGIN {{ while (1) {{ for (i = 0; i < {per_tick}; i++) print "flood line " n++ " the quick brown fox '
              f'jumps over the lazy dog"; fflush(); system("usleep 10000") }} }}')
    name = f"metralectl-tui-bench-flood-{os.getpid()}"
    try:
        subprocess.run(["docker", "run", "-d", "--rm", "--network", "none", "--name", name, "--entrypoint", "/bin/busybox",
                        FLOOD_IMAGE, "awk", script], check=True, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        raise SystemExit(f"real-log: could not start the flood container from {FLOOD_IMAGE} ({detail}); "
                         "build it with tests/docker_image/build.sh, or leave real-log out of --parts") from None
    return name


def real_log_part(args: argparse.Namespace, env: dict[str, str], failed: list[str]) -> dict[str, Any]:
    print(f"frame times over {args.seconds:g} s from {FRAME_SETTLE_S:g} s after mount, the real app (real services) "
          f"following a real container's log (docker logs --follow) at ~{args.rate:.0f} lines/s; "
          f"target p99 ≤ {FRAME_TARGET_S * 1000:.0f} ms")
    try:
        name = flood_container(args.rate)
    except SystemExit as exc:
        print(f"  NOT MEASURED: {exc}")
        failed.append("real-log not measured")
        return {}
    try:
        r = responsiveness(f"real-log:{name}", args.seconds, args.rate, env)
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60, check=False)
    verdict = "  ok" if r["gap_p99_s"] <= FRAME_TARGET_S else "  OVER"
    if verdict == "  OVER":
        failed.append(f"real app frame p99 {r['gap_p99_s'] * 1000:.0f} ms")
    if r["lines_per_s"] < 0.8 * args.rate:
        verdict += f"  (the log delivered only {r['lines_per_s']:.0f} lines/s)"
    print(f"  {'real log':<24} p50 {r['gap_p50_s'] * 1000:5.1f} ms  p99 {r['gap_p99_s'] * 1000:5.1f} ms  "
          f"max {r['gap_max_s'] * 1000:6.1f} ms  shown {r['lines_per_s']:7.0f} lines/s  "
          f"skipped {r['skipped']}  CPU {r['cpu_pct']:4.0f} %{verdict}")
    return r


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--idle", type=float, default=15.0, help="seconds of idle CPU measured per run")
    parser.add_argument("--idle-runs", type=int, default=3)
    parser.add_argument("--repo", help="measure this checkout's dashboard (default: the one holding this script)")
    parser.add_argument("--compare", help="also measure this checkout's `metralectl tui`, interleaved (before/after)")
    parser.add_argument("--installed", metavar="PYTHON",
                        help="also measure the metralectl installed for this interpreter (a wheel in a fresh venv)")
    parser.add_argument("--baseline", metavar="PYTHON",
                        help="also measure the metralectl installed for this interpreter (a wheel of the code before a "
                             "change, in its own fresh venv), interleaved with the rest; reported, not judged")
    parser.add_argument("--parts", default="paint,idle,frames,real-log", help="which measurements (comma-separated)")
    parser.add_argument("--json")
    parser.add_argument("--child")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.seconds, args.rate, args.out or os.devnull)
        return

    repo = Path(args.repo).resolve() if args.repo else REPO
    home = Path(tempfile.mkdtemp(prefix="metralectl-tui-bench-"))
    env = {**os.environ, "PYTHONPATH": str(repo), "TUI_BENCH_REPO": str(repo), "TERM": "xterm-256color",
           "COLUMNS": str(SIZE[0]), "LINES": str(SIZE[1]), "METRALE_HOME": str(home / "metrale"),
           "METRALECTL_LOCK_DIR": str(home)}
    # An installed metralectl has its byte code compiled; a checkout run with PYTHONDONTWRITEBYTECODE would
    # compile every module on every start, which no user pays (the warm-up run writes the caches).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    me = str(Path(__file__).resolve())
    parts = set(args.parts.split(","))
    print(f"tree measured: {repo}; load average before: {load()}")
    failed: list[str] = []
    results: dict[str, Any] = {"tree": str(repo), "load_before": os.getloadavg()}
    try:
        if "paint" in parts:
            results["first_paint"] = paint_part(args, env, me, failed)
        if "idle" in parts:
            results["idle_cpu"] = idle_part(args, env, me, failed)
        if "frames" in parts:
            results.update(frames_part(args, env, failed))
        if "real-log" in parts:
            results["real_log"] = real_log_part(args, env, failed)
    except NotMeasured as exc:  # a number of a program that did not run is no number: none is printed
        results["not_measured"] = str(exc)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
        print(f"NOT MEASURED: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    print(f"load average after: {load()}")
    results["load_after"] = os.getloadavg()
    results["over"] = failed
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if failed:
        print("OVER TARGET: " + "; ".join(failed), file=sys.stderr)
        raise SystemExit(1)

if __name__ == "__main__":
    main()
