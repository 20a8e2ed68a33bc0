"""The agent's local API and its control-plane page, on loopback (security.py is the gate).

    GET  /                         the control-plane page (static HTML + JS + CSS served from here, no CDN)
    GET  /api/status               can this machine run models (the agent's own, re-checked answer)
    GET  /api/serving              what is serving (lifecycle.status.collect: every served model), this box's
                                   gateways (each from its own /metrics; `gone` when its process is), and what
                                   change is in progress, whoever started it (the lifecycle lock's holder)
    GET  /api/recipes              the library rows
    GET  /api/telemetry            the newest GPU sample, or why there is none
    GET  /api/history              recorded benchmark runs
    GET  /api/agent[?challenge=N]  who this is; with N, the HMAC proof that it holds the token (agent_files.agent_proof)
    GET  /api/jobs[/ID]            lifecycle jobs started through the API, with their events
    GET  /api/jobs/ID/events?after=N&wait=S   the events after N; waits up to S (<= 25) s for one (long-poll)
    POST /api/run   {recipe, sets?, options?}                 start serving   -> 202 {job} | 400 | 409 busy
    POST /api/swap  {recipe, sets?, drain_timeout_s?, options?} replace it    -> 202 {job} | 400 | 409 busy
    POST /api/stop  {recipe?, all?, timeout_s?}               stop it         -> 202 {job} | 400 | 409 busy
                    (each body is read by app/serving_change.Change.from_json(), its "kind" optional)
    POST /api/jobs/ID/cancel       cancel a job (its cancel token)  -> 202 {job} (200 when it had ended)
    POST /api/units/KEY/cancel     stop a peer's benchmark unit on this box -> 200 {unit} | 404

Every POST needs the bearer token; GET never changes anything.
"""

from __future__ import annotations

import json
import logging
import math
import mimetypes
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from metralectl import __version__
from metralectl.agent import security
from metralectl.agent.jobs import JobRunner
from metralectl.agent.ops import Operations, error_json, static_dir
from metralectl.app.serving_change import Change, known_keys
from metralectl.errors import MetralError, UsageError
from metralectl.safetext import clean
from metralectl.seams.agent_files import CHALLENGE, agent_proof
from metralectl.seams.httpserve import BadRequest, Handler, Server, parse_json

if TYPE_CHECKING:
    from metralectl.peers.units import UnitQueue

log = logging.getLogger("metralectl.agent")

PAGE_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                                "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


def in_progress() -> str | None:
    """Who holds the machine's lifecycle lock now ("run qwen3-8b (pid 4242)"; "... (agent) ..." for one of our
    jobs), or None: the page shows a change the CLI, the dashboard or a peer's unit is making, which are not its
    jobs. The holder is written by any local user's metralectl: escaped like any text from outside."""
    from metralectl.seams.store import lock_holder

    holder = lock_holder()
    return None if holder is None else clean(holder, 200)


STOP_GRACE_S = 60.0  # how long stopping the agent waits for a cancelled job's cleanup
STATIC = {"/": "index.html", "/index.html": "index.html", "/safetext.js": "safetext.js", "/joblog.js": "joblog.js",
          "/app.js": "app.js", "/app.css": "app.css"}


def events_query(query: str) -> tuple[int, float]:
    """?after=N&wait=S of GET /api/jobs/ID/events: (N >= 0, S seconds, at most MAX_WAIT_S)."""
    from metralectl.agent.jobs import MAX_WAIT_S

    params = parse_qs(query, keep_blank_values=True)
    known_keys(params, ("after", "wait"), "the events query")
    try:
        after = int(params.get("after", ["0"])[-1])
        wait_s = float(params.get("wait", ["0"])[-1])
    except ValueError:
        raise UsageError("after must be an event number and wait a number of seconds") from None
    if after < 0 or not math.isfinite(wait_s) or wait_s < 0:
        raise UsageError("after and wait must not be negative")
    return after, min(wait_s, MAX_WAIT_S)


class ApiHandler(Handler):
    server: LocalApiServer
    max_body = 64 * 1024

    def _deny(self, denied: security.Denied) -> None:
        log.info("local API refused %s %s: %s", self.command, clean(self.path, 200), clean(denied.reason, 300))
        self.close_connection = True
        self.send_json(denied.status, {"error": denied.reason}, PAGE_HEADERS)

    def refuse_request(self, status: int, reason: str) -> None:
        self._deny(security.Denied(status, reason))

    def _gate(self) -> bool:
        denied = security.check(self.command, self.headers, port=self.server.port, token=self.server.token)
        if denied is not None:
            self._deny(denied)
            return False
        return True

    def do_GET(self) -> None:
        if self._gate():
            self._get()

    def do_HEAD(self) -> None:
        if self._gate():
            self._get()

    def do_POST(self) -> None:
        if self._gate():
            self._post()

    def _other(self) -> None:
        self._deny(security.Denied(405, f"method {self.command} not allowed"))

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _other

    # -- reads ----------------------------------------------------------------------------------
    def _get(self) -> None:
        route = urlsplit(self.path).path
        if route in STATIC:
            self._static(STATIC[route])
            return
        ops = self.server.ops  # each read looked up only when asked (GET /api/agent needs none of them)
        reads: dict[str, Callable[[], Any]] = {
            "/api/status": lambda: ops.capability(),
            "/api/serving": lambda: {**ops.serving(), "in_progress": in_progress()},
            "/api/recipes": lambda: ops.recipes(),
            "/api/telemetry": lambda: ops.telemetry(),
            "/api/history": lambda: ops.history(),
            "/api/jobs": lambda: {"jobs": [j.to_json(events=False) for j in self.server.jobs.list()]},
            "/api/agent": self._agent,
        }
        if route in reads:
            try:
                self.send_json(200, reads[route](), PAGE_HEADERS)
            except UsageError as exc:
                self.send_json(400, error_json(exc), PAGE_HEADERS)
            except MetralError as exc:
                self.send_json(503, error_json(exc), PAGE_HEADERS)
            return
        events = re.fullmatch(r"/api/jobs/([^/]+)/events", route)
        if events is not None:
            self._events(events.group(1), urlsplit(self.path).query)
            return
        if route.startswith("/api/jobs/") and "/" not in route[len("/api/jobs/"):]:
            job = self.server.jobs.get(route[len("/api/jobs/"):])
            if job is None:
                self.send_json(404, {"error": "no such job"}, PAGE_HEADERS)
            else:
                self._send_ordered(200, job.to_json())
            return
        self.send_json(404, {"error": f"no {route}"}, PAGE_HEADERS)

    def _agent(self) -> dict[str, Any]:
        """Who this is; with ?challenge=N, also the proof that it holds the token (the CLI checks it
        before it sends the token: whatever listens on a stale agent.json's port must not get it)."""
        out: dict[str, Any] = {"version": __version__, **self.server.info}
        challenge = (parse_qs(urlsplit(self.path).query).get("challenge") or [""])[-1]
        if challenge:
            if not CHALLENGE.fullmatch(challenge):
                raise UsageError("a challenge is 16-64 url-safe characters")
            out["proof"] = agent_proof(self.server.token, self.server.port, challenge)
        return out

    def _static(self, name: str) -> None:
        path = self.server.static / name
        try:
            body = path.read_bytes()
        except OSError:
            self.send_json(404, {"error": f"{name} is missing from this installation"}, PAGE_HEADERS)
            return
        kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
        if kind.startswith("text/") or kind.endswith("javascript"):
            kind += "; charset=utf-8"
        self.send_bytes(200, body, kind, PAGE_HEADERS)

    # -- changes --------------------------------------------------------------------------------
    def _post(self) -> None:
        route = urlsplit(self.path).path
        kind = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        try:
            raw = self.read_body()
        except BadRequest as exc:
            self.close_connection = True
            self.send_json(exc.status, {"error": str(exc)}, PAGE_HEADERS)
            return
        if kind != "application/json":
            self.send_json(415, {"error": "send JSON (Content-Type: application/json)"}, PAGE_HEADERS)
            return
        try:
            body = parse_json(raw or b"{}")
        except ValueError as exc:
            self.send_json(400, {"error": f"the body is not JSON we take ({exc})"}, PAGE_HEADERS)
            return
        if not isinstance(body, dict):
            self.send_json(400, {"error": "the body must be a JSON object"}, PAGE_HEADERS)
            return
        cancel = re.fullmatch(r"/api/jobs/([^/]+)/cancel", route)
        cancel_unit = re.fullmatch(r"/api/units/([^/]+)/cancel", route)
        if route in ("/api/run", "/api/swap", "/api/stop"):
            self._change(route.rsplit("/", 1)[1], body)
        elif cancel is not None:
            self._cancel(cancel.group(1))
        elif cancel_unit is not None:
            self._cancel_unit(cancel_unit.group(1))
        else:
            self.send_json(404, {"error": f"no POST {route}"}, PAGE_HEADERS)

    def _change(self, kind: str, body: dict[str, Any]) -> None:
        """The body is a Change (Change.to_json(), the route naming its kind): checked, then done as a job."""
        ops = self.server.ops
        try:
            change = Change.from_json(body, kind=kind)
            if kind != "stop":
                ops.check(change)  # an unknown recipe or a bad --set is refused here, before any job
        except MetralError as exc:
            log.info("local API refused a %s, asked by %s: %s", kind, clean(self._who()), clean(exc.message, 300))
            self.send_json(400, refusal_json(exc), PAGE_HEADERS)
            return
        from metralectl.joblog import describe

        self._start(kind, change.recipe, lambda emit: ops.apply(change, emit),
                    describe(kind, change.recipe or ("every model" if change.all_ else None), change.sets))

    def _who(self) -> str:
        """The client, for the agent's log: its address and what it says it is (escaped by the log)."""
        host, port = self.client_address[:2]
        agent = (self.headers.get("User-Agent") or "").strip()
        return f"the local API client {host}:{port}" + (f" ({agent[:80]})" if agent else "")

    def _start(self, kind: str, target: str | None, work: Callable[[Callable[[Any], None]], Any], what: str) -> None:
        from metralectl.seams.store import Busy

        try:
            job = self.server.jobs.start(kind, target, work, who=self._who(), what=what)
        except Busy as exc:
            log.info("local API refused %s, asked by %s: %s", what, clean(self._who()), clean(exc.message, 300))
            self.send_json(409, refusal_json(exc), PAGE_HEADERS)
            return
        except MetralError as exc:
            log.info("local API refused %s, asked by %s: %s", what, clean(self._who()), clean(exc.message, 300))
            self.send_json(400, refusal_json(exc), PAGE_HEADERS)
            return
        self._send_ordered(202, job.to_json(), {"Location": f"/api/jobs/{job.id}"})

    def _cancel(self, job_id: str) -> None:
        job = self.server.jobs.get(job_id)
        if job is None:
            self.send_json(404, {"error": "no such job"}, PAGE_HEADERS)
            return
        active = job.cancel()
        log.info("job %s: cancel requested%s", job.id, "" if active else " (it had already ended)")
        self._send_ordered(202 if active else 200, job.to_json(events=False))

    def _cancel_unit(self, key: str) -> None:
        """This box's operator stops a peer's benchmark unit (it holds the lifecycle lock while it runs)."""
        from metralectl.peers.units import UnitNotFound

        units = self.server.units
        if units is None:
            self.send_json(404, {"error": "this agent runs no peer listener, so no peer's unit runs here",
                                 "hint": "`metralectl peer units` lists what peers ran here"}, PAGE_HEADERS)
            return
        try:
            unit = units.cancel(key, None)
        except UnitNotFound:
            self.send_json(404, {"error": f"no unit {key} on this node",
                                 "hint": "`metralectl peer units` lists them"}, PAGE_HEADERS)
            return
        log.info("unit %s: cancel requested by this node's operator", key)
        self._send_ordered(200, unit.to_json())

    def _events(self, job_id: str, query: str) -> None:
        job = self.server.jobs.get(job_id)
        if job is None:
            self.send_json(404, {"error": "no such job"}, PAGE_HEADERS)
            return
        try:
            after, wait_s = events_query(query)
        except MetralError as exc:
            self.send_json(400, refusal_json(exc), PAGE_HEADERS)
            return
        events, state, missed = job.wait_events(after, wait_s)
        self._send_ordered(200, {"events": events, "missed": missed, "job": state})

    def _send_ordered(self, status: int, value: Any, headers: dict[str, str] | None = None) -> None:
        """JSON in the order it was built (a result's phases keep their order: drain, stop, boot, ...)."""
        body = (json.dumps(value, default=str) + "\n").encode()
        self.send_bytes(status, body, "application/json", {**PAGE_HEADERS, **(headers or {})})


def refusal_json(exc: MetralError) -> dict[str, Any]:
    """A refusal as the CLI would show it: message, hint, and the exit code the direct path would end with."""
    from metralectl.errors import RecipeInvalid

    out: dict[str, Any] = {**error_json(exc), "exit_code": exc.exit_code}
    if isinstance(exc, RecipeInvalid):
        out["problems"] = [p.render() for p in exc.problems if p.severity == "error"]
    return out


class LocalApiServer(Server):
    def __init__(self, ops: Operations, *, token: str, port: int = security.DEFAULT_API_PORT,
                 host: str = "127.0.0.1", jobs: JobRunner | None = None, static: Path | None = None,
                 info: dict[str, Any] | None = None) -> None:
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise MetralError(f"the local API listens on loopback only, not {host}",
                              "reach it from elsewhere through `ssh -L PORT:127.0.0.1:PORT`")
        self.ops = ops
        self.token = token
        self.jobs = jobs or JobRunner()
        self.static = static or static_dir()
        self.info = dict(info or {})
        self.units: UnitQueue | None = None  # the peer listener's unit queue (the agent sets it)
        super().__init__(("::1" if host == "::1" else "127.0.0.1", port), ApiHandler)
        self.info.setdefault("api_port", self.port)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):  # a follower left mid-poll
            log.debug("local API: %s left before its answer", client_address)
            return
        super().handle_error(request, client_address)

    def stop(self) -> None:
        """Cancel a running job first (as Ctrl-C would: its cleanup runs, its followers see it), then stop."""
        left = self.jobs.shutdown(STOP_GRACE_S)
        for job in left:
            log.warning("job %s did not finish its cleanup within %g s", job.id, STOP_GRACE_S)
        super().stop()
