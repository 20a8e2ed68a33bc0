"""One kept Docker connection, on the real daemon: the dashboard's status polls and `top`'s engine discovery
reach the daemon through a unix-socket relay of the test's own, which counts the connections it accepts
and can be stopped and started again — a daemon restart as our client sees it, without restarting the
daemon other tests share. Read-only on the daemon (container listings)."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from metralectl.seams.docker.errors import DockerUnavailable
pytestmark = pytest.mark.usefixtures("docker_daemon")
DAEMON = "/var/run/docker.sock"


class Relay:
    """Accepts on `path`, relays each connection byte for byte to the daemon; counts what it accepted."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.accepted = 0
        self.open: list[socket.socket] = []
        path.unlink(missing_ok=True)
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(str(path))
        self.server.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return  # stopped
            self.accepted += 1
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(DAEMON)
            self.open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def stop(self) -> None:
        """The 'daemon' goes: nothing listens, every relayed connection is cut."""
        self.server.close()
        self.path.unlink(missing_ok=True)
        for s in self.open:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass


@pytest.fixture()
def relay_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if not os.path.exists(DAEMON):
        pytest.skip(f"the daemon is not at {DAEMON}")
    path = tmp_path / "docker.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)
    return path


def test_dashboard_polls_over_one_connection_and_reconnects_after_a_restart(relay_path: Path) -> None:
    from metralectl.tui.core_services import CoreServices

    relay = Relay(relay_path)
    services = CoreServices(bench=object())  # type: ignore[arg-type]
    for _ in range(5):
        services.status()
    assert relay.accepted == 1, f"5 status polls opened {relay.accepted} connections to the daemon"

    relay.stop()
    with pytest.raises(DockerUnavailable):
        services.status()  # said to the operator (the card shows it), and the dead connection dropped
    relay = Relay(relay_path)
    for _ in range(5):
        services.status()
    assert relay.accepted == 1  # one new connection once the daemon is back, kept again
    services.close()


def test_top_discovers_over_one_connection(relay_path: Path) -> None:
    from metralectl.cli.top_cmd import _session

    relay = Relay(relay_path)
    session = _session(1.0, [])  # what `metralectl top` builds without --url
    for _ in range(5):
        targets, note = session.poller._discover()
        assert note is None or "no engine" in note  # other tests may serve something meanwhile: either is fine
    assert relay.accepted == 1, f"5 discovery rounds opened {relay.accepted} connections to the daemon"
    session.close()
