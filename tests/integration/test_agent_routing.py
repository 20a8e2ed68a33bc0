"""`metralectl run/swap/stop` through a running agent (a real `metralectl agent` process), on a real Docker
daemon against the engine test double: routed, the agent's jobs, Ctrl-C cleanup, busy, --direct."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.integration.conftest import REPO, Box

pytestmark = [pytest.mark.docker, pytest.mark.integration]


@dataclass
class RunningAgent:
    proc: subprocess.Popen[bytes]
    port: int

    @property
    def pid(self) -> int:
        return self.proc.pid

    def jobs(self) -> list[dict[str, Any]]:
        reply = httpx.get(f"http://127.0.0.1:{self.port}/api/jobs", timeout=5, trust_env=False)
        return list(reply.json()["jobs"])


@contextmanager
def running_agent(box: Box) -> Iterator[RunningAgent]:
    """`metralectl agent` with the box's environment, until it has recorded itself; SIGTERM at the end."""
    port = box.own_port()  # the agent's API server (SO_REUSEADDR) listens beside the held socket
    log = open(box.home / "agent.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "metralectl", "agent", "--port", str(port), "--no-peer",
                             "--interval", "60", "--no-regroup"], stdout=log, stderr=subprocess.STDOUT,
                            env=box.env, cwd=REPO)
    state = box.config / "agent" / "agent.json"
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"the agent exited {proc.returncode}: {(box.home / 'agent.log').read_text()}")
            if state.exists() and json.loads(state.read_text()).get("pid") == proc.pid:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the agent did not record itself within 30 s")
        yield RunningAgent(proc, port)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture()
def agent(box: Box) -> Iterator[RunningAgent]:
    with running_agent(box) as started:
        yield started


def _via(agent: RunningAgent) -> str:
    return f"via the agent (pid {agent.pid}, http://127.0.0.1:{agent.port}/)"


def test_run_swap_stop_through_the_agent(box: Box, agent: RunningAgent) -> None:
    first, second = box.recipe("first"), box.recipe("second")
    box.weights_complete()
    out = box.cli("run", first, check=True)
    assert _via(agent) in out.stderr
    assert "▸ loading" in out.stderr and "✔ ready in" in out.stderr  # the same rendering as the direct path
    assert "endpoint  http://127.0.0.1:" in out.stdout and "curl -s" in out.stdout
    url = out.stdout.split("endpoint  ")[1].split()[0]
    assert httpx.get(f"{url}/models", timeout=5, trust_env=False).status_code == 200
    assert box.containers() == [f"metralectl-{first}"]
    [job] = agent.jobs()
    assert (job["kind"], job["target"], job["state"], job["exit_code"]) == ("run", first, "done", 0)  # the agent ran it

    swapped = box.cli("swap", second, "--json", check=True)
    assert _via(agent) in swapped.stderr
    result = json.loads(swapped.stdout)
    assert result["outcome"] == "swapped" and result["to_recipe"] == second and result["url"] + "/v1" == url
    assert list(result["phases"]) == ["drain", "stop", "boot"]  # in the order the swap measured them
    assert box.containers() == [f"metralectl-{second}"]

    stopped = box.cli("stop", check=True)
    assert _via(agent) in stopped.stderr
    assert stopped.stdout.startswith(f"stopped metralectl-{second} ({second}): ") and "removed: yes" in stopped.stdout
    assert box.containers() == []
    assert [(j["kind"], j["state"]) for j in agent.jobs()] == [("run", "done"), ("swap", "done"), ("stop", "done")]

    nothing = box.cli("stop", first)  # it no longer serves: nothing to do, said as directly (the job's result)
    assert nothing.returncode == 0 and f"nothing to stop: {first} is not being served (served now: nothing)" \
        in nothing.stderr, nothing.stderr
    refused = box.cli("stop", f"{first}-typo")  # a refusal inside the job: the same message and exit code as directly
    assert refused.returncode == 64 and f"no recipe named '{first}-typo'" in refused.stderr, refused.stderr
    failing = box.recipe("failing", image="exit-at-start")
    failed = box.cli("run", failing)  # an engine failure: classified, its container removed, exit 1
    assert failed.returncode == 1 and "start failed (exited)" in failed.stderr and "Traceback" not in failed.stderr
    assert box.containers() == []


def test_ctrl_c_of_a_routed_run_cancels_it_and_leaves_nothing(box: Box, agent: RunningAgent) -> None:
    slow, other = box.recipe("slow", image="slow"), box.recipe("other")
    box.weights_complete()
    proc = box.popen("run", slow)
    box.wait_for_container()
    busy = box.cli("run", other, "--direct")  # the agent holds the lifecycle lock for its job
    assert busy.returncode == 75 and f"busy: run {slow} (agent) (pid {agent.pid})" in busy.stderr
    time.sleep(0.5)
    interrupted_at = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert time.monotonic() - interrupted_at < 8  # the double loads silently for 12 s: cancelled well before
    assert box.containers() == []  # the agent removed the half-started container before the CLI left
    assert [(j["kind"], j["state"], j["exit_code"]) for j in agent.jobs()] == [("run", "cancelled", 130)]


def test_direct_works_while_the_agent_runs(box: Box, agent: RunningAgent) -> None:
    name = box.recipe("direct")
    box.weights_complete()
    out = box.cli("run", name, "--direct", check=True)
    assert "via the agent" not in out.stderr and "endpoint  http://127.0.0.1:" in out.stdout
    box.env["METRALECTL_DIRECT"] = "1"
    stopped = box.cli("stop", name, check=True)
    assert "via the agent" not in stopped.stderr and "removed: yes" in stopped.stdout
    assert agent.jobs() == [] and box.containers() == []


def test_transfers_are_rendered_through_the_agent(box: Box) -> None:
    """Missing weights: the agent's run downloads them; the CLI renders its transfer events as directly."""
    from tests.fakehub.server import FakeHub, FakeRepo

    repo = FakeRepo.flagship()
    with FakeHub([repo]) as hub:
        box.env.update({"HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_XET": "1"})
        name = box.recipe("pulls")
        with running_agent(box) as agent:
            out = box.cli("run", name, check=True)
            assert [(j["kind"], j["state"]) for j in agent.jobs()] == [("run", "done")]
    assert _via(agent) in out.stderr
    assert "Sehyo/Qwen3.5-35B-A3B-NVFP4: verified" in out.stderr  # a weights Transfer, rebuilt and rendered
    assert "endpoint  http://127.0.0.1:" in out.stdout
