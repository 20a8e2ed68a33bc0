"""A server on 127.0.0.1 that never ends what it sends (issue 27, class 6): an SSE event with no blank line, a
line with no newline, a body with no end. It counts what it managed to send, so a test can assert the
client stopped reading (bounded by what the client keeps plus what the kernel buffers), and that the client
closed the connection (the writer ends) rather than reading forever.

Routes: GET /health, /v1/models and /metrics, POST /v1/chat/completions and /tokenize; each either answers
normally (a small OpenAI-compatible engine) or, when named in `endless`, endlessly: `event` (an SSE event that
never ends), `line` (NDJSON that never ends its line), `body` (bytes without end).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNK = b"x" * 65536
MiB = 1 << 20


@dataclass
class Endless:
    endless: dict[str, str]  # path -> "event" | "line" | "body"
    sent: dict[str, int] = field(default_factory=dict)  # path -> bytes written before the client left
    ended: threading.Event = field(default_factory=threading.Event)  # an endless writer saw the client leave
    status: int = 200
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(state: Endless) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: object) -> None:
            pass

        def _json(self, value: object, status: int = 200) -> None:
            body = json.dumps(value).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _endless(self, path: str, kind: str) -> None:
            self.send_response(state.status)
            self.send_header("Content-Type", "text/event-stream" if kind == "event" else "application/json")
            self.send_header("Connection", "close")
            self.end_headers()
            first = {"event": b'data: {"choices": [{"delta": {"content": "', "line": b'{"event": "',
                     "body": b'{"data": ['}[kind]
            sent = 0
            try:
                self.wfile.write(first)
                while True:
                    self.wfile.write(CHUNK)
                    sent += len(CHUNK)
                    with state.lock:
                        state.sent[path] = sent
            except OSError:  # the client closed the connection: it stopped reading
                state.ended.set()
            self.close_connection = True

        def _route(self) -> None:
            path = self.path.split("?", 1)[0]
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            kind = state.endless.get(path)
            if kind is not None:
                self._endless(path, kind)
            elif path == "/health":
                self._json({"status": "ok"})
            elif path == "/v1/models":
                self._json({"data": [{"id": "endless-model", "owned_by": "test"}]})
            elif path == "/metrics":
                body = b"# TYPE requests_total counter\nrequests_total 1\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self._json({"error": "not here"}, 404)

        do_GET = _route
        do_POST = _route

    return Handler


@contextmanager
def endless(routes: dict[str, str], status: int = 200) -> Iterator[tuple[str, Endless]]:
    state = Endless(dict(routes), status=status)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()
