"""Every test owns the ports it uses from the moment it chooses them (tests/ports.py).

The rule: nowhere under tests/ or benchmarks/ is a port chosen by binding port 0, reading the number, and
releasing the socket before the number is used ("free then bind": on a busy machine another program takes the
port in between; a fresh-clone CI run lost 2 of 1874 tests so). And the held port does what the tests rely on:
nobody else can bind it, a connection to it is refused, a server that sets SO_REUSEADDR listens on it, and
metralectl's own probe calls it free while nothing listens there.
"""

from __future__ import annotations

import errno
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from metralectl.seams.ports import bind_error, port_free
from tests.ports import HeldPort, PortTaken, own_port, port_in_use, run_lost_its_port, start_retrying
from tests.unit.port_scan import scan_python, scan_shell, scan_tree

REPO = Path(__file__).resolve().parents[2]
# (path, function) → why its number may outlive its socket
ALLOWED = {
    ("tests/ports.py", "pick_port"): "only start_retrying calls it: a start that lost its port to another program "
                                     "is tried again on a fresh one",
    ("tests/realengines/transformers_serve.py", "pick_port"): "start() tries again when uvicorn says 'address "
                                                              "already in use' (standard library only: the H200 "
                                                              "kit runs it without the tests package)",
    ("benchmarks/h200/run_llamacpp_cuda.sh", "<shell>"): "the start is tried again when llama-server says "
                                                         "\"couldn't bind HTTP server socket\"",
}


def test_no_test_or_benchmark_frees_a_port_and_binds_it_later() -> None:
    found = [f for f in scan_tree(REPO / "tests", REPO / "benchmarks", base=REPO) if (f.path, f.where) not in ALLOWED]
    assert not found, ("a port chosen, released, then used: hold it instead (tests/ports.py: own_port / HeldPort), "
                       "or retry the start on port-in-use (pick_port + start_retrying)\n"
                       + "\n".join(map(str, found)))


def test_every_allowance_is_still_needed() -> None:
    found = {(f.path, f.where) for f in scan_tree(REPO / "tests", REPO / "benchmarks", base=REPO)}
    assert set(ALLOWED) <= found, set(ALLOWED) - found


# --- the scanner catches the shapes the pattern takes ---------------------------------------------------------
CAUGHT = {
    "returned from the with block": '''
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
''',
    "returned after an explicit close": '''
def free_port():
    s = socket.socket()
    s.bind(("", 0))
    port = s.getsockname()[1]
    s.close()
    return port
''',
    "used after the block": '''
def test_dead():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
''',
    "a text made from it, used after the block": '''
def test_dead():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
    get(url)
''',
    "kept on an object": '''
class Server:
    def __init__(self):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
''',
    "a listener closed, its number used": '''
def test_freed():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
    assert port_free("127.0.0.1", port)
''',
}
PASSED = {
    "used while held": '''
def test_dead():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        out = run(f"http://127.0.0.1:{probe.getsockname()[1]}")
    assert out.returncode == 1
''',
    "held by the caller": '''
def hold():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s, s.getsockname()[1]
''',
    "a source port for a connection": '''
def connect_from(source):
    with socket.socket() as s:
        s.bind((source, 0))
        s.connect(("127.0.0.1", 80))
        s.sendall(b"x")
''',
}


@pytest.mark.parametrize("shape", list(CAUGHT))
def test_the_scanner_catches(shape: str) -> None:
    assert scan_python(CAUGHT[shape], "x.py"), shape


@pytest.mark.parametrize("shape", list(PASSED))
def test_the_scanner_lets_pass(shape: str) -> None:
    assert scan_python(PASSED[shape], "x.py") == [], shape


def test_the_scanner_reads_shell_one_liners() -> None:
    line = """PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"""
    assert scan_shell(line, "x.sh") and scan_shell("PORT=$(pick_port)", "x.sh") == []


# --- what a held port guarantees ------------------------------------------------------------------------------
def test_nobody_else_can_bind_a_held_port_and_connections_to_it_are_refused() -> None:
    with HeldPort() as held:
        with socket.socket() as other, pytest.raises(OSError) as taken:
            other.bind(("127.0.0.1", held.port))  # a program that did not opt in to sharing (most clients)
        assert taken.value.errno == errno.EADDRINUSE
        with pytest.raises(httpx.ConnectError):
            httpx.get(held.url, timeout=2)


def test_a_server_listens_on_a_held_port_and_metralectl_sees_it_free_before_and_after() -> None:
    class Hello(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with HeldPort() as held:
        assert port_free("127.0.0.1", held.port)  # `metralectl run` would go ahead
        server = ThreadingHTTPServer(("127.0.0.1", held.port), Hello)  # SO_REUSEADDR, as servers set it
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        try:
            assert httpx.get(held.url, timeout=5).status_code == 204
            assert not port_free("127.0.0.1", held.port)
        finally:
            server.shutdown()
            server.server_close()
        assert bind_error("127.0.0.1", held.port) is None  # free for the next server, and still ours
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", held.port))


def test_own_port_holds_until_the_test_ends() -> None:
    port = own_port()
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", port))


def test_a_start_that_lost_its_port_is_tried_again_on_another() -> None:
    tried: list[int] = []

    def start(port: int) -> int:
        tried.append(port)
        if len(tried) < 3:
            raise PortTaken(f"port {port}")
        return port

    assert start_retrying(start) == tried[-1] and len(tried) == 3

    def never(port: int) -> int:
        tried.append(port)
        raise PortTaken(f"port {port}")

    tried.clear()
    with pytest.raises(PortTaken):
        start_retrying(never, attempts=2)
    assert len(tried) == 2  # bounded: the second loss is the test's failure


@pytest.mark.parametrize("engine,line,taken", [
    ("llama-cpp", "0.00.005.510 E srv         start: couldn't bind HTTP server socket, hostname: 127.0.0.1, "
                  "port: 8080", True),
    ("metrale", "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): address "
                "already in use", True),
    ("llama-cpp", "0.00.006.933 E srv  llama_server: exiting due to model loading error", False),
])
def test_port_in_use_is_the_products_reading_of_engine_logs(engine: str, line: str, taken: bool) -> None:
    assert port_in_use(line, engine) is taken


def test_a_run_that_lost_its_port_is_known_by_metralectls_own_words() -> None:
    from metralectl.core.render import ContainerSpec
    from metralectl.lifecycle.boot import REMEDIES, Diagnosis
    from metralectl.lifecycle.launch import LaunchFailed
    from metralectl.lifecycle.preflight import port_refusal

    def failed(cause: str) -> str:
        return "metralectl: " + LaunchFailed(Diagnosis(cause, "…", REMEDIES.get(cause, "")), [], "/x.log").message

    refusal = port_refusal(ContainerSpec(name="x", image="i", command=(), port=8080), False, [])
    assert refusal is not None and run_lost_its_port(f"metralectl: {refusal.error.message}")
    assert run_lost_its_port(failed("port-in-use"))
    assert not run_lost_its_port(failed("out-of-memory")) and not run_lost_its_port(failed("exited"))
