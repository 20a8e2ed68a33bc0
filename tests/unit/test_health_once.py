"""endpoint.health_once (http.client, for `ps`) against EngineClient.health (httpx) on the same answers."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from metralectl.seams.endpoint import EngineClient, health_once

PAGES: dict[str, tuple[int, str, bytes]] = {
    "/health": (200, "text/plain", b""),
    "/loading": (503, "application/json", b'{"status": "loading", "detail": "weights 40%"}'),
    "/latin": (200, "text/plain; charset=latin-1", "caf\u00e9".encode("latin-1")),
    "/long": (200, "text/plain", b"x" * 2000),
    "/broken-utf8": (500, "text/plain", b"\xff\xfe oops"),
}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        status, kind, body = PAGES.get(self.path, (404, "text/plain", b"no such page"))
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def engine() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_same_status_and_body_as_engineclient(engine: str) -> None:
    for path in [*PAGES, "/missing"]:
        with EngineClient(engine, timeout=1.0) as client:
            theirs = client.health(path)
        ours = health_once(engine, timeout=1.0, path=path)
        assert (ours.status, ours.body, ours.ready) == (theirs.status, theirs.body, theirs.ready), path
    assert health_once(engine + "/", timeout=1.0).status == 200


def test_nothing_listening_is_no_answer() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: refused
        ours = health_once(f"http://127.0.0.1:{port}", timeout=1.0)
        with EngineClient(f"http://127.0.0.1:{port}", timeout=1.0) as client:
            theirs = client.health()
    assert ours.status is None and theirs.status is None and ours.error and "refused" in ours.error.lower()
