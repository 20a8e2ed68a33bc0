"""The agent's local API and its control-plane page, on loopback (security.py is the gate).

    GET  /                     the control-plane page (static HTML + JS + CSS served from here, no CDN)
    GET  /api/status           can this machine run models (the agent's own, re-checked answer)
    GET  /api/serving          what is serving (lifecycle.status.collect)
    GET  /api/recipes          the library rows
    GET  /api/telemetry        the newest GPU sample, or why there is none
    GET  /api/history          recorded benchmark runs
    GET  /api/jobs[/ID]        lifecycle jobs started through the API, with their events
    POST /api/run   {recipe}   start serving a recipe        -> 202 {job} | 409 busy
    POST /api/swap  {recipe}   replace the served model       -> 202 {job} | 409 busy
    POST /api/stop  {recipe?}  stop what is served            -> 202 {job} | 409 busy

Every POST needs the bearer token; GET never changes anything.
"""

from __future__ import annotations

import json
import logging
import mimetypes
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from metralectl import __version__
from metralectl.agent import security
from metralectl.agent.jobs import JobRunner
from metralectl.agent.ops import Operations, error_json, static_dir
from metralectl.errors import MetralError
from metralectl.httpserve import BodyTooLarge, Handler, Server

log = logging.getLogger("metralectl.agent")

PAGE_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                                "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
STATIC = {"/": "index.html", "/index.html": "index.html", "/app.js": "app.js", "/app.css": "app.css"}


class ApiHandler(Handler):
    server: LocalApiServer
    max_body = 64 * 1024

    def _deny(self, denied: security.Denied) -> None:
        log.info("local API refused %s %s: %s", self.command, self.path, denied.reason)
        self.close_connection = True
        self.send_json(denied.status, {"error": denied.reason}, PAGE_HEADERS)

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
        reads: dict[str, Callable[[], Any]] = {
            "/api/status": self.server.ops.capability,
            "/api/serving": self.server.ops.serving,
            "/api/recipes": self.server.ops.recipes,
            "/api/telemetry": self.server.ops.telemetry,
            "/api/history": self.server.ops.history,
            "/api/jobs": lambda: {"jobs": [j.to_json(events=False) for j in self.server.jobs.list()]},
            "/api/agent": lambda: {"version": __version__, **self.server.info},
        }
        if route in reads:
            try:
                self.send_json(200, reads[route](), PAGE_HEADERS)
            except MetralError as exc:
                self.send_json(503, error_json(exc), PAGE_HEADERS)
            return
        if route.startswith("/api/jobs/"):
            job = self.server.jobs.get(route[len("/api/jobs/"):])
            if job is None:
                self.send_json(404, {"error": "no such job"}, PAGE_HEADERS)
            else:
                self.send_json(200, job.to_json(), PAGE_HEADERS)
            return
        self.send_json(404, {"error": f"no {route}"}, PAGE_HEADERS)

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
        except BodyTooLarge as exc:
            self.close_connection = True
            self.send_json(413, {"error": str(exc)}, PAGE_HEADERS)
            return
        if kind != "application/json":
            self.send_json(415, {"error": "send JSON (Content-Type: application/json)"}, PAGE_HEADERS)
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self.send_json(400, {"error": "the body is not JSON"}, PAGE_HEADERS)
            return
        if not isinstance(body, dict):
            self.send_json(400, {"error": "the body must be a JSON object"}, PAGE_HEADERS)
            return
        recipe = body.get("recipe")
        if recipe is not None and not isinstance(recipe, str):
            self.send_json(400, {"error": "recipe must be a string"}, PAGE_HEADERS)
            return
        ops = self.server.ops
        if route in ("/api/run", "/api/swap"):
            if not recipe:
                self.send_json(400, {"error": "which recipe? send {\"recipe\": NAME}"}, PAGE_HEADERS)
                return
            kind_ = route.rsplit("/", 1)[1]
            fn = ops.run if kind_ == "run" else ops.swap
            self._start(kind_, recipe, lambda emit: fn(recipe, emit))
        elif route == "/api/stop":
            self._start("stop", recipe, lambda emit: ops.stop(recipe, emit))
        else:
            self.send_json(404, {"error": f"no POST {route}"}, PAGE_HEADERS)

    def _start(self, kind: str, target: str | None, work: Callable[[Callable[[Any], None]], Any]) -> None:
        from metralectl.store import Busy

        try:
            job = self.server.jobs.start(kind, target, work)
        except Busy as exc:
            self.send_json(409, error_json(exc), PAGE_HEADERS)
            return
        except MetralError as exc:
            self.send_json(400, error_json(exc), PAGE_HEADERS)
            return
        self.send_json(202, job.to_json(), {**PAGE_HEADERS, "Location": f"/api/jobs/{job.id}"})


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
        super().__init__(("::1" if host == "::1" else "127.0.0.1", port), ApiHandler)
        self.info.setdefault("api_port", self.port)

    @property
    def port(self) -> int:
        return int(self.server_address[1])
