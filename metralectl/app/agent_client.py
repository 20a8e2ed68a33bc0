"""The CLI's way to the running agent, for what only the agent can do: stop a peer's benchmark unit it runs
(`metralectl peer units --cancel KEY`; the units run inside the agent, which owns their queue).

Changes of what is served never go this way: the CLI and the dashboard do them themselves, under the
machine's lifecycle lock, which the agent's own jobs take too (app/serving.py).

The token is sent only to a listener that has proven it holds it: before its first POST the client
asks GET /api/agent?challenge=N and checks the HMAC the agent answers (seams/agent_files.agent_proof).
agent.json can be stale (the agent died, its pid was reused by another process of ours, and another
user's server took the port); that server gets a challenge, never the token.

Over the one HTTP client's loopback request (seams/httpclient.py: http.client to 127.0.0.1).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metralectl.errors import ExitCode, MetralError, NotFound

if TYPE_CHECKING:
    from metralectl.seams.httpclient import Failed

REQUEST_TIMEOUT_S = 15.0
PROOF_TIMEOUT_S = 10.0  # the agent answers its challenge at once


class AgentGone(MetralError):
    """The recorded agent's process is gone."""

    exit_code = ExitCode.UNAVAILABLE


class NotOurAgent(MetralError):
    """Something answers on the recorded port but cannot prove it holds the token: it was not sent."""

    exit_code = ExitCode.UNAVAILABLE


def running_agent(base: Path | None = None) -> AgentClient | None:
    """A client for the agent running on this box, or None: none runs (or its token cannot be read)."""
    from metralectl.seams.agent_files import load_or_create_token, read_state, token_path

    state = read_state(base)
    if state is None:
        return None
    port, pid = state.get("api_port"), state.get("pid")
    if not isinstance(port, int) or not 0 < port < 65536:
        return None
    if not token_path(base).exists():
        return None
    try:
        token = load_or_create_token(base)  # exists: only read (and its mode checked)
    except (MetralError, OSError):
        return None
    return AgentClient(port, token, pid if isinstance(pid, int) else None)


class AgentClient:
    def __init__(self, port: int, token: str, pid: int | None = None) -> None:
        self.port = port
        self.token = token
        self.pid = pid
        self.proven = False  # the listener has shown it holds the token (verify()); only then is it sent

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    # -- HTTP -----------------------------------------------------------------------------------
    def verify(self) -> None:
        """Ask the listener to prove it holds the token (an HMAC over our fresh challenge and its port)
        without sending it; NotOurAgent when it cannot."""
        import hmac
        import secrets

        from metralectl.seams.agent_files import agent_proof

        challenge = secrets.token_urlsafe(24)
        status, value = self._request("GET", f"/api/agent?challenge={challenge}", timeout=PROOF_TIMEOUT_S)
        proof = value.get("proof") if isinstance(value, dict) else None
        expected = agent_proof(self.token, self.port, challenge)
        if status != 200 or not isinstance(proof, str) or not hmac.compare_digest(proof, expected):
            raise NotOurAgent(
                f"the process answering on {self.url} (where agent/agent.json says the agent is, pid "
                f"{self.pid if self.pid is not None else '?'}) could not prove it holds this box's agent token, so "
                "the token was not sent to it",
                "if your agent runs, restart it (an older agent cannot prove itself, or the token file changed "
                "since it started: `metralectl agent stop && metralectl agent start`); otherwise start it "
                "(`metralectl agent start`)")
        self.proven = True

    def _request(self, method: str, path: str, body: Any = None, *,
                 timeout: float = REQUEST_TIMEOUT_S) -> tuple[int, Any]:
        from metralectl import __version__

        # the agent's log names who asked for a job by this (the page's requests carry the browser's)
        headers = {"Host": f"127.0.0.1:{self.port}", "Accept": "application/json", "Connection": "close",
                   "User-Agent": f"metralectl/{__version__} (pid {os.getpid()})"}
        data = None
        if method == "POST":
            if not self.proven:
                self.verify()
            headers.update({"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
            data = json.dumps(body if body is not None else {}).encode()
        from metralectl.seams.bounded import CONTROL_LIMIT
        from metralectl.seams.httpclient import Failed, loopback

        try:  # its answers are far less than the cap
            answer = loopback(self.port, method, path, headers=headers, body=data, timeout=timeout,
                              limit=CONTROL_LIMIT, what=f"the agent at {self.url}")
        except Failed as exc:
            raise self._unreachable(exc) from None
        try:
            value = json.loads(answer.body) if answer.body else None
        except (ValueError, RecursionError):
            value = None
        return answer.status, value

    def _unreachable(self, exc: Failed) -> MetralError:
        from metralectl.seams.process import pid_is_ours

        if not pid_is_ours(self.pid):  # another user's process took the pid: not our agent
            return AgentGone(f"the agent (pid {self.pid}) is gone")
        why = exc.detail or exc.kind
        return MetralError(f"the agent (pid {self.pid}, {self.url}) does not answer: {why}",
                           "check it (`metralectl agent logs`; restart it: `metralectl agent stop && metralectl agent start`)")

    def _refused(self, status: int, value: Any, what: str) -> MetralError:
        answer = value if isinstance(value, dict) else {}
        message = str(answer.get("error") or f"HTTP {status}")
        hint = answer.get("hint") if isinstance(answer.get("hint"), str) else None
        if status == 401:
            return MetralError(f"the agent refused {what}: {message}",
                               "its token file changed since it started? restart the agent")
        return MetralError(f"the agent answered {what} with HTTP {status}: {message}", hint)

    # -- what the CLI asks of the agent --------------------------------------------------------------
    def cancel_unit(self, key: str) -> dict[str, Any]:
        """Stop a peer's benchmark unit on this box (POST /api/units/KEY/cancel): the unit as it stands."""
        status, value = self._request("POST", f"/api/units/{key}/cancel", {})
        if status == 404 and isinstance(value, dict):  # no such unit there: a name given wrongly (usage)
            raise NotFound(str(value.get("error") or f"no unit {key} on this node"),
                           value.get("hint") if isinstance(value.get("hint"), str) else None)
        if status != 200 or not isinstance(value, dict):
            raise self._refused(status, value, f"cancelling unit {key}")
        return value
