"""The supervisor of one engine run as a host process: `python -m metralectl.seams.process.supervise`.

Docker's daemon starts a container, reaps its init and records how it ended; for a host process this small
program does, one per launch. launch.py starts it detached (a session of its own, the state directory as its
working directory) and writes the launch on its stdin as JSON: name, launch id, argv, environment, ulimits,
the log file and its bound. The supervisor then

  - applies the ulimits it may (setrlimit; one refused is said in the engine's log and skipped),
  - starts the engine with posix_spawn in a new session (so a process group) of its own: stdin /dev/null,
    stdout and stderr appended to the launch's log, the environment exactly as given,
  - records the engine's identity (pid, start tick, boot, executable) and its own in the state, and answers
    `started` (or `failed: WHY`, the engine not started) on its stdout, which it then closes,
  - waits (a pidfd), rotating the log past its bound, until the engine exits; kills what is left of the
    engine's group while the engine is still an unreaped zombie (its pid, hence its group id, cannot be
    reused meanwhile), reaps it, and records the exit: the code, or 128 + the signal, and whether the kernel's
    OOM killer did it (a SIGKILL while the OOM-kill counters of /proc/vmstat or of this cgroup rose).

Signals: SIGINT and SIGHUP are not for it (a terminal's Ctrl-C or hang-up never reach it anyway: it has no
terminal); SIGTERM means "abort this launch": the engine's group is killed (SIGKILL) and the exit recorded.
A SIGKILL of the supervisor leaves the engine running; the CLI then reads the engine's state from /proc.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any

from metralectl.ownedfs import Owned
from metralectl.seams.process import group, logs, state

REQUEST_LIMIT = 8 << 20
TICK_S = 1.0  # how often the log's size is looked at
_RLIMITS = {"core": "RLIMIT_CORE", "cpu": "RLIMIT_CPU", "data": "RLIMIT_DATA", "fsize": "RLIMIT_FSIZE",
            "locks": "RLIMIT_LOCKS", "memlock": "RLIMIT_MEMLOCK", "msgqueue": "RLIMIT_MSGQUEUE",
            "nice": "RLIMIT_NICE", "nofile": "RLIMIT_NOFILE", "nproc": "RLIMIT_NPROC", "rss": "RLIMIT_RSS",
            "rtprio": "RLIMIT_RTPRIO", "rttime": "RLIMIT_RTTIME", "sigpending": "RLIMIT_SIGPENDING",
            "stack": "RLIMIT_STACK", "as": "RLIMIT_AS"}


class Supervisor:
    def __init__(self, request: dict[str, Any]) -> None:
        self.request = request
        self.name, self.launch = str(request["name"]), str(request["launch"])
        self.states = Owned(request["states_root"], "the host-process runtime's state")
        self.logs = Owned(request["logs_root"], "the host-process runtime's logs")
        self.log = str(request["log"])
        self.engine: int | None = None
        self.aborted = False

    # -- signals ---------------------------------------------------------------------------------------------
    def install(self) -> None:
        signal.signal(signal.SIGINT, lambda *_: None)
        signal.signal(signal.SIGHUP, lambda *_: None)
        signal.signal(signal.SIGTERM, self._abort)

    def _abort(self, signum: int, frame: object) -> None:
        self.aborted = True
        if self.engine is not None:
            try:
                os.killpg(self.engine, signal.SIGKILL)  # our child, not yet reaped: its group is its own
            except (ProcessLookupError, PermissionError):
                pass

    # -- the start -------------------------------------------------------------------------------------------
    def note(self, text: str) -> None:
        """A line of ours in the engine's log (what the operator reads beside the engine's own lines)."""
        fd = logs.open_for_engine(self.log, self.logs)
        try:
            os.write(fd, f"metralectl: {text}\n".encode())
        finally:
            os.close(fd)

    def apply_ulimits(self) -> None:
        import resource

        for name, soft, hard in self.request.get("ulimits") or []:
            which = getattr(resource, _RLIMITS.get(str(name), ""), None)
            if which is None:
                self.note(f"ulimit {name}: not a limit this system knows; not applied")
                continue
            low, high = (resource.RLIM_INFINITY if int(v) < 0 else int(v) for v in (soft, hard))
            try:
                resource.setrlimit(which, (low, high))
            except (ValueError, OSError) as exc:
                self.note(f"ulimit {name}={soft}:{hard} not applied ({exc}); the engine runs with this user's limit")

    def spawn(self) -> int:
        argv = [str(a) for a in self.request["argv"]]
        env = {str(k): str(v) for k, v in (self.request.get("env") or {}).items()}
        log_fd = logs.open_for_engine(self.log, self.logs)
        try:
            actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                       (os.POSIX_SPAWN_DUP2, log_fd, 1), (os.POSIX_SPAWN_DUP2, log_fd, 2)]
            os.chdir(str(self.request.get("cwd") or "/"))
            return os.posix_spawn(argv[0], argv, env, file_actions=actions, setsid=True,
                                  setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGHUP,
                                             signal.SIGTERM))
        finally:
            os.close(log_fd)

    def start(self) -> str:
        """Start the engine and record it; the answer for the CLI."""
        self.apply_ulimits()
        baseline = oom_counters()
        if self.aborted:
            return "failed: interrupted before the engine was started"
        try:
            self.engine = self.spawn()
        except OSError as exc:
            self.note(f"could not start {self.request['argv'][0]}: {exc.strerror or exc}")
            return f"failed: {self.request['argv'][0]}: {exc.strerror or exc}"
        engine = group.identity_of(self.engine)
        recorded = state.update(self.name, self.launch, {
            "engine": engine or {"pid": self.engine}, "supervisor": group.identity_of(os.getpid()),
            "started_at": state.now_iso(), "oom_baseline": baseline}, self.states)
        if not recorded or self.aborted:
            self._abort(signal.SIGTERM, None)  # the launch was removed meanwhile (its CLI gave up on it)
            return "failed: the launch was cancelled"
        return "started " + state.engine_id({"engine": engine or {"pid": self.engine}})

    # -- the wait --------------------------------------------------------------------------------------------
    def wait(self) -> None:
        assert self.engine is not None
        pid = self.engine
        try:
            pidfd: int | None = os.pidfd_open(pid)
        except (OSError, AttributeError):
            pidfd = None
        limit = int(self.request.get("log_limit") or logs.LOG_LIMIT)
        while True:
            if pidfd is not None:
                select.select([pidfd], [], [], TICK_S)
            else:
                time.sleep(0.2)
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is not None:
                break
            try:
                logs.rotate_if_large(self.log, limit, self.logs)
            except OSError:
                pass  # the log directory went away; the engine keeps writing to its open file
        if pidfd is not None:
            os.close(pidfd)
        self.finish(pid, info.si_code, info.si_status)

    def finish(self, pid: int, si_code: int, si_status: int) -> None:
        """The engine has exited (a zombie still: its group id is ours): what is left of its group goes, then
        it is reaped and its exit recorded."""
        killed = si_code in (os.CLD_KILLED, os.CLD_DUMPED)
        record = state.read(self.name, self.states)
        engine = record.get("engine") if record else None
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + 5.0
        while isinstance(engine, dict) and group.members(engine) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.waitpid(pid, 0)
        baseline = (record or {}).get("oom_baseline") or {}
        oom = killed and si_status == signal.SIGKILL and _rose(baseline, oom_counters())
        state.update(self.name, self.launch, {"exit": {
            "code": 128 + si_status if killed else si_status, "signal": si_status if killed else None,
            "oom_killed": oom, "finished_at": state.now_iso()}}, self.states)


# -- the kernel's OOM killer --------------------------------------------------------------------------------
def oom_counters() -> dict[str, int]:
    """The OOM-kill counts the kernel keeps: machine-wide (/proc/vmstat) and this process's memory cgroup's (cgroup
    v2 memory.events, v1 memory.oom_control), which the engine shares."""
    out: dict[str, int] = {}
    try:
        memberships = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        memberships = []
    places = [("vmstat", Path("/proc/vmstat"))]
    for line in memberships:
        number, controllers, where = (line.split(":", 2) + ["", ""])[:3]
        if number == "0" and controllers == "":
            places.append(("cgroup", Path("/sys/fs/cgroup") / where.lstrip("/") / "memory.events"))
        elif "memory" in controllers.split(","):
            places.append(("cgroup-v1", Path("/sys/fs/cgroup/memory") / where.lstrip("/") / "memory.oom_control"))
    for key, path in places:
        try:
            for entry in path.read_text().splitlines():
                if entry.startswith("oom_kill "):
                    out[key] = int(entry.split()[1])
        except (OSError, ValueError):
            continue
    return out


def _rose(before: dict[str, Any], after: dict[str, int]) -> bool:
    return any(isinstance(before.get(k), int) and v > before[k] for k, v in after.items())


def main() -> int:
    raw = sys.stdin.buffer.read(REQUEST_LIMIT + 1)
    request = json.loads(raw) if len(raw) <= REQUEST_LIMIT else None
    if not isinstance(request, dict):
        print("failed: the launch request was not readable", flush=True)
        return 2
    supervisor = Supervisor(request)
    supervisor.install()
    try:
        answer = supervisor.start()
    except Exception as exc:  # noqa: BLE001 - told to the CLI waiting for the answer, which reports it
        answer = f"failed: the supervisor could not start the engine: {exc}"
        supervisor._abort(signal.SIGTERM, None)
    print(answer, flush=True)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)  # the CLI may be gone: a write to its pipe must never kill us
    if supervisor.engine is not None:
        supervisor.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
