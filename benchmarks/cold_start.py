#!/usr/bin/env python3
"""Cold start from a wheel, side by side with RamaLama (a script, not a test).

What a user gets after `pip install metralectl`: the worktree is built into a wheel, the wheel is
installed with its dependencies into a fresh venv, and `ramalama` (0.25, a Python CLI of the same
kind) into another fresh venv, so neither tool's dependencies touch the other. Their console
scripts are then timed directly (no pyenv shim), interleaved round-robin with `python -c pass`, so
the noise of this shared machine hits every case alike. Each tool runs with an empty HOME and XDG
dirs of its own (no user recipes, an empty RamaLama store); the first, untimed round fills
metralectl's caches (the checked catalog, `list`'s rows), as any earlier run would have; the
", no caches" case gets an empty cache dir every run and shows the cost without them. `--baseline REF`
(e.g. main) also builds the wheel of that git commit into a venv of its own and times it in the same
rounds ("metralectl@REF"): a before/after table from one run. "cpu s" is the
process's own user+system time: on a busy machine wall time grows with the queue, CPU time much less. `ps` runs with the Docker daemon reachable (the default socket) and with
DOCKER_HOST at a socket nobody listens on; "daemon answer" is the same requests `ps` makes
(/version, /_ping, the labelled container list, one inspect per container and image), timed
in-process over a raw socket: what `ps` cannot do faster than.

Targets: `--help` <= 0.10 s and `list` <= 0.12 s, each also <= 30 % of RamaLama's in the same run;
`ps` <= 0.30 s over the daemon's answer.

Every run of every case must give the answer being timed (exit 0; `ps` with no daemon: 69, "unavailable";
`doctor`: 0 or 1; the in-process daemon answer: no error), the untimed first round included: otherwise the
script stops at once with the command, its exit status and what it printed, and exits 1.

    python3 benchmarks/cold_start.py [--runs 21] [--baseline REF] [--json FILE|-] [--check] [--fresh] [--doctor]

The venvs are kept under ~/.cache/metralectl-bench/cold_start (metralectl's keyed by the wheel's
sha256) so a rerun only rebuilds the wheel; --fresh builds every venv in a temp dir and removes them.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
RAMALAMA_SPEC = "ramalama==0.25.*"
DOCKER_SOCKET = "/var/run/docker.sock"
MANAGED_LABEL = "ai.metrale.metralectl.managed=true"  # metralectl/render.py: LABEL_MANAGED
LIMITS = {"metralectl --help": 0.10, "metralectl list": 0.12}
RAMALAMA_SHARE = 0.30
PS_OVER_DAEMON_S = 0.30
UNAVAILABLE = 69  # docs/exit-codes.md: what `ps` answers when no daemon listens (70 would be a crash)


def fail(message: str, detail: str = "") -> None:
    print(f"cold_start: {message}", file=sys.stderr)
    if detail:
        print(detail[-3000:], file=sys.stderr)
    sys.exit(1)


def run_quiet(argv: list[str], what: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        fail(f"{what} failed (exit {done.returncode}): {' '.join(argv)}", done.stdout + done.stderr)
    return done.stdout


# --- the two installs -------------------------------------------------------------------------------
def source_commit() -> str:
    """The commit the wheel was built from ("+dirty" when the tree had changes; "?" outside git)."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "metralectl", "engine",
                                "kernels", "images", "recipes", "pyproject.toml"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return head + ("+dirty" if dirty else "")


def commit_of(ref: str) -> str:
    return run_quiet(["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"], f"finding {ref}").strip()


def export_tree(commit: str, into: Path) -> Path:
    """The files of `commit` (what a clone of it holds), to build its wheel from."""
    into.mkdir(parents=True)
    archive = into.with_suffix(".tar")
    run_quiet(["git", "-C", str(REPO), "archive", "--format=tar", "-o", str(archive), commit], f"exporting {commit}")
    run_quiet(["tar", "-xf", str(archive), "-C", str(into)], f"unpacking {archive}")
    return into


def build_wheel(into: Path, source: Path = REPO) -> tuple[Path, str]:
    run_quiet([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(into), str(source)],
              f"building the wheel of {source}")
    wheels = sorted(into.glob("metralectl_cockpit-*.whl"))
    if len(wheels) != 1:
        fail(f"expected one metralectl wheel in {into}, found {[w.name for w in wheels]}")
    return wheels[0], hashlib.sha256(wheels[0].read_bytes()).hexdigest()


def venv(path: Path, requirement: str, fresh: bool) -> tuple[Path, bool]:
    """A venv holding `requirement` and its dependencies; reused only if a previous install completed."""
    marker = path / ".installed"
    if not fresh and marker.exists() and marker.read_text() == requirement:
        return path / "bin", True
    shutil.rmtree(path, ignore_errors=True)
    run_quiet([sys.executable, "-m", "venv", str(path)], f"creating the venv {path}")
    # pip byte-compiles what it installs, as a user's install would: no run pays for the compiler.
    run_quiet([str(path / "bin" / "python"), "-m", "pip", "install", "--quiet", requirement],
              f"installing {requirement}")
    marker.write_text(requirement)
    return path / "bin", False


def installed_version(bin_dir: Path, dist: str) -> str:
    return run_quiet([str(bin_dir / "python"), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                     f"reading {dist}'s version").strip()


# --- the daemon ------------------------------------------------------------------------------------
class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=5)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect(self.socket_path)


def _get(conn: UnixHTTP, path: str) -> Any:
    conn.request("GET", path)
    reply = conn.getresponse()
    body = reply.read()
    return json.loads(body) if reply.getheader("Content-Type", "").startswith("application/json") else body


def daemon_answer() -> int:
    """The requests `metralectl ps` makes of the daemon, on one kept-alive connection as docker-py does;
    returns how many metralectl containers it listed."""
    conn = UnixHTTP(DOCKER_SOCKET)
    try:
        api = "/v" + _get(conn, "/version")["ApiVersion"]
        _get(conn, api + "/_ping")
        query = urllib.parse.urlencode({"all": "1", "filters": json.dumps({"label": [MANAGED_LABEL]})})
        listed = _get(conn, f"{api}/containers/json?{query}")
        images = set()
        for item in listed:
            info = _get(conn, f"{api}/containers/{item['Id']}/json")
            images.add((info.get("Config") or {}).get("Image", ""))
        for image in images - {""}:
            _get(conn, f"{api}/images/{urllib.parse.quote(image, safe='')}/json")
        return len(listed)
    finally:
        conn.close()


def daemon_state() -> dict[str, Any]:
    try:
        conn = UnixHTTP(DOCKER_SOCKET)
        version = _get(conn, "/version")
        conn.close()
        return {"reachable": True, "socket": DOCKER_SOCKET, "version": version.get("Version"),
                "metralectl_containers": daemon_answer()}
    except OSError as exc:
        return {"reachable": False, "socket": DOCKER_SOCKET, "error": str(exc)}


# --- timing ----------------------------------------------------------------------------------------
@dataclass
class Case:
    name: str
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    expect: tuple[int, ...] = (0,)  # the exit statuses that are the answer being timed
    fresh_cache: bool = False  # a new empty XDG_CACHE_HOME for every run
    call: Callable[[], Any] | None = None  # timed in-process instead of as a command
    samples: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # user + system seconds of the process (0 for in-process)
    exit_codes: set[int] = field(default_factory=set)

    def once(self, scratch: Path) -> tuple[float, float]:
        """(wall seconds, CPU seconds) of one run."""
        if self.call is not None:
            start = time.perf_counter()
            try:
                self.call()
            except Exception as exc:  # noqa: BLE001 - whatever it was, the time is not of the answer
                fail(f"{self.name}: {type(exc).__name__}: {exc}, which is not the answer being timed")
            return time.perf_counter() - start, 0.0
        env = dict(self.env)
        if self.fresh_cache:
            env["XDG_CACHE_HOME"] = tempfile.mkdtemp(dir=scratch)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            start = time.perf_counter()
            proc = subprocess.Popen(self.argv, env=env, stdout=out, stderr=err)
            _, status, usage = os.wait4(proc.pid, 0)  # the child's own CPU time: contention shows in wall only
            took = time.perf_counter() - start
            proc.returncode = code = os.waitstatus_to_exitcode(status)
            out.seek(0)
            err.seek(0)
            said = out.read().decode(errors="replace") + err.read().decode(errors="replace")
        self.exit_codes.add(code)
        if code not in self.expect:
            fail(f"{self.name}: exit {code} (expected {' or '.join(map(str, self.expect))}), which is not the answer "
                 f"being timed: {' '.join(self.argv)}", said)
        return took, usage.ru_utime + usage.ru_stime


def home_env(root: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """An empty home: HOME and every XDG dir inside it, and nothing of the caller's environment except
    PATH (RamaLama's `ps` runs the docker CLI), the locale and a fixed width for help text."""
    for sub in ("config", "data", "cache", "state"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    env = {"HOME": str(root), "XDG_CONFIG_HOME": str(root / "config"), "XDG_DATA_HOME": str(root / "data"),
           "XDG_CACHE_HOME": str(root / "cache"), "XDG_STATE_HOME": str(root / "state"),
           "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": os.environ.get("LANG", "C.UTF-8"),
           "COLUMNS": "100", "TERM": "dumb"}
    env.update(extra or {})
    return env


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def measure(cases: list[Case], runs: int, scratch: Path) -> None:
    for case in cases:  # untimed: page cache, the catalog cache, pip's first-run notes
        case.once(scratch)
    for round_no in range(runs):  # round-robin, starting one case later each round: no case always first
        shift = round_no % len(cases)
        for case in cases[shift:] + cases[:shift]:
            wall, cpu = case.once(scratch)
            case.samples.append(wall)
            case.cpu.append(cpu)


# --- report ----------------------------------------------------------------------------------------
def targets(by_name: dict[str, Case]) -> list[dict[str, Any]]:
    med = {name: statistics.median(c.samples) for name, c in by_name.items()}
    out = []
    for name, limit in LIMITS.items():
        out.append({"case": name, "rule": f"<= {limit:.2f} s", "limit_s": limit, "median_s": med[name]})
        rival = name.replace("metralectl", "ramalama")
        share = RAMALAMA_SHARE * med[rival]
        out.append({"case": name, "rule": f"<= {RAMALAMA_SHARE:.0%} of {rival}", "limit_s": share, "median_s": med[name]})
    if "metralectl ps (daemon)" in med:
        limit = PS_OVER_DAEMON_S + med["daemon answer (in-process)"]
        out.append({"case": "metralectl ps (daemon)", "rule": f"<= {PS_OVER_DAEMON_S:.2f} s + daemon answer",
                    "limit_s": limit, "median_s": med["metralectl ps (daemon)"]})
    out.append({"case": "metralectl ps (no daemon)", "rule": f"<= {PS_OVER_DAEMON_S:.2f} s",
                "limit_s": PS_OVER_DAEMON_S, "median_s": med["metralectl ps (no daemon)"]})
    for target in out:
        target["ok"] = target["median_s"] <= target["limit_s"]
    return out


def rival_of(name: str) -> str:
    """`metralectl list, no caches` and `metralectl@main list` are held to `ramalama list`."""
    head = name.split(",")[0].replace(" (no daemon)", " (daemon)")
    return "ramalama " + head.split(" ", 1)[1]


def print_table(cases: list[Case], goals: list[dict[str, Any]], header: str) -> None:
    by_name = {c.name: c for c in cases}
    base = statistics.median(by_name["python -c pass"].samples)
    print(header)
    print(f"{'case':<34}{'median s':>9}{'p90 s':>8}{'min s':>8}{'x python':>9}{'x ramalama':>11}{'cpu s':>8}")
    for case in cases:
        med = statistics.median(case.samples)
        rival = by_name.get(rival_of(case.name)) if case.name.startswith("metralectl") and case.argv else None
        versus = f"{med / statistics.median(rival.samples):.2f}" if rival else ""
        cpu = f"{statistics.median(case.cpu):.3f}" if case.call is None else "-"
        print(f"{case.name:<34}{med:>9.3f}{pct(case.samples, 0.9):>8.3f}{min(case.samples):>8.3f}"
              f"{med / base:>9.1f}{versus:>11}{cpu:>8}")
    print("\ntargets (medians)")
    for goal in goals:
        verdict = "ok" if goal["ok"] else "MISSED"
        print(f"  {goal['case']:<28} {goal['median_s']:.3f} s  {goal['rule']} ({goal['limit_s']:.3f} s)  {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=21, help="timed rounds (default 21)")
    parser.add_argument("--json", metavar="FILE", help="also write the result as JSON to FILE (- for stdout)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    parser.add_argument("--fresh", action="store_true", help="build every venv in a temp dir, not the cache")
    parser.add_argument("--baseline", metavar="REF", help="also time the wheel of this git commit (e.g. main), "
                                                           "in the same rounds: a before/after table")
    parser.add_argument("--doctor", action="store_true", help="also time `metralectl doctor` (no target)")
    parser.add_argument("--ramalama", default=RAMALAMA_SPEC, help=f"RamaLama's requirement (default {RAMALAMA_SPEC})")
    args = parser.parse_args()
    if args.runs < 1:
        fail("--runs must be at least 1")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "metralectl-bench" / "cold_start"
    with tempfile.TemporaryDirectory(prefix="cold_start-") as tmp_name:
        tmp = Path(tmp_name)
        where = tmp / "venvs" if args.fresh else cache
        print("building the wheel and the venvs ...", file=sys.stderr)
        wheel, digest = build_wheel(tmp / "wheel")
        baseline: dict[str, Any] = {}
        if args.baseline:
            base_commit = commit_of(args.baseline)
            base_wheel, base_digest = build_wheel(tmp / "wheel-baseline", export_tree(base_commit, tmp / "baseline"))
            baseline = {"ref": args.baseline, "commit": base_commit, "wheel_sha256": base_digest}
        keep = {f"metralectl-{d[:16]}" for d in (digest, baseline.get("wheel_sha256", digest))}
        for old in where.glob("metralectl-*") if where.is_dir() else []:
            if old.name not in keep:  # a venv of an older wheel
                shutil.rmtree(old, ignore_errors=True)
        ours, ours_reused = venv(where / f"metralectl-{digest[:16]}", str(wheel), args.fresh)
        if baseline:
            base_bin, base_reused = venv(where / f"metralectl-{baseline['wheel_sha256'][:16]}", str(base_wheel),
                                         args.fresh)
            baseline["venv"] = "reused" if base_reused else "new"
        rival_dir = "ramalama-" + hashlib.sha256(args.ramalama.encode()).hexdigest()[:8]
        theirs, theirs_reused = venv(where / rival_dir, args.ramalama, args.fresh)
        versions = {"metralectl": installed_version(ours, "metralectl-cockpit"), "ramalama": installed_version(theirs, "ramalama")}
        daemon = daemon_state()
        mine, rivals = home_env(tmp / "home-metralectl"), home_env(tmp / "home-ramalama")
        m, r = str(ours / "metralectl"), str(theirs / "ramalama")
        no_daemon = {"DOCKER_HOST": f"unix://{tmp}/nobody-listens.sock"}
        cases = [
            Case("python -c pass", [str(ours / "python"), "-c", "pass"], mine),
            Case("metralectl --help", [m, "--help"], mine),
            Case("ramalama --help", [r, "--help"], rivals),
            Case("metralectl --version", [m, "--version"], mine),
            Case("ramalama --version", [r, "--version"], rivals),
            Case("metralectl list", [m, "list"], mine),
            Case("ramalama list", [r, "list"], rivals),
            Case("metralectl list, no caches", [m, "list"], mine, fresh_cache=True),
            Case("metralectl ps (no daemon)", [m, "ps"], {**mine, **no_daemon}, expect=(UNAVAILABLE,)),
        ]
        if daemon["reachable"]:
            cases += [Case("metralectl ps (daemon)", [m, "ps"], mine), Case("ramalama ps (daemon)", [r, "ps"], rivals),
                      Case("daemon answer (in-process)", call=daemon_answer)]
        if baseline:
            b, before = f"metralectl@{args.baseline}", home_env(tmp / "home-baseline")
            exe = str(base_bin / "metralectl")
            cases += [Case(f"{b} --help", [exe, "--help"], before), Case(f"{b} --version", [exe, "--version"], before),
                      Case(f"{b} list", [exe, "list"], before),
                      Case(f"{b} list, no caches", [exe, "list"], before, fresh_cache=True),
                      Case(f"{b} ps (no daemon)", [exe, "ps"], {**before, **no_daemon}, expect=(UNAVAILABLE,))]
            if daemon["reachable"]:
                cases.append(Case(f"{b} ps (daemon)", [exe, "ps"], before))
        if args.doctor:
            cases.append(Case("metralectl doctor", [m, "doctor"], mine, expect=(0, 1)))  # 1: it found problems
        load_before = os.getloadavg()
        print(f"timing {len(cases)} cases x {args.runs} rounds ...", file=sys.stderr)
        measure(cases, args.runs, tmp)
        load_after = os.getloadavg()
    by_name = {c.name: c for c in cases}
    goals = targets(by_name)
    seen = "reachable, Docker {version} at {socket}, {metralectl_containers} metralectl containers".format(**daemon) \
        if daemon["reachable"] else f"NOT reachable ({daemon['error']}): ps with a daemon not timed"
    than = (f"; metralectl@{baseline['ref']} = {baseline['commit'][:12]} (wheel {baseline['wheel_sha256'][:12]}, "
            f"venv {baseline['venv']})" if baseline else "")
    header = (f"cold start: median of {args.runs} interleaved runs; metralectl {versions['metralectl']} "
              f"{source_commit()[:12]} (wheel {digest[:12]}, venv {'reused' if ours_reused else 'new'}){than} "
              f"vs ramalama {versions['ramalama']} "
              f"(venv {'reused' if theirs_reused else 'new'}); python {platform.python_version()}; "
              f"{os.cpu_count()} CPUs, load {load_before[0]:.2f} -> {load_after[0]:.2f}; daemon {seen}")
    print_table(cases, goals, header)
    if args.json:
        result = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": args.runs,
                  "python": platform.python_version(), "cpus": os.cpu_count(),
                  "load_1m": {"before": load_before[0], "after": load_after[0]}, "versions": versions,
                  "wheel_sha256": digest, "commit": source_commit(), "baseline": baseline or None,
                  "ramalama_requirement": args.ramalama, "daemon": daemon,
                  "cases": {c.name: {"argv": [Path(a).name if a.startswith("/") else a for a in c.argv],
                                     "median_s": statistics.median(c.samples), "p90_s": pct(c.samples, 0.9),
                                     "min_s": min(c.samples), "cpu_median_s": statistics.median(c.cpu),
                                     "exit_codes": sorted(c.exit_codes),
                                     "samples_s": [round(s, 5) for s in c.samples]} for c in cases},
                  "targets": goals}
        text = json.dumps(result, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    missed = [g for g in goals if not g["ok"]]
    if missed and args.check:
        print(f"cold_start: {len(missed)} target(s) missed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
