"""What a fake container does once started (tests/fakes/runtime.py): a script of log lines, the engine's port
bound on loopback, /health answers that change, an exit; and the engine's HTTP side (/health, /v1/models,
/metrics) answered from the container's state."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

PREFIX = "2026-08-26T05:35:05Z  INFO "  # the engine's tracing prefix


@dataclass(frozen=True)
class Log:
    """Write a line ({port}, {bind} and {model} are filled in)."""
    line: str
    after_s: float = 0.0


@dataclass(frozen=True)
class Listen:
    """Bind the engine's port on loopback; /health answers `status` with `body` until told otherwise."""
    status: int = 503
    body: dict[str, Any] = field(default_factory=lambda: {"status": "loading"})
    after_s: float = 0.0


@dataclass(frozen=True)
class Answer:
    """/health answers this from now on."""
    status: int
    body: dict[str, Any]
    after_s: float = 0.0


@dataclass(frozen=True)
class Exit:
    code: int
    oom: bool = False  # the kernel's OOM killer (Docker reports OOMKilled; the code is 137)
    after_s: float = 0.0


@dataclass(frozen=True)
class Chatter:
    """Write `line` every `every_s` until the container stops (a boot that never gets anywhere)."""
    line: str
    every_s: float = 0.1


Action = Log | Listen | Answer | Exit | Chatter


@dataclass(frozen=True)
class Boot:
    actions: tuple[Action, ...] = ()  # after the last one the container keeps running until stopped
    model: str = "org/model"
    requests_active: float = 0.0  # what /metrics reports (metrale_requests_active)
    sigterm_exit: int | None = 0  # the exit code on SIGTERM; None: ignores it (killed after the timeout, 137)
    start_error: str | None = None  # the daemon refuses the start (nothing is left behind)
    interrupt_in_create: bool = False  # Ctrl-C lands after the daemon created it, before its id came back


def engine_boot(model: str = "org/model", *, step_s: float = 0.2, **kw: Any) -> Boot:
    """Boots like the engine: log lines, the port bound (503 loading), weights loaded, then /health 200 ready."""
    return Boot((Log(PREFIX + "Metrale Engine starting..."), Listen(),
                 Log(PREFIX + "Fast-loaded 1234 weight tensors", after_s=step_s),
                 Answer(200, {"status": "ready", "model": model}, after_s=step_s),
                 Log(PREFIX + "Server live and ready at {bind}:{port} running {model}")), model=model, **kw)


def engine_handler(c: Any) -> Callable[..., BaseHTTPRequestHandler]:
    """The engine's HTTP side for a fake container `c` (its `health` answer and its `boot`'s model and load)."""

    class Engine(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            health = c.health or (503, {"status": "loading"})
            if self.path.startswith("/health"):
                status, body = health[0], json.dumps(health[1]).encode()
            elif self.path.startswith("/v1/models") and health[0] == 200:
                status, body = 200, json.dumps({"object": "list", "data": [{"id": c.boot.model}]}).encode()
            elif self.path.startswith("/metrics"):
                status = 200
                body = (f"# TYPE metrale_requests_active gauge\nmetrale_requests_active {c.boot.requests_active}\n"
                        ).encode()
            else:
                status, body = 404, b"{}"
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802 - a real request (max_tokens 1), answered once the engine is ready
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            ready = (c.health or (503, {}))[0] == 200 and self.path.startswith("/v1/chat/completions")
            body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "x"}}]} if ready else {}).encode()
            self.send_response(200 if ready else 503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Engine
