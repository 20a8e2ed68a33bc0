"""Malformed input on both ports is answered, in words, with 400 (issue 19, item 5): not a traceback, not a
dropped connection. Real servers on loopback, raw bytes where a polite client would not send them.

Also: a hello's peer_port is range-checked, a symlinked token file is refused in words, and the peers
directory is 0700."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from metralectl.agent.api import LocalApiServer
from metralectl.errors import MetralError
from metralectl.peers.address import BadAddress, parse_address
from metralectl.peers.config import BenchConfig, save_bench_config
from metralectl.peers.protocol import NonceStore, sign_request, verify_request
from metralectl.peers.store import PeerStore
from metralectl.seams import agent_files, identity
from tests.unit.peer_fixtures import Box, body_of, hello_request, raw_exchange, send_hello, status_of
from tests.unit.test_agent_api import TOKEN, FakeOps

REPO = Path(__file__).resolve().parents[2]
NESTED = b"[" * 60_000


@pytest.fixture()
def api() -> Iterator[LocalApiServer]:
    server = LocalApiServer(FakeOps(), token=TOKEN, port=0)
    server.start("test-api")
    yield server
    server.stop()


@pytest.fixture()
def box(tmp_path: Path) -> Iterator[Box]:
    made = Box(tmp_path, "b")
    yield made
    made.stop()


@pytest.fixture()
def errors(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Server-side errors (socketserver prints a traceback through handle_error; ours log it): none allowed."""
    caplog.set_level(logging.WARNING)
    return caplog


def _api_post(server: LocalApiServer, body: bytes, *, length: str | None = None, extra: str = "") -> bytes:
    head = (f"POST /api/run HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length if length is not None else len(body)}\r\n"
            f"{extra}Connection: close\r\n\r\n")
    return raw_exchange(server.port, head.encode() + body)


def _no_traceback(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    err = capsys.readouterr().err
    assert "Traceback" not in err and "RecursionError" not in err, err[-2000:]
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


# -- the local API ----------------------------------------------------------------------------------------------
def test_api_deeply_nested_json_is_a_400(api: LocalApiServer, capsys: pytest.CaptureFixture[str],
                                         errors: pytest.LogCaptureFixture) -> None:
    answer = _api_post(api, NESTED)
    assert status_of(answer) == 400, answer[:300]
    assert "nested too deeply" in body_of(answer)["error"]
    _no_traceback(capsys, errors)


@pytest.mark.parametrize("length", ["²", "١٢", "12 3", "-1", "0x10", ""])
def test_api_content_length_must_be_ascii_digits(api: LocalApiServer, length: str,
                                                 capsys: pytest.CaptureFixture[str],
                                                 errors: pytest.LogCaptureFixture) -> None:
    answer = _api_post(api, b"{}", length=length)
    assert status_of(answer) == 400, answer[:300]
    assert "Content-Length" in body_of(answer)["error"]
    _no_traceback(capsys, errors)


def test_api_two_host_headers_are_a_400(api: LocalApiServer) -> None:
    """The allowed Host first, another after it: the gate must not read only the first."""
    request = (f"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1:{api.port}\r\nHost: evil.example\r\n"
               "Connection: close\r\n\r\n").encode()
    answer = raw_exchange(api.port, request)
    assert status_of(answer) == 400 and "Host header is given more than once" in body_of(answer)["error"]
    assert b"Content-Security-Policy" in answer  # the API's own refusal, with the page headers
    single = raw_exchange(api.port, f"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1:{api.port}\r\n"
                                    "Connection: close\r\n\r\n".encode())
    assert status_of(single) == 200


def test_api_two_content_lengths_are_a_400(api: LocalApiServer) -> None:
    answer = _api_post(api, b"{}", extra="Content-Length: 0\r\n")
    assert status_of(answer) == 400 and "Content-Length" in body_of(answer)["error"]


# -- the peer port ----------------------------------------------------------------------------------------------
def test_peer_hello_deeply_nested_json_is_a_400(box: Box, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                errors: pytest.LogCaptureFixture) -> None:
    stranger = identity.load_or_create(tmp_path / "stranger")
    answer = send_hello(stranger, box, body=NESTED)
    assert answer.status_code == 400 and "nested too deeply" in answer.json()["error"]
    _no_traceback(capsys, errors)


def test_peer_unit_submission_deeply_nested_json_is_a_400(box: Box, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          errors: pytest.LogCaptureFixture) -> None:
    """Past the signature, the grant and bench.yaml: the body a granted peer sends must not crash the route."""
    peer = identity.load_or_create(tmp_path / "peer")
    store = PeerStore(box.base)
    store.add_paired(peer.fingerprint, peer.public_b64, "127.0.0.1:1", "peer")
    store.grant(peer.fingerprint)
    save_bench_config(BenchConfig(enabled=True), box.base)
    headers = sign_request(peer, box.me.fingerprint, "POST", "/peer/v1/units", NESTED)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (f"POST /peer/v1/units HTTP/1.1\r\nHost: {box.addr}\r\nContent-Type: application/json\r\n{head}"
               f"Content-Length: {len(NESTED)}\r\nConnection: close\r\n\r\n").encode() + NESTED
    answer = raw_exchange(box.server.port, request)
    assert status_of(answer) == 400 and "nested too deeply" in body_of(answer)["error"]
    _no_traceback(capsys, errors)


def test_peer_content_length_must_be_ascii_digits(box: Box, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  errors: pytest.LogCaptureFixture) -> None:
    stranger = identity.load_or_create(tmp_path / "stranger")
    raw, headers = hello_request(stranger, box)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (f"POST /peer/v1/hello HTTP/1.1\r\nHost: {box.addr}\r\n{head}Content-Length: ²\r\n"
               "Connection: close\r\n\r\n").encode() + raw
    answer = raw_exchange(box.server.port, request)
    assert status_of(answer) == 400 and "Content-Length" in body_of(answer)["error"]
    assert b"X-Metrale-Signature" in answer  # refused as the node: signed
    _no_traceback(capsys, errors)


def test_peer_two_host_headers_are_a_400(box: Box) -> None:
    request = (f"GET /peer/v1/identity?challenge={'c' * 24} HTTP/1.1\r\nHost: {box.addr}\r\nHost: other\r\n"
               "Connection: close\r\n\r\n").encode()
    assert status_of(raw_exchange(box.server.port, request)) == 400


@pytest.mark.parametrize("port", [99999, 0, -1, True, "8899", 8899.5, None])
def test_a_hellos_peer_port_is_range_checked(box: Box, tmp_path: Path, port: object) -> None:
    stranger = identity.load_or_create(tmp_path / "stranger")
    answer = send_hello(stranger, box, peer_port=port)
    assert answer.status_code == 400 and "peer_port" in answer.json()["error"]
    assert PeerStore(box.base).load().pending == []  # nothing stored
    good = send_hello(stranger, box, peer_port=65535)
    assert good.status_code == 200
    assert [p.from_addr for p in PeerStore(box.base).load().pending] == ["127.0.0.1:65535"]


def test_a_signed_header_with_a_non_ascii_digit_is_refused_not_raised(tmp_path: Path) -> None:
    a, b = identity.load_or_create(tmp_path / "a"), identity.load_or_create(tmp_path / "b")
    headers = sign_request(a, b.fingerprint, "GET", "/peer/v1/admission")
    for name in ("X-Metrale-Created", "X-Metrale-Expires"):
        bad = {**headers, name: "²"}
        result = verify_request(bad, "GET", "/peer/v1/admission", b"", me=b.fingerprint,
                                keys=lambda fp: a.public_key, nonces=NonceStore())
        assert getattr(result, "status", None) == 401, result


@pytest.mark.parametrize("text", ["host:²", "host:١", "[::1]:²"])
def test_an_address_with_a_non_ascii_port_is_a_usage_error(text: str) -> None:
    with pytest.raises(BadAddress, match="is not a number from 1 to 65535"):
        parse_address(text)


def test_a_node_answering_deeply_nested_json_is_a_protocol_error(tmp_path: Path) -> None:
    """The client side: `peer pair ADDR` talks to a machine it does not trust yet."""
    import socket
    import threading

    from metralectl.peers.client import PeerProtocolError, fetch_identity

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n%s" % (len(NESTED), NESTED))

    threading.Thread(target=answer, daemon=True).start()
    try:
        with pytest.raises(PeerProtocolError, match="not JSON"):
            fetch_identity(parse_address(f"127.0.0.1:{port}"), timeout=10)
    finally:
        listener.close()


# -- files --------------------------------------------------------------------------------------------------------
def test_a_symlinked_token_file_is_refused_in_words(isolated_env: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("t" * 43 + "\n")
    os.chmod(target, 0o600)
    path = agent_files.token_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.symlink_to(target)
    with pytest.raises(MetralError, match="it is a symbolic link") as refused:
        agent_files.load_or_create_token()
    assert "rm " in (refused.value.hint or "")
    out = subprocess.run([sys.executable, "-m", "metralectl", "agent", "url"], capture_output=True, text=True,
                         cwd=REPO, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode != 0 and "it is a symbolic link" in out.stderr
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr.lower()


def test_the_peers_directory_is_private(tmp_path: Path) -> None:
    loose = tmp_path / "old" / "peers"
    loose.mkdir(parents=True, mode=0o755)
    os.chmod(loose, 0o755)  # as an older version left it
    made = Box(tmp_path, "fresh")
    old = Box(tmp_path, "old")
    try:
        stranger = identity.load_or_create(tmp_path / "stranger")
        assert send_hello(stranger, made).status_code == 200  # the first hello creates the nonce store and peers.json
        for box in (made, old):
            mode = stat.S_IMODE((box.base / "peers").stat().st_mode)
            assert mode == 0o700, f"{box.name}: {mode:o}"
        assert stat.S_IMODE((made.base / "peers" / "peers.json").stat().st_mode) == 0o600
    finally:
        made.stop()
        old.stop()


def test_the_nonce_store_makes_its_directory_private(tmp_path: Path) -> None:
    store = NonceStore(tmp_path / "new" / "peers" / "nonces")
    assert store.check_and_add("n" * 24, 2**31) is None
    assert stat.S_IMODE((tmp_path / "new" / "peers").stat().st_mode) == 0o700
    assert json.dumps(stat.S_IMODE((tmp_path / "new" / "peers" / "nonces").stat().st_mode)) == str(0o600)
