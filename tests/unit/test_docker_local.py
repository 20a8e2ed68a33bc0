"""The Docker client's two transports, on the same fake daemon: the socket reader (reads of a local daemon, so
that `ps` need not import docker-py) and docker-py. The runtime over either must answer alike: the same values,
the same URLs asked, the same errors (cause, message, hint) for the same answers of the daemon.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from metralectl.seams.docker import endpoints, runtime as docker_runtime
from metralectl.seams.docker.client import DaemonClient
from metralectl.seams.docker.endpoints import Endpoint
from metralectl.seams.docker.errors import DockerUnavailable, RuntimeFailure
from metralectl.seams.docker.runtime import DockerRuntime
from tests.unit.recipe_helpers import REPO

CONTAINER = {"Id": "abc123", "Name": "/metralectl-x", "State": {"Status": "running", "StartedAt": "0001-01-01T00:00:00Z"},
             "Config": {"Image": "img:1", "Labels": {"ai.metrale.metralectl.managed": "true"}}}
ANSWERS: dict[str, tuple[int, Any]] = {
    "/version": (200, {"ApiVersion": "1.41", "Version": "20.10.99"}),
    "/v1.41/version": (200, {"ApiVersion": "1.41", "Version": "20.10.99"}),
    "/v1.41/_ping": (200, "OK"),
    "/v1.41/info": (200, {"ID": "X", "Name": "box", "Architecture": "x86_64"}),
    "/v1.41/containers/json": (200, [{"Id": "abc123"}]),
    "/v1.41/containers/abc123/json": (200, CONTAINER),
    "/v1.41/containers/gone/json": (404, {"message": "No such container: gone"}),
    "/v1.41/images/img:1/json": (200, {"Id": "sha256:1", "Architecture": "amd64", "Config": {"Labels": {}}}),
    "/v1.41/images/missing:2/json": (404, {"message": "No such image: missing:2"}),
    "/v1.41/images/busy/json": (500, {"message": "the daemon is busy"}),
}


class FakeDaemon(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str) -> None:
        self.seen: list[str] = []
        self.open: list[socket.socket] = []
        super().__init__(path, _Handler)

    def die(self) -> None:
        """The daemon goes away: no socket file, kept-alive connections cut."""
        self.shutdown()
        self.server_close()
        os.unlink(self.server_address)  # type: ignore[arg-type]
        for conn in self.open:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # kept-alive, as dockerd does
    server: FakeDaemon

    def setup(self) -> None:
        super().setup()
        self.server.open.append(self.connection)

    def do_GET(self) -> None:  # noqa: N802
        self.server.seen.append(self.path)
        status, body = ANSWERS.get(self.path.split("?")[0], (404, {"message": f"page not found: {self.path}"}))
        text = body if isinstance(body, str) else json.dumps(body)
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8" if isinstance(body, str) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def address_string(self) -> str:
        return "local"

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[FakeDaemon]:
    server = FakeDaemon(str(tmp_path / "docker.sock"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def over_docker_py(endpoint: Endpoint, timeout: float | None) -> DaemonClient:
    return DaemonClient(endpoint, timeout, socket_reads=False)


def runtime_over(path: str, use_docker_py: bool) -> DockerRuntime:
    with pytest.MonkeyPatch.context() as patch:
        if use_docker_py:
            patch.setattr(docker_runtime, "connect", over_docker_py)
        return DockerRuntime(Endpoint(f"unix://{path}", "DOCKER_HOST"))


def outcome(call: Any) -> tuple[str, Any]:
    try:
        return "value", call()
    except Exception as exc:  # noqa: BLE001 - the comparison is the point
        return type(exc).__name__, (str(getattr(exc, "cause", None)), str(exc), getattr(exc, "hint", None))


def test_reads_answer_and_fail_as_over_docker_py(daemon: FakeDaemon) -> None:
    ours, theirs = runtime_over(daemon.server_address, False), runtime_over(daemon.server_address, True)  # type: ignore[arg-type]
    assert ours.api._reader is not None and theirs.api._reader is None
    calls = [lambda rt: rt.server_version(), lambda rt: rt.info(), lambda rt: rt.daemon_identity(),
             lambda rt: rt.containers(), lambda rt: rt.containers(mine=False, all_states=False),
             lambda rt: rt.inspect("abc123"), lambda rt: rt.inspect("gone"),
             lambda rt: rt.image_state("img:1"), lambda rt: rt.image_state("missing:2"),
             lambda rt: rt.image_state("busy"), lambda rt: rt.image_record("missing:2")]
    for call in calls:
        daemon.seen.clear()
        mine = outcome(lambda: call(ours))
        asked_by_us = list(daemon.seen)
        daemon.seen.clear()
        assert mine == outcome(lambda: call(theirs))
        assert asked_by_us[-1] == daemon.seen[-1]  # the same URL, query string included
    assert ours.api._docker is None  # every read went over the socket
    assert outcome(lambda: ours.image_state("busy"))[0] == "RuntimeFailure"
    assert ours.inspect("gone") is None and ours.image_state("missing:2").present is False
    ours.close()
    theirs.close()


def test_the_runtime_over_the_socket(daemon: FakeDaemon) -> None:
    runtime = DockerRuntime(Endpoint(f"unix://{daemon.server_address}", "DOCKER_HOST"))
    assert [c.name for c in runtime.containers(mine=False)] == ["metralectl-x"]
    assert runtime.inspect("gone") is None
    assert runtime.image_state("missing:2").present is False and runtime.image_state("img:1").present
    with pytest.raises(RuntimeFailure, match="Docker refused: the daemon is busy"):
        runtime.image_state("busy")
    assert runtime.server_version() == "20.10.99"
    runtime.close()


def test_what_the_socket_does_not_carry_goes_to_docker_py(daemon: FakeDaemon) -> None:
    client = DaemonClient(Endpoint(f"unix://{daemon.server_address}", "DOCKER_HOST"), 7)
    assert client.ping() and client._docker is None
    with pytest.raises(Exception) as refused:  # the fake daemon has no image list: its 404, as ours
        client.images()
    assert type(refused.value).__name__ == "Refused" and refused.value.status == 404  # type: ignore[attr-defined]
    assert client._docker is not None and client._docker.timeout == 7
    client.timeout = 9
    assert client._docker.timeout == 9
    client.close()


def test_threads_first_calls_build_one_docker_py_client(daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    """`top` and the dashboard share one runtime across threads (seams/docker/shared): two first calls at once
    must not each build a docker-py client (the second would leak its connection pool)."""
    import docker

    made: list[int] = []
    second_call = threading.Event()

    class Real:
        timeout: float | None = None

        def images(self) -> list[str]:
            return ["from docker-py"]

    def make(**_: Any) -> Real:
        made.append(1)
        second_call.wait(1.0)  # the first build stays open long enough for the other thread to arrive
        return Real()

    monkeypatch.setattr(docker, "APIClient", make)
    client = DaemonClient(Endpoint(f"unix://{daemon.server_address}", "DOCKER_HOST"), 7)
    answers: list[list[Any]] = []

    def call() -> None:
        answers.append(client.images())

    first = threading.Thread(target=call)
    first.start()
    while not made:
        threading.Event().wait(0.001)
    second = threading.Thread(target=call)
    second.start()
    second.join(0.3)  # it is waiting for the first build (the lock), not building its own
    second_call.set()
    first.join(5)
    second.join(5)
    assert answers == [["from docker-py"]] * 2 and made == [1], made


def unreachable(endpoint: Endpoint, use_docker_py: bool) -> tuple[str, str, str]:
    with pytest.MonkeyPatch.context() as patch:
        if use_docker_py:
            patch.setattr(docker_runtime, "connect", over_docker_py)
        try:
            DockerRuntime(endpoint)
        except DockerUnavailable as exc:
            return exc.cause, exc.message, exc.hint or ""
    raise AssertionError("connected")


def test_an_unreachable_socket_is_classified_as_with_docker_py(tmp_path: Path) -> None:
    missing = Endpoint(f"unix://{tmp_path}/none.sock", "DOCKER_HOST")
    assert unreachable(missing, False) == unreachable(missing, True)
    assert unreachable(missing, False)[0] == "not-running"
    deaf = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deaf.bind(str(tmp_path / "deaf.sock"))  # bound, never listening: connections are refused
    refused = Endpoint(f"unix://{tmp_path}/deaf.sock", "DOCKER_HOST")
    assert unreachable(refused, False) == unreachable(refused, True)
    assert unreachable(refused, False)[0] == "not-running"
    deaf.close()


@pytest.mark.parametrize("use_docker_py", [False, True])
def test_a_daemon_lost_mid_way_is_classified_alike(tmp_path: Path, use_docker_py: bool) -> None:
    daemon = FakeDaemon(str(tmp_path / "docker.sock"))
    threading.Thread(target=daemon.serve_forever, daemon=True).start()
    runtime = runtime_over(daemon.server_address, use_docker_py)  # type: ignore[arg-type]
    daemon.die()
    with pytest.raises(DockerUnavailable) as lost:
        runtime.containers()
    assert (lost.value.cause, lost.value.message) == (
        "not-running", f"nothing listens at DOCKER_HOST=unix://{tmp_path}/docker.sock (no socket at {tmp_path}/docker.sock)")


def test_the_current_context_as_docker_pys_context_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    from docker.context import ContextAPI

    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    config = tmp_path / "dockercfg"
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    assert endpoints.resolve_endpoint().source == "default"  # no config file at all
    config.mkdir()
    (config / "config.json").write_text(json.dumps({"currentContext": "node2"}))
    meta = config / "contexts" / "meta" / hashlib.sha256(b"node2").hexdigest()
    meta.mkdir(parents=True)
    (meta / "meta.json").write_text(json.dumps({"Name": "node2", "Metadata": {},
                                                "Endpoints": {"docker": {"Host": "ssh://op@node2"}}}))
    ours = endpoints.resolve_endpoint()
    theirs = ContextAPI.get_current_context()
    assert (ours.url, ours.source) == (theirs.Host, f"context {theirs.name}") == ("ssh://op@node2", "context node2")
    (config / "config.json").write_text("not json")
    assert endpoints.resolve_endpoint().source == "default"


def test_ps_imports_no_docker_py(daemon: FakeDaemon) -> None:
    code = ("import sys\nfrom metralectl.cli.main import main\n"
            "try:\n    main(['ps'])\nexcept SystemExit as exc:\n    print('EXIT', exc.code or 0, file=sys.stderr)\n"
            "print('LOADED=' + ','.join(m for m in ('docker', 'requests', 'paramiko', 'httpx')"
            " if m in sys.modules), file=sys.stderr)\n")
    env = {**os.environ, "DOCKER_HOST": f"unix://{daemon.server_address}"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert "EXIT 0" in out.stderr and "LOADED=\n" in out.stderr, out.stderr
    assert "metralectl-x" in out.stdout  # the fake daemon's container, read without docker-py


@pytest.mark.parametrize("args", [["ps"], ["ps", "--json"], ["ps", "--json", "--repair"], ["ps", "--bogus"]])
def test_ps_on_the_fake_daemon_and_with_none(daemon: FakeDaemon, tmp_path: Path, args: list[str]) -> None:
    """On the fake daemon `ps` (--json, --repair) lists its container; with no daemon listening it says so and exits
    UNAVAILABLE; a bad option is USAGE either way."""
    from metralectl.errors import ExitCode

    for host in (f"unix://{daemon.server_address}", f"unix://{tmp_path}/nobody.sock"):
        env = {**os.environ, "DOCKER_HOST": host}
        out = subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, cwd=REPO,
                             env=env, timeout=120)
        assert "Traceback" not in out.stderr, out.stderr
        if "--bogus" in args:
            assert out.returncode == ExitCode.USAGE and "No such option" in out.stderr and out.stdout == ""
        elif host.endswith("nobody.sock"):
            assert out.returncode == ExitCode.UNAVAILABLE and "nothing listens at DOCKER_HOST" in out.stderr
            assert out.stdout == ""
        else:
            assert out.returncode == ExitCode.OK and "metralectl-x" in out.stdout, out.stderr
