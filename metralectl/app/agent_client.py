"""The CLI's and the dashboard's way to the running agent: start a job, follow its events, cancel it.

The agent owns launch/swap/stop on the box while it runs (one writer); `metralectl run/swap/stop` and
the dashboard hand their change to it as a job and render the job's events as if they had run it
themselves. With no agent recorded, with METRALECTL_DIRECT=1 (or `--direct`), or without a readable
token, they work directly (as before the agent existed).

The token is sent only to a listener that has proven it holds it: before its first POST the client
asks GET /api/agent?challenge=N and checks the HMAC the agent answers (seams/agent_files.agent_proof).
agent.json can be stale (the agent died, its pid was reused by another process of ours, and another
user's server took the port); that server gets a challenge, never the token.

Over the one HTTP client's loopback request (seams/httpclient.py: http.client to 127.0.0.1): the routed path
imports neither docker nor httpx.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from metralectl.errors import ExitCode, MetralError, NotFound
from metralectl.wording import count, noun

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from metralectl.seams.httpclient import Failed

DIRECT_ENV = "METRALECTL_DIRECT"
ACTIVE_STATES = ("starting", "running")
FOLLOW_WAIT_S = 20.0  # one long-poll; Ctrl-C interrupts it at once (the signal ends the read)
REQUEST_TIMEOUT_S = 15.0
ResultT = TypeVar("ResultT", bound="DataclassInstance")  # a lifecycle result, rebuilt from the agent's JSON
START_TIMEOUT_S = 10.0  # the agent answers a start at once (the lock is taken without waiting)


class AgentGone(MetralError):
    """The recorded agent's process is gone: work directly."""

    exit_code = ExitCode.UNAVAILABLE


class NotOurAgent(MetralError):
    """Something answers on the recorded port but cannot prove it holds the token: it was not sent."""

    exit_code = ExitCode.UNAVAILABLE


def direct_forced() -> bool:
    return os.environ.get(DIRECT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def running_agent(base: Path | None = None) -> AgentClient | None:
    """A client for the agent running on this box, or None: work directly."""
    if direct_forced():
        return None
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

    def describe(self) -> str:
        return f"via the agent (pid {self.pid if self.pid is not None else '?'}, {self.url})"

    # -- HTTP -----------------------------------------------------------------------------------
    def verify(self) -> None:
        """Ask the listener to prove it holds the token (an HMAC over our fresh challenge and its port)
        without sending it; NotOurAgent when it cannot."""
        import hmac
        import secrets

        from metralectl.seams.agent_files import agent_proof

        challenge = secrets.token_urlsafe(24)
        status, value = self._request("GET", f"/api/agent?challenge={challenge}", timeout=START_TIMEOUT_S)
        proof = value.get("proof") if isinstance(value, dict) else None
        expected = agent_proof(self.token, self.port, challenge)
        if status != 200 or not isinstance(proof, str) or not hmac.compare_digest(proof, expected):
            raise NotOurAgent(
                f"the process answering on {self.url} (where agent/agent.json says the agent is, pid "
                f"{self.pid if self.pid is not None else '?'}) could not prove it holds this box's agent token, so "
                "the token was not sent to it",
                "if your agent runs, restart it (an older agent cannot prove itself, or the token file changed "
                "since it started: `metralectl agent stop && metralectl agent start`); otherwise start it (`metralectl agent "
                f"start`) or work without it: --direct "
                f"(or {DIRECT_ENV}=1)")
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

        try:  # a job's events: far less than the cap
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
                           "check it (`metralectl agent logs`; restart it: `metralectl agent stop && metralectl agent start`), "
                           "or work without it: add --direct "
                           f"(or set {DIRECT_ENV}=1)")

    def _refused(self, status: int, value: Any, what: str) -> MetralError:
        from metralectl.seams.store import Busy

        answer = value if isinstance(value, dict) else {}
        message = str(answer.get("error") or f"HTTP {status}")
        hint = answer.get("hint") if isinstance(answer.get("hint"), str) else None
        if status == 409:
            return Busy(message, hint)
        if status == 400:
            problems = [p for p in answer.get("problems") or [] if isinstance(p, str)]
            if problems:
                message = "\n".join([*problems, f"metralectl: refused: {message}"])
            return MetralError(message, hint, exit_code=_failure_code(answer.get("exit_code")))
        if status == 401:
            return MetralError(f"the agent refused {what}: {message}",
                               "its token file changed since it started? restart the agent, or add --direct")
        return MetralError(f"the agent answered {what} with HTTP {status}: {message}", hint)

    # -- the job API ----------------------------------------------------------------------------
    def start(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST /api/KIND: the started job; store.Busy when the lock is held; AgentGone when the agent is gone."""
        status, value = self._request("POST", f"/api/{kind}", body, timeout=START_TIMEOUT_S)
        if status != 202 or not isinstance(value, dict):
            raise self._refused(status, value, f"the {kind}")
        return value

    def start_shielded(self, kind: str, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """start() with SIGINT/SIGTERM held until the answer is in (the job must be known to be cancelled):
        (the job, whether an interrupt arrived meanwhile). Call from the main thread."""
        job: dict[str, Any] | None = None
        masked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            try:
                job = self.start(kind, body)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, masked)  # a held signal is raised here
        except KeyboardInterrupt:
            if job is None:
                raise
            return job, True
        return job, False

    def events(self, job_id: str, after: int, wait_s: float) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
        """(events with seq > after, the job, how many the agent no longer had), long-polling up to wait_s."""
        path = f"/api/jobs/{job_id}/events?after={after}&wait={wait_s:g}"
        status, value = self._request("GET", path, timeout=wait_s + REQUEST_TIMEOUT_S)
        if status != 200 or not isinstance(value, dict) or not isinstance(value.get("job"), dict):
            if status == 404:
                raise MetralError(f"the agent no longer knows job {job_id} (was it restarted?)",
                                  "`metralectl ps` shows what is serving")
            raise self._refused(status, value, "the events")
        events = [e for e in value.get("events") or [] if isinstance(e, dict)]
        return events, value["job"], int(value.get("missed") or 0)

    def cancel(self, job_id: str) -> dict[str, Any]:
        status, value = self._request("POST", f"/api/jobs/{job_id}/cancel", {})
        if status not in (200, 202) or not isinstance(value, dict):
            raise self._refused(status, value, "the cancel")
        return value

    def cancel_unit(self, key: str) -> dict[str, Any]:
        """Stop a peer's benchmark unit on this box (POST /api/units/KEY/cancel): the unit as it stands."""
        status, value = self._request("POST", f"/api/units/{key}/cancel", {})
        if status == 404 and isinstance(value, dict):  # no such unit there: a name given wrongly (usage)
            raise NotFound(str(value.get("error") or f"no unit {key} on this node"),
                           value.get("hint") if isinstance(value.get("hint"), str) else None)
        if status != 200 or not isinstance(value, dict):
            raise self._refused(status, value, f"cancelling unit {key}")
        return value

    def follow(self, job: dict[str, Any], on_event: Callable[[Any], None], *,
               cancelled: Callable[[], bool] | None = None, wait_s: float = FOLLOW_WAIT_S,
               leave_on_second_interrupt: bool = True, interrupted: bool = False) -> tuple[dict[str, Any], bool]:
        """Feed the job's events (rebuilt: lifecycle.events.from_json) to on_event until it ends.

        An interrupt (Ctrl-C, SIGTERM as KeyboardInterrupt, or `cancelled()` turning true) posts the
        cancel once and keeps following, so the cleanup is seen; the events after it are shown but
        on_event may raise (a dashboard's listener does). A second interrupt leaves at once when
        leave_on_second_interrupt (the agent still finishes the cleanup). Returns (the ended job,
        whether it was interrupted). `interrupted`: an interrupt arrived before following began."""
        job_id, after = str(job["id"]), 0
        cancel_sent = False
        poll = wait_s if cancelled is None else min(wait_s, 0.5)
        while True:
            try:
                if not interrupted and cancelled is not None and cancelled():
                    interrupted = True
                if interrupted and not cancel_sent:
                    self.cancel(job_id)
                    cancel_sent = True
                try:
                    events, job, missed = self.events(job_id, after, poll)
                except AgentGone:
                    raise MetralError(f"the agent (pid {self.pid}) stopped while the {job.get('kind')} ran",
                                      "`metralectl ps` shows what it left (`ps --repair` after a swap)") from None
                if missed:
                    self._deliver({"kind": "Warning", "message": f"{count(missed, 'event')} {noun(missed, 'was', 'were')} no longer kept by the agent"},
                                  on_event, tolerant=interrupted)
                for data in events:
                    seq = data.get("seq")
                    after = seq if isinstance(seq, int) and seq > after else after
                    self._deliver(data, on_event, tolerant=interrupted)
                if job.get("state") not in ACTIVE_STATES:
                    return job, interrupted
            except KeyboardInterrupt:
                if interrupted and leave_on_second_interrupt:
                    raise
                interrupted = True

    @staticmethod
    def _deliver(data: dict[str, Any], on_event: Callable[[Any], None], *, tolerant: bool) -> None:
        from metralectl.lifecycle.events import from_json

        try:
            event = from_json(data)
        except ValueError:
            return  # a kind a newer agent knows and this version does not
        if not tolerant:
            on_event(event)
            return
        try:
            on_event(event)
        except KeyboardInterrupt:
            pass  # cancelling already: a listener that raises at every event (the dashboard's) is not a second one


def outcome(job: dict[str, Any], interrupted: bool) -> dict[str, Any] | None:
    """The ended job's result (its JSON object; None when it has none); its error raised as the direct path
    would raise it; KeyboardInterrupt when it was cancelled from here."""
    from metralectl.seams.store import Busy

    state = job.get("state")
    if interrupted and state != "done":
        raise KeyboardInterrupt
    if state == "done":
        result = job.get("result")
        return result if isinstance(result, dict) else None
    message = str(job.get("error") or f"the {job.get('kind')} ended {state}")
    hint = job.get("hint") if isinstance(job.get("hint"), str) else None
    code = _failure_code(job.get("exit_code"))
    if state == "cancelled":  # not from here: the page, another client, or the agent stopping
        raise MetralError(f"the agent's {job.get('kind')} job was {message}", "`metralectl ps` shows what is serving",
                          exit_code=ExitCode.INTERRUPTED)
    if code is Busy.exit_code:
        raise Busy(message, hint)
    raise MetralError(message, hint, exit_code=code)


def _failure_code(value: Any) -> ExitCode:
    """The agent's code for a failure, through the one table; never OK (it failed) and never unknown."""
    code = ExitCode.of(value)
    return ExitCode.FAILED if code is ExitCode.OK else code


def rebuild(cls: type[ResultT], data: Mapping[str, Any] | None) -> ResultT:
    """A lifecycle result dataclass (Launched, SwapResult, StopResult) from the agent's JSON; keys this
    version does not know are ignored."""
    from dataclasses import fields

    names = {f.name for f in fields(cls)}
    try:
        return cls(**{k: v for k, v in (data or {}).items() if k in names})
    except (TypeError, AttributeError) as exc:
        raise MetralError(f"the agent's {cls.__name__} does not fit this metralectl ({exc})",
                          "is the agent another version? restart it, or add --direct") from None
