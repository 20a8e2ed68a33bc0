"""The agent as a process: find it, ask it, stop it (app/agent_start.py starts it).

`metralectl agent stop | status` (cli/agent_life.py renders them). The agent records itself in
its pidfile (seams/agent_files: pid, start tick, boot, executable, how it was started, its log) and in
agent.json (where it listens); a record whose pid now belongs to another process is stale, and that
process is never signalled. "Answers" means the listener proved it holds this box's token
(GET /api/agent?challenge=N, as the CLI asks before it sends the token), not merely that a port is open.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metralectl.errors import ExitCode, MetralError
from metralectl.seams import agent_files, user_systemd
from metralectl.seams.process import command_name, pid_alive, same_process, wait_gone

PROBE_TIMEOUT_S = 3.0
STOP_TIMEOUT_S = 75.0  # the agent waits up to 60 s for a running job's cleanup before it exits
KILL_WAIT_S = 5.0
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
    from metralectl.seams.bounded import PEEK_LIMIT
    from metralectl.seams.httpclient import Failed, loopback

    challenge = secrets.token_urlsafe(24)
    try:
        reply = loopback(agent.api_port, "GET", f"/api/agent?challenge={challenge}",
                         headers={"Host": f"127.0.0.1:{agent.api_port}", "Connection": "close"},
                         timeout=timeout_s, limit=PEEK_LIMIT, what=None)  # a proof is a few bytes: the rest unread
    except Failed as exc:
        return f"nothing answers on {agent.url} ({exc.named})"
    try:
        proof = json.loads(reply.body).get("proof") if reply.status == 200 else None
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


def forget(pid: int, base: Path | None) -> None:
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
            forget(agent.pid, base)
            return Stopped(agent, "systemctl", time.monotonic() - began, found.stale)
        if note is not None:
            note(f"systemctl --user stop {user_systemd.UNIT} did not stop it ({said or 'no answer'}); signalling it")
    how = terminate(agent, timeout_s)
    forget(agent.pid, base)
    return Stopped(agent, how, time.monotonic() - began, found.stale)
