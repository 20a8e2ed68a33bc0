"""The agent's files in the config dir: its API token and the record of where a running agent listens.

Read by the CLI, the dashboard and `doctor` (which must not import the agent itself), written by the agent.
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
    another user's (a recycled pid: the CLI must not send that process our token)."""
    from metralectl.seams.process import pid_is_ours
    from metralectl.seams.store import read_json

    state = read_json(state_path(base))
    if not isinstance(state, dict):
        return None
    pid = state.get("pid")
    if not isinstance(pid, int) or not pid_is_ours(pid):
        return None
    return state
