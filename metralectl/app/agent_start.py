"""`metralectl agent start`: the agent started detached (its own session, its log in a file) or through the
user's systemd when its unit is loaded there, and waited for until it answers (app/agent_control.answers).
A start that fails shows the agent's last log lines; one interrupted (Ctrl-C, SIGTERM) stops the
half-started agent, so nothing is left running.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from metralectl import paths
from metralectl.app.agent_control import AgentProc, Note, answers, find, forget
from metralectl.errors import ExitCode, MetralError
from metralectl.seams import agent_files, user_systemd

START_TIMEOUT_S = 30.0
LOG_ROTATE_BYTES = 8 << 20  # at a start, a longer log becomes agent.log.1 (one generation kept)


@dataclass(frozen=True)
class Started:
    agent: AgentProc
    already: bool  # it was running before this start
    via: str  # detached, systemd, or how the running one was started


class StartFailed(MetralError):
    """The agent did not come up: its last log lines are attached (the code is the agent's own, or 69 when it
    did not answer in time)."""

    exit_code = ExitCode.FAILED

    def __init__(self, message: str, hint: str | None, lines: Sequence[str], exit_code: ExitCode) -> None:
        super().__init__(message, hint, exit_code=exit_code)
        self.lines = list(lines)


def _start_lock(deadline: float) -> int:
    """One `agent start` at a time (a second waits, then finds the first one's agent)."""
    path = agent_files.pidfile_path().with_name("agent.start.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise MetralError("another `metralectl agent start` is still starting the agent",
                                  "wait for it, then `metralectl agent status`", exit_code=ExitCode.BUSY) from None
            time.sleep(0.1)


def start(options: Sequence[str], base: Path | None = None, *, systemd: bool = True,
          timeout_s: float = START_TIMEOUT_S, note: Note | None = None) -> Started:
    """Start the agent unless it runs; return once it answers. `options` are `metralectl agent`'s own
    (forwarded to a detached agent; the systemd unit has its own, so options mean a detached start)."""
    say = note or (lambda text: None)
    deadline = time.monotonic() + timeout_s
    lock = _start_lock(deadline)
    try:
        found = find(base)
        if found.agent is not None:
            why = answers(found.agent, base)
            if why is not None:
                raise MetralError(f"an agent already runs (pid {found.agent.pid}), but {why}",
                                  "stop it (`metralectl agent stop`), then start it again; its log: "
                                  "`metralectl agent logs`", exit_code=ExitCode.UNAVAILABLE)
            return Started(found.agent, True, found.agent.how)
        if found.stale is not None:
            agent_files.remove_pidfile(found.stale.pid)
            say(f"removed a stale pidfile: {found.stale.why}")
        loaded = systemd and user_systemd.unit_loaded()
        if loaded and not options:
            return _start_systemd(base, deadline, say)
        if systemd and (loaded or user_systemd.unit_file() is not None):
            why = "options were given" if loaded else "`systemctl --user` does not answer here (no user systemd)"
            say(f"the {user_systemd.UNIT} unit is installed, but {why}: starting the agent detached")
        return _start_detached(options, base, deadline, say)
    finally:
        os.close(lock)


def _start_systemd(base: Path | None, deadline: float, say: Note) -> Started:
    say(f"starting {user_systemd.UNIT} (systemctl --user)")
    ok, said = user_systemd.control("start", max(1.0, deadline - time.monotonic()))
    if not ok:
        raise StartFailed(f"systemctl --user start {user_systemd.UNIT} failed: {said}",
                          f"journalctl --user -u {user_systemd.UNIT}", user_systemd.journal_tail(20),
                          ExitCode.FAILED)
    next_look = time.monotonic() + 1.0
    while True:
        agent = _ready(base)
        if agent is not None:
            return Started(agent, False, "systemd")
        if time.monotonic() >= next_look:  # systemd's own view, once a second (each look is a systemctl run)
            next_look = time.monotonic() + 1.0
            if user_systemd.state() in ("failed", "inactive"):
                raise StartFailed(f"{user_systemd.UNIT} stopped while starting",
                                  f"journalctl --user -u {user_systemd.UNIT}", user_systemd.journal_tail(20),
                                  ExitCode.FAILED)
        if time.monotonic() > deadline:
            raise StartFailed(f"{user_systemd.UNIT} started, but the agent did not answer in time",
                              f"journalctl --user -u {user_systemd.UNIT}", user_systemd.journal_tail(20),
                              ExitCode.UNAVAILABLE)
        time.sleep(0.1)


def _ready(base: Path | None) -> AgentProc | None:
    agent = find(base).agent
    if agent is not None and agent.api_port is not None and answers(agent, base) is None:
        return agent
    return None


def _open_log() -> tuple[int, Path]:
    path = agent_files.log_path()
    try:
        if path.stat().st_size > LOG_ROTATE_BYTES:
            os.replace(path, path.with_name(path.name + ".1"))
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    return fd, path


def child_environment(log: Path) -> dict[str, str]:
    env = {**os.environ, agent_files.HOW_ENV: "detached", agent_files.LOG_ENV: str(log), "PYTHONUNBUFFERED": "1"}
    # The agent runs from `/` (it must not pin the directory it was started in): a checkout run as
    # `python -m metralectl` from its own directory must stay importable from there.
    root = str(Path(__file__).resolve().parents[2])
    if not root.endswith(("site-packages", "dist-packages")):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return env


def _start_detached(options: Sequence[str], base: Path | None, deadline: float, say: Note) -> Started:
    fd, log = _open_log()
    proc: subprocess.Popen[bytes] | None = None
    # Ctrl-C or SIGTERM held back until the child is known, so an interrupted start always stops its child.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        os.write(fd, f"--- {stamp} metralectl agent start {' '.join(options)}\n".encode())
        offset = os.fstat(fd).st_size
        try:
            proc = subprocess.Popen([sys.executable, "-m", "metralectl", "agent", *options], stdin=subprocess.DEVNULL,
                                    stdout=fd, stderr=fd, cwd="/", env=child_environment(log),
                                    start_new_session=True, close_fds=True,
                                    preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, held))
        finally:
            os.close(fd)
        say(f"starting the agent (pid {proc.pid}, log {paths.display(log)})")
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        while True:
            agent = _ready(base)
            if agent is not None:
                return Started(agent, False, "detached")
            code = proc.poll()
            if code is not None:
                agent_files.remove_pidfile(proc.pid)
                raise StartFailed(f"the agent exited {code} while starting", "its whole log: `metralectl agent logs`",
                                  _lines_since(log, offset), ExitCode.of(code) if code > 0 else ExitCode.FAILED)
            if time.monotonic() > deadline:
                _abandon(proc, base)
                raise StartFailed("the agent did not answer in time (it was stopped again)",
                                  "its whole log: `metralectl agent logs`; a slower machine: --timeout SECONDS",
                                  _lines_since(log, offset), ExitCode.UNAVAILABLE)
            time.sleep(0.1)
    except KeyboardInterrupt:
        if proc is not None:
            _abandon(proc, base)
            say(f"stopped the agent being started (pid {proc.pid}): nothing is left running")
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _abandon(proc: subprocess.Popen[bytes], base: Path | None) -> None:
    """Stop a child that is not (yet) a working agent, and its records."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    forget(proc.pid, base)


def _lines_since(log: Path, offset: int, count: int = 20) -> list[str]:
    try:
        with open(log, "rb") as handle:
            handle.seek(max(offset, os.fstat(handle.fileno()).st_size - (256 << 10)))
            tail = handle.read(256 << 10)
    except OSError:
        return []
    return tail.decode("utf-8", errors="replace").splitlines()[-count:]
