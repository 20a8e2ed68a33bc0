"""The supervisor of one engine run as a host process: `python -m metralectl.seams.process.supervise NAME`.

Docker's daemon starts a container, reaps its init and records how it ended; for a host process this small
program does, one per launch. launch.py starts it detached (a session of its own, the state directory as its
working directory; NAME on its command line only so that `ps ax` tells which launch it serves) and writes the
launch on its stdin as JSON: name, launch id, argv, environment, ulimits, the log file and its bound. The
supervisor then

  - applies the ulimits it may (setrlimit; one refused is said in the engine's log and skipped),
  - makes the pipe the engine's output goes to and forks the launch's log writer, which reads it into the log
    (logwriter.py: why a pipe, and why a process of its own),
  - starts the engine with posix_spawn in a new session (so a process group) of its own: stdin /dev/null,
    stdout and stderr the pipe, SIGPIPE left ignored, the environment exactly as given,
  - records the identities (pid, start tick, boot, executable) of the engine, of itself and of the log writer in
    the state, and answers `started` (or `failed: WHY`, the engine not started) on its stdout, which it then closes,
  - waits (pidfds) until the engine exits, starting a new log writer if one is killed meanwhile; kills what is
    left of the engine's group while the engine is still an unreaped zombie (its pid, hence its group id, cannot
    be reused meanwhile), reaps it, lets the writer write the pipe's last lines, and records the exit: the code,
    or 128 + the signal, and whether the kernel's OOM killer did it (a SIGKILL while the OOM-kill counters of
    /proc/vmstat or of this cgroup rose). A recorded exit thus comes after the engine's last line is in the log.

Signals: SIGINT and SIGHUP are not for it (a terminal's Ctrl-C or hang-up never reach it anyway: it has no
terminal); SIGTERM means "abort this launch": the engine's group is killed (SIGKILL) and the exit recorded.
A SIGKILL of the supervisor leaves the engine running, and its log written; the CLI then reads the engine's state
from /proc.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any

from metralectl.ownedfs import Owned
from metralectl.seams.process import group, logs, logwriter, state

REQUEST_LIMIT = 8 << 20
TICK_S = 1.0  # how often the engine and the log writer are looked at without a pidfd to wake us
LOG_DRAIN_S = 5.0  # after the engine's group is gone: the writer's last lines (longer only if an escaped process
#                   still holds the pipe; the writer then goes on logging it, and the exit is recorded meanwhile)
PIPE_SIZE = 1 << 20  # the engine's output held while no writer reads it (the system's pipe-max-size allowing)
WRITERS = 8  # log writers a launch may start: one that keeps failing is not started again and again
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
        self.pipe: int | None = None  # the read end of the engine's output, held (never read) to replace a writer
        self.pipe_in: int | None = None  # its write end, until the engine has it
        self.writer: int | None = None  # the log writer's pid (our child) and a pidfd of it
        self.writer_fd: int | None = None
        self.owed: str | None = None  # a killed writer not replaced yet: why
        self.owed_said = False
        self.writers = 0

    # -- signals ---------------------------------------------------------------------------------------------
    def install(self) -> None:
        signal.signal(signal.SIGINT, lambda *_: None)
        signal.signal(signal.SIGHUP, lambda *_: None)
        signal.signal(signal.SIGTERM, self._abort)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # so too for the engine, which inherits it through exec

    def _abort(self, signum: int, frame: object) -> None:
        self.aborted = True
        if self.engine is not None:
            try:
                os.killpg(self.engine, signal.SIGKILL)  # our child, not yet reaped: its group is its own
            except (ProcessLookupError, PermissionError):
                pass

    # -- the start -------------------------------------------------------------------------------------------
    def note(self, text: str) -> None:
        """A line of ours in the engine's log (what the operator reads beside the engine's own lines). Only while no
        log writer runs: before the first, or with none left."""
        fd = logs.append_fd(self.log, self.logs)
        try:
            size = os.fstat(fd).st_size
            cut = size > 0 and os.pread(fd, 1, size - 1) != b"\n"  # on a line of its own, even after a cut one
            os.write(fd, f"{chr(10) if cut else ''}metralectl: {text}\n".encode())
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

    # -- the log writer ----------------------------------------------------------------------------------------
    def open_pipe(self) -> None:
        self.pipe, self.pipe_in = os.pipe2(os.O_CLOEXEC)
        try:
            fcntl.fcntl(self.pipe_in, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
        except OSError:
            pass  # the system's default (64 KiB) then

    def start_writer(self, first: str | None = None) -> int:
        """Fork the log writer (its pid): it moves the pipe into the log until no one writes to the pipe any more;
        `first`, a line of ours it writes before (the log's one writer: never beside it, whose next write would land
        on it)."""
        assert self.pipe is not None
        limit = int(self.request.get("log_limit") or logs.LOG_LIMIT)
        self.writers += 1
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # our SIGTERM handler is not the writer's
        pid = os.fork()
        if pid == 0:  # the writer: no handler of ours, no descriptor but the pipe's read end and the log
            code = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
                for sig in (signal.SIGINT, signal.SIGHUP):
                    signal.signal(sig, signal.SIG_IGN)
                devnull = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(devnull, fd)  # not the pipes to the CLI that started the supervisor
                if self.pipe_in is not None:
                    os.close(self.pipe_in)
                logwriter.run(self.pipe, self.log, limit, self.logs,
                              first.replace("{pid}", str(os.getpid())) if first else None)
                code = 0
            finally:
                os._exit(code)
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        self.writer = pid
        try:
            self.writer_fd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            self.writer_fd = None
        return pid

    def _writer_ended(self) -> int | None:
        """The writer's wait status once it has ended (it is then reaped and forgotten); None while it runs."""
        if self.writer is None:
            return None
        pid, status = os.waitpid(self.writer, os.WNOHANG)
        if pid == 0:
            return None
        if self.writer_fd is not None:
            os.close(self.writer_fd)
        self.writer, self.writer_fd = None, None
        return status

    def mind_writer(self) -> None:
        """A writer that was killed while the engine runs is replaced: nothing was lost meanwhile (we hold the pipe,
        so the engine's writes waited in it). One that ended by itself read the pipe's end: nothing to replace."""
        old = self.writer
        status = self._writer_ended()
        if status is not None and (os.WIFSIGNALED(status) or os.WEXITSTATUS(status) != 0):
            how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
            self.owed = f"the log writer (pid {old}) ended ({how})"
        if self.owed is None or self.writer is not None or self.pipe is None:
            return
        if self.writers >= WRITERS:  # no reader left at all: the engine's writes fail rather than wait forever
            self.note(f"{self.owed}, the {WRITERS}th to end: no other is started, and the engine's output from here "
                      "on is lost (the engine runs on)")
            os.close(self.pipe)
            self.pipe, self.owed = None, None
            return
        try:
            pid = self.start_writer(self.owed + "; pid {pid} carries on: nothing was lost")
        except OSError as exc:
            if not self.owed_said:  # said once (no writer runs: this line is the log's only writer); tried again
                self.owed_said = True
                self.note(f"{self.owed} and another could not be started ({exc}): the engine's output waits in its "
                          "pipe, and the engine with it once the pipe is full")
            return
        self.owed, self.owed_said = None, False
        state.update(self.name, self.launch, {"logger": group.identity_of(pid)}, self.states)

    def drain_log(self) -> None:
        """Once nothing of the engine's group is left: the writer reads the pipe to its end and ends (briefly waited
        for; one killed meanwhile is replaced, the pipe may still hold lines)."""
        deadline = time.monotonic() + LOG_DRAIN_S
        while self.writer is not None and time.monotonic() < deadline:
            if self.writer_fd is not None:
                select.select([self.writer_fd], [], [], max(0.0, deadline - time.monotonic()))
            else:
                time.sleep(0.05)
            self.mind_writer()
        if self.pipe is not None:
            os.close(self.pipe)
            self.pipe = None

    # -- the engine --------------------------------------------------------------------------------------------
    def spawn(self) -> int:
        argv = [str(a) for a in self.request["argv"]]
        env = {str(k): str(v) for k, v in (self.request.get("env") or {}).items()}
        self.open_pipe()
        assert self.pipe_in is not None
        try:
            self.start_writer()  # before the engine: its first line has a reader
            actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                       (os.POSIX_SPAWN_DUP2, self.pipe_in, 1), (os.POSIX_SPAWN_DUP2, self.pipe_in, 2)]
            os.chdir(str(self.request.get("cwd") or "/"))
            # SIGPIPE stays ignored (install): with no reader of its output left, the engine's writes fail, it runs on.
            return os.posix_spawn(argv[0], argv, env, file_actions=actions, setsid=True,
                                  setsigdef=(signal.SIGXFSZ, signal.SIGINT, signal.SIGHUP, signal.SIGTERM))
        finally:
            os.close(self.pipe_in)  # the engine's group is then all that writes to it: its end is the writer's EOF
            self.pipe_in = None

    def start(self) -> str:
        """Start the engine and record it; the answer for the CLI."""
        self.apply_ulimits()
        baseline = oom_counters()
        if self.aborted:
            return "failed: interrupted before the engine was started"
        try:
            self.engine = self.spawn()
        except OSError as exc:
            self.drain_log()
            self.note(f"could not start {self.request['argv'][0]}: {exc.strerror or exc}")
            return f"failed: {self.request['argv'][0]}: {exc.strerror or exc}"
        engine = group.identity_of(self.engine)
        recorded = state.update(self.name, self.launch, {
            "engine": engine or {"pid": self.engine}, "supervisor": group.identity_of(os.getpid()),
            "logger": group.identity_of(self.writer) if self.writer is not None else None,
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
        while True:
            if pidfd is not None:
                select.select([fd for fd in (pidfd, self.writer_fd) if fd is not None], [], [], TICK_S)
            else:
                time.sleep(0.2)
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is not None:
                break
            self.mind_writer()
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
        self.drain_log()
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
