"""The agent as a process: find it, ask it, start it detached (or through the user's systemd), stop it.

`metralectl agent start | stop | status` (cli/agent_life.py renders them). The agent records itself in
its pidfile (seams/agent_files: pid, start tick, boot, executable, how it was started, its log) and in
agent.json (where it listens); a record whose pid now belongs to another process is stale, and that
process is never signalled. "Answers" means the listener proved it holds this box's token
(GET /api/agent?challenge=N, as the CLI asks before it sends the token), not merely that a port is open.
"""

from __future__ import annotations

import fcntl
import hmac
import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metralectl import paths
from metralectl.errors import ExitCode, MetralError
from metralectl.seams import agent_files, user_systemd
from metralectl.seams.process import command_name, pid_alive, same_process, wait_gone

PROBE_TIMEOUT_S = 3.0
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 75.0  # the agent waits up to 60 s for a running job's cleanup before it exits
KILL_WAIT_S = 5.0
LOG_ROTATE_BYTES = 8 << 20  # at a start, a longer log becomes agent.log.1 (one generation kept)
Note = Callable[[str], None]


@dataclass(frozen=True)
class AgentProc:
    """A running agent, as its records name it (checked: its pid is still that process)."""

    pid: int
    how: str  # detached (`agent start`), systemd, foreground (a terminal), embedded, or unknown (older records)
    record: dict[str, Any] = field(repr=False)  # the identity seams/process.same_process checks
    api_port: int | None = None
    peer_port: int | None = None
    peer_host: str | None = None
    started: float | None = None
    log: str | None = None

    @property
    def url(self) -> str | None:
        return f"http://127.0.0.1:{self.api_port}/" if self.api_port else None

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "how": self.how, "url": self.url, "api_port": self.api_port,
                "peer_port": self.peer_port, "peer_host": self.peer_host, "started": self.started, "log": self.log}


@dataclass(frozen=True)
class Stale:
    """A pidfile whose process is gone, or whose pid now belongs to another process."""

    pid: int
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "why": self.why, "pidfile": str(agent_files.pidfile_path())}


@dataclass(frozen=True)
class Found:
    agent: AgentProc | None
    stale: Stale | None


def _stale(pid: int) -> Stale:
    if not pid_alive(pid):
        return Stale(pid, f"pid {pid} is gone (the agent ended without removing its pidfile: killed, or the "
                          "machine restarted)")
    name = command_name(pid)
    what = f"another process ({name})" if name else "another user's process"
    return Stale(pid, f"pid {pid} is now {what}, not the agent")


def find(base: Path | None = None) -> Found:
    """The running agent of this configuration (pidfile first, then agent.json), and a stale pidfile if any."""
    record = agent_files.read_pidfile()
    config = str(agent_files.agent_dir(base).parent)
    if record is not None and record.get("config_dir") not in (None, config):
        record = None  # another configuration's agent (METRALECTL_CONFIG_DIR differs): not ours to judge
    state = agent_files.read_state(base)
    stale = None
    if record is not None:
        pid = int(record["pid"])
        if same_process(record):
            here = state if state is not None and state.get("pid") == pid else {}
            return Found(AgentProc(pid, str(record.get("how") or "unknown"), record, _port(here.get("api_port")),
                                   _port(here.get("peer_port")), here.get("peer_host"), _number(record.get("started")),
                                   record.get("log") if isinstance(record.get("log"), str) else None), None)
        stale = _stale(pid)
    if state is not None:
        pid = int(state["pid"])
        identity = state if "start_ticks" in state else {"pid": pid}
        return Found(AgentProc(pid, str(state.get("how") or "unknown"), identity, _port(state.get("api_port")),
                               _port(state.get("peer_port")), state.get("peer_host"), _number(state.get("started")),
                               state.get("log") if isinstance(state.get("log"), str) else None), stale)
    return Found(None, stale)


def _port(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536 else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def answers(agent: AgentProc, base: Path | None = None, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the agent's listener proves it holds this box's token; else why not, in words."""
    if agent.api_port is None:
        return "it has not recorded where it listens yet"
    try:
        token = agent_files.load_or_create_token(base) if agent_files.token_path(base).exists() else None
    except MetralError as exc:
        return exc.message
    if token is None:
        return "there is no agent token to check it with"
    challenge = secrets.token_urlsafe(24)
    conn = http.client.HTTPConnection("127.0.0.1", agent.api_port, timeout=timeout_s)
    try:
        conn.request("GET", f"/api/agent?challenge={challenge}",
                     headers={"Host": f"127.0.0.1:{agent.api_port}", "Connection": "close"})
        reply = conn.getresponse()
        body = reply.read(64 << 10)
    except (OSError, http.client.HTTPException) as exc:
        return f"nothing answers on {agent.url} ({type(exc).__name__}{': ' + str(exc) if str(exc) else ''})"
    finally:
        conn.close()
    try:
        proof = json.loads(body).get("proof") if reply.status == 200 else None
    except (ValueError, AttributeError, RecursionError):
        proof = None
    expected = agent_files.agent_proof(token, agent.api_port, challenge)
    if not isinstance(proof, str) or not hmac.compare_digest(proof, expected):
        return f"the listener on {agent.url} cannot prove it holds this box's agent token"
    return None


# -- status ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Status:
    state: str  # running, not-answering, not-running
    agent: AgentProc | None
    stale: Stale | None
    why: str | None = None  # not-answering: why not

    @property
    def exit_code(self) -> ExitCode:
        """0 running, 1 not running (a stale pidfile included), 69 running but not answering."""
        return {"running": ExitCode.OK, "not-answering": ExitCode.UNAVAILABLE}.get(self.state, ExitCode.FAILED)

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "agent": self.agent.to_json() if self.agent else None,
                "stale_pidfile": self.stale.to_json() if self.stale else None, "why": self.why,
                "log": self.agent.log if self.agent and self.agent.log else str(agent_files.log_path())}


def status(base: Path | None = None) -> Status:
    found = find(base)
    if found.agent is None:
        return Status("not-running", None, found.stale)
    why = answers(found.agent, base)
    return Status("running" if why is None else "not-answering", found.agent, found.stale, why)


# -- stop -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stopped:
    agent: AgentProc | None  # None: nothing was running
    how: str  # SIGTERM, SIGKILL, systemctl, or "" when nothing ran
    seconds: float = 0.0
    stale: Stale | None = None  # a stale pidfile that was removed (its process left alone)


def _forget(pid: int, base: Path | None) -> None:
    """The records of a process that is gone (it could not remove them itself: killed)."""
    agent_files.remove_pidfile(pid)
    state = agent_files.state_path(base)
    try:
        recorded = json.loads(state.read_text()).get("pid") if state.is_file() else None
    except (OSError, ValueError, AttributeError):
        recorded = None
    if recorded == pid:
        state.unlink(missing_ok=True)


def _signal(agent: AgentProc, sig: signal.Signals) -> bool:
    """Send sig only to the process the record names (checked just before); whether it was sent."""
    if not same_process(agent.record):
        return False
    try:
        os.kill(agent.pid, sig)
    except ProcessLookupError:
        return False
    return True


def terminate(agent: AgentProc, timeout_s: float) -> str:
    """SIGTERM, wait, then SIGKILL; which one ended it. MetralError when even SIGKILL did not."""
    if not _signal(agent, signal.SIGTERM) or wait_gone(agent.pid, timeout_s, agent.record):
        return "SIGTERM"
    _signal(agent, signal.SIGKILL)
    if wait_gone(agent.pid, KILL_WAIT_S, agent.record):
        return "SIGKILL"
    raise MetralError(f"the agent (pid {agent.pid}) is still there {KILL_WAIT_S:g} s after SIGKILL",
                      f"check it with `ps -o pid,stat,cmd -p {agent.pid}` (a process stuck in the kernel, state D)")


def stop(base: Path | None = None, timeout_s: float = STOP_TIMEOUT_S, note: Note | None = None) -> Stopped:
    found = find(base)
    if found.stale is not None:
        agent_files.remove_pidfile(found.stale.pid)  # only the file: its pid is another process now
    agent = found.agent
    if agent is None:
        return Stopped(None, "", stale=found.stale)
    began = time.monotonic()
    if agent.how == "systemd" and user_systemd.unit_loaded():
        ok, said = user_systemd.control("stop", timeout_s)
        if ok and wait_gone(agent.pid, KILL_WAIT_S, agent.record):
            _forget(agent.pid, base)
            return Stopped(agent, "systemctl", time.monotonic() - began, found.stale)
        if note is not None:
            note(f"systemctl --user stop {user_systemd.UNIT} did not stop it ({said or 'no answer'}); signalling it")
    how = terminate(agent, timeout_s)
    _forget(agent.pid, base)
    return Stopped(agent, how, time.monotonic() - began, found.stale)


# -- start ----------------------------------------------------------------------------------------
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
    while True:
        agent = _ready(base)
        if agent is not None:
            return Started(agent, False, "systemd")
        if user_systemd.state() in ("failed", "inactive"):
            raise StartFailed(f"{user_systemd.UNIT} stopped while starting", f"journalctl --user -u {user_systemd.UNIT}",
                              user_systemd.journal_tail(20), ExitCode.FAILED)
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
    _forget(proc.pid, base)


def _lines_since(log: Path, offset: int, count: int = 20) -> list[str]:
    try:
        with open(log, "rb") as handle:
            handle.seek(max(offset, os.fstat(handle.fileno()).st_size - (256 << 10)))
            tail = handle.read(256 << 10)
    except OSError:
        return []
    return tail.decode("utf-8", errors="replace").splitlines()[-count:]
