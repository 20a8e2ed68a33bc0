"""Nothing grows without bound on what a server sends (issue 27, class 6). Real servers on 127.0.0.1 send an
SSE event that never ends, a line that never ends, a body that never ends; each reader fails clearly (or, where
only the first characters matter, reads no further) and stops reading: the server counts what it got out
before the client closed the connection, which is at most the cap plus what the kernel buffers on loopback
(a few MiB), never the endless rest."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metralectl.bench.results import analyse
from metralectl.bench.sse import RawResponse
from metralectl.bench.transport import make_transport
from metralectl.errors import ExitCode, MetralError
from metralectl.seams.endpoint import EngineClient, health_once
from tests.unit.endless_server import MiB, endless

REPO = Path(__file__).resolve().parents[2]
SLACK = 16 * MiB  # loopback's socket buffers (and one read in flight) on top of a reader's cap
# the caps, as docs/bench.md, docs/serving.md and docs/security.md state them (sse.EVENT_LIMIT, seams/bounded.py)
EVENT, CONTROL, METRICS, LINE, PEEK = 1 * MiB, 4 * MiB, 16 * MiB, 1 * MiB, 64 * 1024


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _one_line_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("metralectl: ")]
    assert len(lines) == 1 and "Traceback" not in stderr and "internal error" not in stderr, stderr
    return lines[0]


def _bounded(state: object, path: str, cap: int) -> None:
    assert state.ended.wait(60), "the client never closed the connection"  # type: ignore[attr-defined]
    assert state.sent.get(path, 0) <= cap + SLACK, state.sent  # type: ignore[attr-defined]


@pytest.mark.parametrize("transport", ["raw", "raw-nostamp", "httpx"])
def test_a_benchmark_request_whose_event_never_ends_fails_as_oversize(transport: str) -> None:
    with endless({"/v1/chat/completions": "event"}) as (url, state):
        async def one() -> RawResponse:
            client = make_transport(transport, url, "/v1/chat/completions", 1)
            await client.open(0)
            try:
                return await client.stream(b'{"stream": true}', 60.0)
            finally:
                await client.close()

        raw = asyncio.run(one())
        _bounded(state, "/v1/chat/completions", EVENT)
    assert raw.end == "oversize" and "without its end" in (raw.error or "")
    assert sum(len(p) for _, p in raw.pieces) <= EVENT + 512 * 1024  # what was kept: one read past it
    result = analyse(raw, index=0, worker=0, phase="measure")
    assert not result.ok and result.error_kind == "oversize"


def test_bench_run_counts_them_failed_and_says_so(isolated_env: Path) -> None:
    with endless({"/v1/chat/completions": "event"}) as (url, state):
        out = _cli("bench", "run", "decode", "--url", url, "-p", "repeats=2", "-p", "warmup=0", "-p", "max_tokens=4",
                   "-p", "client_bound=warn", "-p", "dialect=full", "-p", "timeout_s=30", "--format", "json")
        _bounded(state, "/v1/chat/completions", EVENT)
    assert out.returncode == ExitCode.FAILED, out.stderr
    record = json.loads(out.stdout)
    assert record["status"] == "errors" and "oversize ×2" in record["error"]
    assert "oversize ×2" in out.stderr


def test_bench_s_probe_request_says_so_too(isolated_env: Path) -> None:
    with endless({"/v1/chat/completions": "event"}) as (url, state):
        out = _cli("bench", "run", "decode", "--url", url, "-p", "repeats=1", "-p", "warmup=0", "-p", "dialect=probe",
                   "-p", "timeout_s=30")
        _bounded(state, "/v1/chat/completions", EVENT)
    assert out.returncode == ExitCode.FAILED
    assert "went past 1 MiB without its end" in _one_line_error(out.stderr)


def test_chat_whose_event_never_ends_exits_65() -> None:
    with endless({"/v1/chat/completions": "event"}) as (url, state):
        out = _cli("chat", "--url", url, "hello")
        _bounded(state, "/v1/chat/completions", EVENT)
    assert out.returncode == ExitCode.DATA
    assert "went past 1 MiB without its end" in _one_line_error(out.stderr)


@pytest.mark.parametrize("status", [500, 200])
def test_chat_models_and_error_bodies_are_read_to_their_caps(status: int) -> None:
    """/v1/models without end: no model named (the request goes on); an HTTP error whose body never ends: its
    first characters quoted; a 200 whose body is no SSE and never ends: cut as one endless event."""
    routes = {"/v1/models": "body", "/v1/chat/completions": "body"}
    with endless(routes, status=status) as (url, state):
        out = _cli("chat", "--url", url, "hello")
        _bounded(state, "/v1/models", CONTROL)
        _bounded(state, "/v1/chat/completions", EVENT)
    line = _one_line_error(out.stderr)
    if status == 500:
        assert out.returncode == ExitCode.FAILED and "HTTP 500" in line and len(line) < 600
    else:
        assert out.returncode == ExitCode.DATA and "without its end" in line


def test_the_engine_s_control_answers_are_capped() -> None:
    routes = {"/health": "body", "/v1/models": "body", "/metrics": "body"}
    with endless(routes) as (url, state):
        answer = health_once(url, timeout=30)  # `ps`'s probe (http.client)
        assert answer.status == 200 and len(answer.body) == 500
        with EngineClient(url, timeout=30) as client:
            assert client.health().status == 200 and len(client.health().body) == 500
            assert client.served_model() is None  # more than a list of models: not read as one
            with pytest.raises(MetralError, match="sent more than 16 MiB"):
                client.metrics_text()
        _bounded(state, "/v1/models", CONTROL)
        assert state.sent["/health"] <= PEEK + SLACK
        assert state.sent["/metrics"] <= METRICS + SLACK


def test_top_shows_an_endless_metrics_answer_as_the_engine_s_error() -> None:
    with endless({"/metrics": "body"}) as (url, state):
        out = _cli("top", "--once", "--json", "--interval", "0.2", "--url", url)
        _bounded(state, "/metrics", METRICS)
    assert out.returncode == 0, out.stderr
    (engine,) = json.loads(out.stdout)["engines"]
    assert "sent more than 16 MiB" in json.dumps(engine)


def test_a_peer_s_endless_answer_and_endless_line(tmp_path: Path) -> None:
    from metralectl.peers.address import PeerAddress
    from metralectl.peers.client import _send, open_stream

    with endless({"/peer/v1/identity": "body", "/peer/v1/units/k/events": "line"}) as (url, state):
        addr = PeerAddress("127.0.0.1", int(url.rsplit(":", 1)[1]))
        with pytest.raises(MetralError, match="sent more than 4 MiB") as caught:
            _send(addr, "GET", "/peer/v1/identity", b"", {}, 60)
        assert caught.value.exit_code == ExitCode.DATA
        with pytest.raises(MetralError, match="one line"):
            with open_stream(addr, "/peer/v1/units/k/events", {}, read_timeout=60) as stream:
                list(stream.lines)
        _bounded(state, "/peer/v1/identity", CONTROL)
        assert state.sent["/peer/v1/units/k/events"] <= LINE + SLACK


def test_the_agent_s_endless_answer(isolated_env: Path) -> None:
    """A process on the port agent.json records answers the CLI's challenge without end: the command says so
    (exit 65), and doctor's look at the agent reports it, both having read no more than the cap."""
    from metralectl.app.agent_client import AgentClient
    from metralectl.seams.agent_files import load_or_create_token

    with endless({"/api/agent": "body", "/api/status": "body"}) as (url, state):
        port = int(url.rsplit(":", 1)[1])
        client = AgentClient(port, load_or_create_token(), os.getpid())
        with pytest.raises(MetralError, match="sent more than 4 MiB"):
            client.verify()
        _bounded(state, "/api/agent", CONTROL)
        from metralectl.seams.agent_files import state_path
        state_path().write_text(json.dumps({"pid": os.getpid(), "api_port": port}))
        from metralectl.doctor.context import _default_agent_view

        view = _default_agent_view()
        assert view is not None and "sent more than 4 MiB" in view["error"]
        assert state.sent["/api/status"] <= CONTROL + SLACK


@pytest.mark.parametrize("seed", range(20))
def test_the_open_event_is_measured_across_any_split_of_the_reads(seed: int) -> None:
    """RawResponse.keep sees the body in whatever pieces the socket gave: a blank line split between two reads
    ("\\n" | "\\n", "\\r\\n\\r" | "\\n") still ends the event, so events under the cap are never cut; one over it is."""
    import random

    rng = random.Random(seed)
    limit = 64
    events = [b"data: " + b"x" * rng.randrange(0, limit - 10) + rng.choice([b"\n\n", b"\r\n\r\n"]) for _ in range(200)]
    body = b"".join(events)
    for over in (False, True):
        data = body + (b"data: " + b"y" * (limit + 1) if over else b"")
        raw, at, cut = RawResponse(0, status=200), 0, None
        while at < len(data) and cut is None:
            step = rng.randrange(1, 9)
            cut = raw.keep(0, data[at:at + step], event_limit=limit)
            at += step
        assert (cut is not None) == over, (seed, at, cut)


class _EndlessDaemon:
    """A unix socket that answers GET /version as Docker does and every other GET with a JSON body without end
    (no length, chunks until the client leaves): what the fast Docker transport reads must stay bounded."""

    def __init__(self, path: Path) -> None:
        import socket
        import threading

        self.path, self.sent, self.ended = path, 0, threading.Event()
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: object) -> None:
        import socket

        assert isinstance(conn, socket.socket)
        with conn:
            while True:
                head = b""
                while b"\r\n\r\n" not in head:
                    piece = conn.recv(4096)
                    if not piece:
                        return
                    head += piece
                path = head.split(b" ", 2)[1].decode()
                if path.startswith("/version"):
                    body = json.dumps({"ApiVersion": "1.41", "Version": "20.10.24"}).encode()
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(body), body))
                    continue
                try:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n[")
                    while True:
                        conn.sendall(b'{"Id": "x"},' * 4096)
                        self.sent += 12 * 4096
                except OSError:  # the client closed it: it stopped reading
                    self.ended.set()
                return

    def close(self) -> None:
        self.server.close()


def test_a_docker_socket_whose_answer_never_ends_is_read_to_a_cap(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from metralectl.seams.docker import transport

    monkeypatch.setattr(transport, "ANSWER_CAP", 2 * MiB)
    daemon = _EndlessDaemon(tmp_path / "docker.sock")
    try:
        reader = transport.SocketReader(f"unix://{daemon.path}", 30)
        with pytest.raises(transport.AnswerTooLarge, match="over 2 MiB"):
            reader.get("/containers/json", {"all": True})
        reader.close()
        assert daemon.ended.wait(30), "the reader never closed the connection"
        assert daemon.sent <= 2 * MiB + SLACK
    finally:
        daemon.close()


def test_ps_against_a_socket_whose_answer_never_ends_exits_69_saying_so(tmp_path: Path) -> None:
    # the whole cap (64 MiB) crosses the socket here: a second or so
    daemon = _EndlessDaemon(tmp_path / "docker.sock")
    try:
        out = subprocess.run([sys.executable, "-m", "metralectl", "ps"], capture_output=True, text=True, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1",
                                  "DOCKER_HOST": f"unix://{daemon.path}", "HOME": str(tmp_path)},
                             timeout=240, stdin=subprocess.DEVNULL)
        assert daemon.ended.wait(30), "ps never closed the connection"
        assert daemon.sent <= 64 * MiB + SLACK
    finally:
        daemon.close()
    assert out.returncode == ExitCode.UNAVAILABLE, (out.returncode, out.stderr)
    assert "sent more than 64 MiB for GET" in _one_line_error(out.stderr)
