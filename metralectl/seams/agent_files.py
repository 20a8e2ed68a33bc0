"""The agent's files: its API token and the record of where a running agent listens (config dir), its
lock (config dir: one agent per identity), its pidfile and its log (state and logs dirs of METRALE_HOME).

Read by the CLI, the dashboard and `doctor` (which must not import the agent itself), written by the agent.

A record names a process by its identity (seams/hostproc.identity: pid, start tick, boot, executable), so a
pid that a recycled process now holds is never taken for the agent, and never signalled for it.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Any

from metralectl import paths
from metralectl.errors import ExitCode, MetralError

DEFAULT_API_PORT = 8897
HOW_ENV = "METRALECTL_AGENT_HOW"  # set by `agent start` on the agent it starts: "detached"
LOG_ENV = "METRALECTL_AGENT_LOG"  # ... and the file its stderr goes to
PROOF_DOMAIN = "metralectl-agent-proof/1"
CHALLENGE = re.compile(r"[A-Za-z0-9_-]{16,64}")
TOKEN = re.compile(r"[A-Za-z0-9_-]{32,256}")  # what secrets.token_urlsafe makes


def agent_dir(base: Path | None = None) -> Path:
    return (base if base is not None else paths.config_dir()) / "agent"


def token_path(base: Path | None = None) -> Path:
    return agent_dir(base) / "token"


def load_or_create_token(base: Path | None = None) -> str:
    """The API token (43 url-safe characters), created 0600 on first use; a looser file is refused."""
    from metralectl.seams.identity import create_exclusive

    path = token_path(base)
    if not os.path.lexists(path):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        create_exclusive(path, (secrets.token_urlsafe(32) + "\n").encode(), 0o600)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        where = paths.display(path)
        if exc.errno == errno.ELOOP:
            raise MetralError(f"refusing the agent token {where}: it is a symbolic link (it must be this user's own "
                              "file, mode 0600)", f"remove the link (`rm {where}`): a new token is made") from None
        raise MetralError(f"cannot read the agent token {where}: {exc.strerror}",
                          f"check {paths.display(path.parent)} (mode 0700, this user's), or remove the token file: "
                          "a new one is made") from None
    try:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        where = paths.display(path)
        if not stat.S_ISREG(st.st_mode):
            raise MetralError(f"refusing the agent token {where}: it is not a regular file",
                              f"remove it (`rm {where}`): a new token is made")
        if st.st_uid != os.geteuid():
            raise MetralError(f"refusing the agent token {where}: it belongs to uid {st.st_uid}, not to this user "
                              f"(uid {os.geteuid()})", f"remove it (`rm {where}`): a new token is made")
        if mode & 0o077:
            raise MetralError(f"refusing the agent token {where}: mode {mode:04o} lets other users read it",
                              f"chmod 600 {where} (or delete it: a new token is made)")
        token = os.read(fd, 256).decode("ascii", errors="replace").strip()
    finally:
        os.close(fd)
    if len(token) < 32:
        raise MetralError(f"the agent token in {paths.display(path)} is too short", "delete it: a new token is made")
    if not TOKEN.fullmatch(token):  # it goes into an Authorization header: a CR/LF there would add headers
        raise MetralError(f"the agent token in {paths.display(path)} holds characters a token never has (only "
                          "letters, digits, - and _)", "delete it: a new token is made", exit_code=ExitCode.DATA)
    return token


def agent_proof(token: str, port: int, challenge: str) -> str:
    """What the agent answers to GET /api/agent?challenge=N: an HMAC keyed by the token over the challenge
    and the port it answers on. The CLI checks it before it sends the token, so a process listening on a
    stale agent.json's port learns nothing (and a relay to the real agent on another port fails: the port
    is in the proof)."""
    message = f"{PROOF_DOMAIN}\n{port}\n{challenge}".encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def state_path(base: Path | None = None) -> Path:
    return agent_dir(base) / "agent.json"


def read_state(base: Path | None = None) -> dict[str, Any] | None:
    """Where a running agent listens, or None when none is recorded, or its process is gone or is now
    another process (a recycled pid: the CLI must not send that process our token). A record without the
    process's identity (an older agent's) is judged by its pid alone."""
    from metralectl.seams.hostproc import pid_is_ours, same_process
    from metralectl.seams.store import read_json

    state = read_json(state_path(base))
    if not isinstance(state, dict):
        return None
    pid = state.get("pid")
    if not isinstance(pid, int) or not pid_is_ours(pid):
        return None
    if "start_ticks" in state and not same_process(state):
        return None
    return state


# -- the lock, the pidfile, the log ---------------------------------------------------------------
def lock_path(base: Path | None = None) -> Path:
    return agent_dir(base) / "agent.lock"


def pidfile_path() -> Path:
    from metralectl.seams.store import state_dir

    return state_dir() / "agent.pid"


def log_path() -> Path:
    from metralectl.seams.store import logs_dir

    return logs_dir() / "agent.log"


class AgentRunning(MetralError):
    """Another agent holds this config dir's agent lock: a second one is refused, naming the first."""

    exit_code = ExitCode.BUSY


def take_lock(base: Path | None = None) -> int:
    """The agent lock of this config dir, held until the returned descriptor is closed (or the process
    ends, however it ends; the descriptor is not inherited across exec). AgentRunning when another
    process holds it."""
    import fcntl

    path = lock_path(base)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AgentRunning(f"an agent already runs for this configuration ({describe_holder(base)})",
                           "stop it first (`metralectl agent stop`), or ask it: `metralectl agent status`") from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def describe_holder(base: Path | None = None) -> str:
    """"pid N, http://127.0.0.1:PORT/" for the agent that holds the lock, as far as its records say."""
    state = read_state(base)
    if state is not None and isinstance(state.get("api_port"), int):
        return f"pid {state['pid']}, http://127.0.0.1:{state['api_port']}/"
    record = read_pidfile()
    if record is not None:
        from metralectl.seams.hostproc import same_process

        if same_process(record):
            return f"pid {record['pid']}, still starting"
    try:
        pid = int(lock_path(base).read_text().split()[0])
        return f"pid {pid}"
    except (OSError, ValueError, IndexError):
        return "its pid unknown"


def write_pidfile(how: str, log: str | None, base: Path | None = None) -> dict[str, Any]:
    """This process as the running agent: its identity, how it was started, where it logs (mode 0600)."""
    import time

    from metralectl.seams.hostproc import identity
    from metralectl.seams.store import write_json

    record: dict[str, Any] = dict(identity(os.getpid()) or {"pid": os.getpid()})
    record.update(how=how, log=log, started=time.time(), config_dir=str(agent_dir(base).parent))
    write_json(pidfile_path(), record, mode=0o600)
    return record


def read_pidfile() -> dict[str, Any] | None:
    """The pidfile as written (None when there is none or it is not a record); whether its process still
    runs is the caller's question (seams/hostproc.same_process)."""
    from metralectl.seams.store import read_json

    record = read_json(pidfile_path())
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
        return None
    return record


def remove_pidfile(pid: int) -> bool:
    """Remove the pidfile if it names `pid` (never another agent's); whether it did."""
    record = read_pidfile()
    if record is None or record.get("pid") != pid:
        return False
    pidfile_path().unlink(missing_ok=True)
    return True
