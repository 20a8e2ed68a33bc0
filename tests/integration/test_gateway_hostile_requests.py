"""An attacker's pass over the gateway's request reader (gateway/http1.py), before any key is asked for: a
Content-Length of a non-ASCII digit or of 5000 digits, a chunk size that is negative, prefixed or endless. Each is a
400 answer and the connection closed; the gateway keeps serving and prints no traceback (it did, and answered
nothing: `Unhandled exception in client_connected_cb`)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.integration.gateway_client import Gateway, box_env

pytestmark = [pytest.mark.integration]

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
CASES = {
    "superscript-length": HEAD + b"Content-Length: \xb2\r\n\r\nab",
    "5000-digit-length": HEAD + b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n",
    "negative-chunk": HEAD + b"Transfer-Encoding: chunked\r\n\r\n-5\r\nabc\r\n0\r\n\r\n",
    "prefixed-chunk": HEAD + b"Transfer-Encoding: chunked\r\n\r\n0x2\r\nab\r\n0\r\n\r\n",
    "endless-chunk-line": HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"1" * 200_000 + b"\r\n",
    "endless-trailer": HEAD + b"Transfer-Encoding: chunked\r\n\r\n0\r\nX: " + b"y" * 200_000 + b"\r\n\r\n",
}


# Heads that two readers could frame two ways (RFC 9112 6.1/6.3, RFC 9110 5.5): each went on as a 200 /health before;
# forwarded to an engine with a laxer parser on a pooled connection, the bare LF, the NUL or the control character
# could add headers (a second Content-Length) and smuggle a request whose answer another client would read.
HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n"
SMUGGLING = {
    "te-and-cl": HEALTH + b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n",
    "two-te": HEALTH + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "two-lengths": HEALTH + b"Content-Length: 0\r\nContent-Length: 5\r\n\r\nhello",
    "bare-lf-in-a-value": HEALTH + b"X-A: a\nContent-Length: 5\r\n\r\n",
    "bare-cr-in-a-value": HEALTH + b"X-A: a\rContent-Length: 5\r\n\r\n",
    "nul-in-a-value": HEALTH + b"X-A: a\x00b\r\n\r\n",
    "control-in-the-target": b"GET /health\x01 HTTP/1.1\r\nHost: x\r\n\r\n",
    "name-no-token": HEALTH + b"X(A): b\r\n\r\n",
    "http-1.9": b"GET /health HTTP/1.9\r\nHost: x\r\n\r\n",
}


def _send(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        try:
            conn.sendall(raw)
        except ConnectionResetError:
            pass  # answered and closed before all was sent: what was answered is still to be read
        answer = b""
        try:
            while chunk := conn.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
        return answer


def test_malformed_bodies_are_400_and_the_gateway_serves_on(tmp_path: Path) -> None:
    gateway = Gateway(box_env(tmp_path / "box"))
    try:
        for name, raw in CASES.items():
            answer = _send(gateway.port, raw)
            assert answer.startswith(b"HTTP/1.1 400 "), (name, answer[:200])
        status, _, body = gateway.request("GET", "/health")
        assert status == 200, body
    finally:
        stderr = gateway.stop()
    assert "Traceback" not in stderr and "Unhandled exception" not in stderr, stderr[-3000:]


def test_a_body_nested_past_pythons_stack_is_400_and_paths_asked_do_not_grow_the_metrics(tmp_path: Path) -> None:
    """A JSON body of 200 000 '[' was an unhandled RecursionError (no answer, a traceback); every path a client
    asked got its own metrics series, so a client without a key could grow the gateway's memory without end."""
    gateway = Gateway(box_env(tmp_path / "box"))
    try:
        deep = b"[" * 200_000
        answer = _send(gateway.port, HEAD + b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(deep) + deep)
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
        for i in range(50):
            assert gateway.request("POST", f"/v1/made-up-{i}", {"model": "m"})[0] == 404
        _, _, text = gateway.request("GET", "/metrics")
        series = [line for line in text.decode().splitlines() if line.startswith("metralectl_gateway_requests_total{")]
        assert not any("made-up" in line for line in series), series
        assert any('path="(other)",status="404"} 50.0' in line for line in series), series
    finally:
        stderr = gateway.stop()
    assert "Traceback" not in stderr and "Unhandled exception" not in stderr, stderr[-3000:]


def test_heads_that_could_be_framed_two_ways_are_400_and_closed(tmp_path: Path) -> None:
    gateway = Gateway(box_env(tmp_path / "box"))
    try:
        for name, raw in SMUGGLING.items():
            answer = _send(gateway.port, raw)
            assert answer.startswith(b"HTTP/1.1 400 "), (name, answer[:200])
            assert answer.count(b"HTTP/1.1 ") == 1, (name, answer)  # nothing after it read as a second request
        # the same head made well is served: two equal Content-Lengths are one length (RFC 9110 8.6)
        fine = _send(gateway.port, HEALTH + b"Connection: close\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n")
        assert fine.startswith(b"HTTP/1.1 200 "), fine[:200]
    finally:
        stderr = gateway.stop()
    assert "Traceback" not in stderr and "Unhandled exception" not in stderr, stderr[-3000:]
