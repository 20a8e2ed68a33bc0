"""The small HTTP server base shared by the local API and the peer listener (stdlib http.server).

One thread per connection (daemon threads: a stuck client cannot keep the process alive), a read
timeout on every connection, bodies bounded before they are read, JSON in and out, no access log on
stdout (the agent's own log line per request goes to its logger).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("metralectl.http")
MAX_BODY = 1 << 20


class BodyTooLarge(Exception):
    pass


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6 and self.server_address[0] == "::":
            try:
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # "::" takes IPv4 too
            except OSError:
                pass
        super().server_bind()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self, name: str) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2}, name=name, daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class Handler(BaseHTTPRequestHandler):
    server_version = "metralectl"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = 15  # seconds a connection may sit idle or trickle
    max_body = MAX_BODY

    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def header(self, name: str) -> str | None:
        value = self.headers.get(name)
        return value if value is None else value.strip()

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            raise BodyTooLarge("chunked bodies are not accepted; send Content-Length")
        length_s = self.headers.get("Content-Length") or "0"
        if not length_s.isdigit():
            raise BodyTooLarge("bad Content-Length")
        length = int(length_s)
        if length > self.max_body:
            raise BodyTooLarge(f"body larger than {self.max_body} bytes")
        return self.rfile.read(length) if length else b""

    def send_bytes(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, status: int, value: Any, headers: dict[str, str] | None = None) -> None:
        self.send_bytes(status, json_bytes(value), "application/json", headers)


def json_bytes(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True, default=str) + "\n").encode()
