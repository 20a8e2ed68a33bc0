"""The CLI sends its agent token only to a listener that proved it holds it (issue 19, item 4).

agent.json can outlive the agent: its pid reused by another process of ours (so "pid alive and ours" holds)
while another user's server has taken the port. These tests put a real impostor on loopback at the
recorded port and show it never receives the token; a relay that forwards the challenge to the real agent
on another port fails too (the proof is bound to the port). And "ours" is the process's owner, not whether
kill() may signal it (root may signal everyone)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from metralectl.agent import security
from metralectl.agent.api import LocalApiServer
from metralectl.app.agent_client import AgentClient, NotOurAgent, running_agent
from metralectl.seams.agent_files import agent_proof, read_state, state_path
from metralectl.seams.process import pid_alive, pid_is_ours
from metralectl.seams.store import write_json

REPO = Path(__file__).resolve().parents[2]


class Impostor(ThreadingHTTPServer):
    """Answers every request 200 with an agent-like JSON body and records what it was sent. With `relay_to`,
    it forwards each GET to that port (the real agent) and answers what the agent answered."""

    daemon_threads = True

    def __init__(self, relay_to: int | None = None) -> None:
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.relay_to = relay_to
        super().__init__(("127.0.0.1", 0), _ImpostorHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _ImpostorHandler(BaseHTTPRequestHandler):
    server: Impostor

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.server.seen.append((self.command, self.path, dict(self.headers.items())))
        body = json.dumps({"version": "9", "fingerprint": "x", "proof": "0" * 64, "id": "run-1", "state": "running",
                           "kind": "run"}).encode()
        status = 202 if self.command == "POST" else 200
        if self.server.relay_to is not None and self.command == "GET":
            conn = http.client.HTTPConnection("127.0.0.1", self.server.relay_to, timeout=5)
            conn.request("GET", self.path, headers={"Host": f"127.0.0.1:{self.server.relay_to}"})
            answer = conn.getresponse()
            status, body = answer.status, answer.read()
            conn.close()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer


@pytest.fixture()
def token(isolated_env: Path) -> str:
    return security.load_or_create_token()


def _record(port: int, pid: int) -> None:
    write_json(state_path(), {"pid": pid, "api_port": port, "peer_port": None, "fingerprint": "x",
                              "started": time.time()}, mode=0o600)


def _no_token_sent(impostor: Impostor, token: str) -> None:
    assert impostor.seen, "the client never reached the impostor (the test would prove nothing)"
    for method, path, headers in impostor.seen:
        assert "Authorization" not in headers, (method, path)
        assert token not in json.dumps(headers) and token not in path
    assert [m for m, _, _ in impostor.seen] == ["GET"]  # only the challenge; no POST followed


def test_a_stale_agent_json_never_hands_the_token_to_another_listener(token: str) -> None:
    impostor = Impostor()
    try:
        _record(impostor.port, os.getpid())  # a live pid of ours: the pid rule alone would trust this
        client = running_agent()
        assert client is not None and client.token == token
        with pytest.raises(NotOurAgent) as refused:
            client.cancel_unit("some-unit")
        _no_token_sent(impostor, token)
        assert "could not prove it holds this box's agent token" in refused.value.message
        assert "the token was not sent" in refused.value.message
        assert int(refused.value.exit_code) == 69
    finally:
        impostor.close()


def test_a_relay_to_the_real_agent_on_another_port_fails_the_proof(token: str) -> None:
    from tests.unit.test_agent_api import FakeOps

    agent = LocalApiServer(FakeOps(), token=token, port=0)
    agent.start("real-agent")
    impostor = Impostor(relay_to=agent.port)
    try:
        with pytest.raises(NotOurAgent):
            AgentClient(impostor.port, token, os.getpid()).cancel_unit("some-unit")
        _no_token_sent(impostor, token)
        assert impostor.seen[0][1].startswith("/api/agent?challenge=")  # it did relay the challenge
    finally:
        impostor.close()
        agent.stop()


def test_the_real_agent_proves_itself_and_the_proof_is_bound_to_token_port_and_challenge(token: str) -> None:
    from tests.unit.test_agent_api import FakeOps

    agent = LocalApiServer(FakeOps(), token=token, port=0)
    agent.start("real-agent")
    try:
        client = AgentClient(agent.port, token, os.getpid())
        client.verify()
        assert client.proven
        conn = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=5)
        challenge = "c" * 24
        conn.request("GET", f"/api/agent?challenge={challenge}", headers={"Host": f"127.0.0.1:{agent.port}"})
        proof = json.loads(conn.getresponse().read())["proof"]
        assert proof == agent_proof(token, agent.port, challenge)
        assert proof not in {agent_proof(token, agent.port + 1, challenge), agent_proof("x" * 43, agent.port, challenge),
                             agent_proof(token, agent.port, "d" * 24)}
        conn.request("GET", "/api/agent?challenge=short", headers={"Host": f"127.0.0.1:{agent.port}"})
        assert conn.getresponse().status == 400  # a malformed challenge is refused, not proven
    finally:
        agent.stop()


def test_the_cli_refuses_in_words_and_sends_nothing(token: str, isolated_env: Path) -> None:
    impostor = Impostor()
    try:
        _record(impostor.port, os.getpid())
        out = subprocess.run([sys.executable, "-m", "metralectl", "peer", "units", "--cancel", "some-unit"],
                             capture_output=True, text=True, cwd=REPO,
                             timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert out.returncode == 69, out.stderr
        assert "could not prove it holds this box's agent token" in out.stderr
        assert "Traceback" not in out.stderr
        _no_token_sent(impostor, token)
    finally:
        impostor.close()


# -- one pid rule: "ours" is the owner -------------------------------------------------------------------------
@pytest.fixture()
def other_users_process() -> Iterator[int]:
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process as another user (EPERM is covered by test_process_seam)")
    proc = subprocess.Popen(["sleep", "60"], user=65534, group=65534, cwd="/")
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_root_does_not_take_another_users_process_for_its_agent(other_users_process: int, token: str) -> None:
    """As root, kill(pid, 0) succeeds for every process; the owner decides (nobody's process is not ours)."""
    assert pid_alive(other_users_process)
    assert not pid_is_ours(other_users_process)
    _record(8897, other_users_process)
    assert read_state() is None and running_agent() is None
