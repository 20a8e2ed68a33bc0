"""The agent runs the gateway while `metralectl gateway enable` says so: a real `metralectl agent` process on a box
of the test's own (no Docker), the gateway it starts seen by `metralectl ps`; killed, it is started again; disabled,
it stops; the agent stopping stops it too, and nothing is left listening."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.gateway_client import REPO, box_env
from tests.ports import HeldPort

pytestmark = [pytest.mark.integration]


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=60)


def _gateways(env: dict[str, str]) -> list[dict[str, Any]]:
    out = _cli(env, "ps", "--json")
    assert out.stdout.strip(), out.stderr
    return list(json.loads(out.stdout)["gateways"])


def _until(what: str, check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_the_agent_runs_restarts_and_stops_the_gateway(tmp_path: Path) -> None:
    env = box_env(tmp_path / "box")
    (Path(env["METRALE_HOME"]) / "state" / "processes").mkdir(parents=True)  # a host-process box: `ps` without Docker
    gateway_port, api_port = HeldPort(), HeldPort()  # both bind beside the held sockets
    url = f"http://127.0.0.1:{gateway_port.port}"
    out = _cli(env, "gateway", "enable", "--listen", "0.0.0.0:1")
    assert out.returncode == 64 and "no API key" in out.stderr  # refused here, never in the agent's log
    out = _cli(env, "gateway", "enable", "--listen", f"127.0.0.1:{gateway_port.port}")
    assert out.returncode == 0 and "no agent runs" in out.stderr, out.stderr
    log = open(tmp_path / "agent.log", "wb")
    agent = subprocess.Popen([sys.executable, "-m", "metralectl", "agent", "--port", str(api_port.port), "--no-peer",
                              "--interval", "60", "--no-regroup"], stdout=log, stderr=subprocess.STDOUT, env=env,
                             cwd=REPO)
    try:
        def answering() -> list[dict[str, Any]]:
            return [g for g in _gateways(env) if g["url"] == url and g["answering"]]

        [first] = _until("the agent never started the gateway", answering)
        os.kill(first["pid"], signal.SIGKILL)  # a crash: started again after a pause
        [second] = _until("the gateway was not started again",
                          lambda: [g for g in answering() if g["pid"] != first["pid"]])
        assert _cli(env, "gateway", "disable").returncode == 0
        _until("the disabled gateway kept running", lambda: not _gateways(env))
        assert _cli(env, "gateway", "enable", "--listen", f"127.0.0.1:{gateway_port.port}").returncode == 0
        [third] = _until("the gateway did not come back when enabled again", answering)
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=30)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        log.close()
        gateway_port.close()
        api_port.close()
    said = (tmp_path / "agent.log").read_text()
    assert "gateway started" in said and "exited -9" in said and "Traceback" not in said, said
    assert not _gateways(env)  # the agent stopped its gateway as it stopped
    for pid in (second["pid"], third["pid"]):
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
