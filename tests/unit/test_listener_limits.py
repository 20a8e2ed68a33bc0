"""The peer listener cannot be exhausted by idle connections, and the local API keeps answering while it is
flooded (issue 19, item 2). Real servers on loopback; the flood comes from other loopback addresses
(127.0.0.x), so per-source caps are exercised without leaving the machine.

Each test asserts outcomes (how many connections are held, which were answered 503, that the local API
answered, that a trickling client was cut off before it finished) with generous bounds, not latencies."""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from metralectl.agent.api import LocalApiServer
from metralectl.peers.listener import MAX_CONNECTIONS, MAX_PER_SOURCE, PeerHandler
from metralectl.seams.httpserve import REQUEST_QUEUE
from tests.unit.peer_fixtures import Box, client
from tests.unit.test_agent_api import TOKEN, FakeOps

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def box(tmp_path: Path) -> Iterator[Box]:
    made = Box(tmp_path, "b")
    yield made
    made.stop()


def _idle(port: int, source: str, count: int) -> list[socket.socket]:
    """`count` connections from `source` that never send anything."""
    made = []
    for _ in range(count):
        sock = socket.socket()
        sock.settimeout(10)
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
        made.append(sock)
    return made


def _eventually(condition: Callable[[], bool], timeout: float = 15.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def _turned_away(sock: socket.socket) -> bool:
    """The server answered 503 and closed (what it does beyond a cap), rather than holding the connection."""
    sock.settimeout(10)
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return data.startswith(b"HTTP/1.1 503")


def _readable(socks: list[socket.socket]) -> list[socket.socket]:
    """Those the server has answered or closed (poll: no FD_SETSIZE limit)."""
    poller = select.poll()
    by_fd = {s.fileno(): s for s in socks}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    return [by_fd[fd] for fd, _ in poller.poll(0)]


def _close(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()


def _identity(box: Box, source: str) -> int:
    with client(source) as http:
        return http.get(f"http://{box.addr}/peer/v1/identity?challenge={'c' * 24}").status_code


def test_one_source_gets_at_most_its_share(box: Box) -> None:
    extra = 10
    flood = _idle(box.server.port, "127.0.0.2", MAX_PER_SOURCE + extra)
    try:
        assert _eventually(lambda: box.server.turned_away == extra), box.server.turned_away
        assert box.server.open_connections() == MAX_PER_SOURCE
        held, refused = flood[:MAX_PER_SOURCE], flood[MAX_PER_SOURCE:]
        assert all(_turned_away(s) for s in refused)  # the later ones: 503 and closed at once
        assert _identity(box, "127.0.0.1") == 200  # another source is answered meanwhile
        assert _identity(box, "127.0.0.2") == 503  # the flooding source is not
        _close(held)
        assert _eventually(lambda: box.server.open_connections() == 0)  # each slot is given back
        assert _identity(box, "127.0.0.2") == 200
    finally:
        _close(flood)


def test_the_local_api_answers_while_the_peer_port_is_flooded(box: Box) -> None:
    """Twelve sources, each within its own share, together past the listener's cap."""
    api = LocalApiServer(FakeOps(), token=TOKEN, port=0)
    api.start("api")
    flood: list[socket.socket] = []
    try:
        sources = [f"127.0.0.{10 + i}" for i in range(12)]
        for source in sources:
            flood += _idle(box.server.port, source, MAX_PER_SOURCE)
        over = len(flood) - MAX_CONNECTIONS
        assert over > 0
        assert _eventually(lambda: box.server.turned_away == over), box.server.turned_away
        assert box.server.open_connections() == MAX_CONNECTIONS
        answer = httpx.get(f"http://127.0.0.1:{api.port}/api/status", timeout=10, trust_env=False)
        assert answer.status_code == 200 and answer.json()["summary"] == "fake"
        assert _identity(box, "127.0.0.99") == 503  # full: a newcomer is told so at once, not left waiting
    finally:
        _close(flood)
        api.stop()


def test_a_trickling_client_is_cut_off_at_the_request_deadline(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    """One byte every 0.2 s keeps every single read within the idle timeout; the deadline for the whole
    request ends it anyway (before, a client could hold a connection for ever this way)."""
    monkeypatch.setattr(PeerHandler, "request_deadline_s", 1.0)
    request = b"GET /peer/v1/identity?challenge=" + b"c" * 24 + b" HTTP/1.1\r\nX-Slow: " + b"x" * 200
    with socket.create_connection(("127.0.0.1", box.server.port), timeout=10) as sock:
        sent = 0
        closed = False
        for byte in request:
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            sent += 1
            if select.select([sock], [], [], 0.2)[0]:  # readable: the server answered or closed
                closed = True
                break
        assert closed, "the server still held the connection after the whole trickle"
        assert sent < len(request)  # cut off while still sending
    assert _eventually(lambda: box.server.open_connections() == 0)


def test_the_listen_backlog_is_raised(box: Box) -> None:
    assert box.server.request_queue_size == REQUEST_QUEUE >= 128
    ss = subprocess.run(["ss", "-ltnH", f"sport = :{box.server.port}"], capture_output=True, text=True)
    if ss.returncode == 0 and ss.stdout.strip():  # a listening socket's Send-Q is its backlog
        assert int(ss.stdout.split()[2]) >= 128, ss.stdout


# -- descriptors: in child processes (they change their own limits) -----------------------------------------------
def _child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.unit.flood_children", *args], cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _line(proc: subprocess.Popen[str]) -> dict[str, object]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"the child said nothing: {proc.stderr.read() if proc.stderr else ''}")
    return dict(json.loads(line))


def test_out_of_descriptors_the_agent_still_answers_locally(tmp_path: Path) -> None:
    """A real agent started with a soft limit of 100 descriptors and a hard one of 200: it raises its soft
    limit to 200 itself; then 300 connections to its peer port. Without a cap the peer listener takes every
    descriptor and the local API cannot accept until idle peers time out; with it the peer listener holds
    MAX_CONNECTIONS, answers the rest 503 at once, and the local API answers while those are still held."""
    proc = _child("agent", str(tmp_path / "agent"), "200")
    flood: list[socket.socket] = []
    try:
        ports = _line(proc)
        assert ports["soft"] == 200  # raised at start
        for i in range(30):
            flood += _idle(int(str(ports["peer"])), f"127.0.0.{20 + i}", 10)
        over = len(flood) - MAX_CONNECTIONS
        assert _eventually(lambda: len(_readable(flood)) == over), len(_readable(flood))  # 503 and closed
        answer = httpx.get(f"http://127.0.0.1:{ports['api']}/api/status", timeout=10, trust_env=False)
        assert answer.status_code == 200, answer.text
        assert len(_readable(flood)) == over  # answered while the peer listener still held its MAX_CONNECTIONS
    finally:
        _close(flood)
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    assert json.loads(proc.stdout.read() if proc.stdout else "{}")["turned_away"] == over


def test_out_of_descriptors_the_accept_loop_backs_off_and_recovers() -> None:
    """accept() failing with EMFILE leaves the socket readable; retrying at once spins a core (tens of
    thousands of attempts in two seconds). The server pauses instead, and serves again once descriptors
    are back."""
    proc = _child("starved")
    assert proc.stdin is not None
    try:
        port = int(str(_line(proc)["port"]))
        waiting = _idle(port, "127.0.0.1", 3)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = _line(proc)
        assert int(str(result["fillers"])) > 0
        assert int(str(result["attempts_while_starved"])) < 100, result
        waiting[0].sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        waiting[0].settimeout(10)
        assert waiting[0].recv(100).startswith(b"HTTP/1."), "not served after the descriptors came back"
        _close(waiting)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert "cannot accept a connection" in stderr and "pausing" in stderr  # said once, not per attempt
    assert stderr.count("cannot accept a connection") <= 2


def test_the_agent_raises_its_soft_descriptor_limit() -> None:
    proc = _child("raise")
    result = _line(proc)
    proc.wait(timeout=30)
    assert result["before"] == 64
    assert result["now"] == result["after"] == min(int(str(result["hard"])), 1 << 20) > 64
