"""`metralectl run/swap/stop` beside a running agent (a real `metralectl agent` process), on a real Docker daemon
against the engine test double: the CLI changes what is served itself (one executor) and the agent's page shows
it; while one of the agent's jobs holds the lifecycle lock the CLI is refused (75) with that job named; the page's
cancel and the CLI's Ctrl-C each clean up; the page's job log numbers its transfers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
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


def _post(agent: RunningAgent, box: Box, path: str, body: dict[str, Any]) -> httpx.Response:
    """A POST as the agent's page sends it (its bearer token, read from the box's agent directory)."""
    token = (box.config / "agent" / "token").read_text().strip()
    return httpx.post(f"http://127.0.0.1:{agent.port}{path}", json=body, headers={"Authorization": f"Bearer {token}"},
                      timeout=10, trust_env=False)


def _served(agent: RunningAgent) -> list[str]:
    """What the agent's page shows as served (GET /api/serving, the page's own source)."""
    reply = httpx.get(f"http://127.0.0.1:{agent.port}/api/serving", timeout=10, trust_env=False)
    return [s["recipe"] for s in reply.json()["serving"]]


def _lock_holder(box: Box) -> str | None:
    """Who holds the box's lifecycle lock now (None: nobody), as the next command would find it."""
    from metralectl.seams.store import lock_holder

    return lock_holder(Path(box.env["METRALECTL_LOCK_DIR"]) / "metralectl-lifecycle.lock")


def _until(predicate: Any, timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_the_cli_runs_swaps_and_stops_itself_while_the_agent_runs(box: Box, agent: RunningAgent) -> None:
    """One executor: the command does the change in its own process, under the lifecycle lock, with its own
    progress lines; the agent runs no job for it, and its page shows what serves."""
    first, second = box.recipe("first"), box.recipe("second")
    box.weights_complete()
    out = box.cli("run", first, check=True)
    assert "via the agent" not in out.stderr
    assert "▸ loading" in out.stderr and "✔ ready in" in out.stderr
    assert "endpoint  http://127.0.0.1:" in out.stdout and "curl -s" in out.stdout
    url = out.stdout.split("endpoint  ")[1].split()[0]
    assert httpx.get(f"{url}/models", timeout=5, trust_env=False).status_code == 200
    assert box.containers() == [f"metralectl-{first}"] and _served(agent) == [first]

    swapped = box.cli("swap", second, "--json", check=True)
    result = json.loads(swapped.stdout)
    assert result["outcome"] == "swapped" and result["to_recipe"] == second and result["url"] + "/v1" == url
    assert list(result["phases"]) == ["drain", "stop", "boot"]  # in the order the swap measured them
    assert box.containers() == [f"metralectl-{second}"] and _served(agent) == [second]

    stopped = box.cli("stop", check=True)
    assert stopped.stdout.startswith(f"stopped metralectl-{second} ({second}): ") and "removed: yes" in stopped.stdout
    assert box.containers() == [] and _served(agent) == []
    assert agent.jobs() == []  # the agent ran none of it


def test_the_cli_is_busy_while_an_agent_job_holds_the_lock(box: Box, agent: RunningAgent) -> None:
    """The page's run holds the lifecycle lock: the CLI's run is refused (75) naming that job, as it names any
    holder; the page's cancel then ends the job (its silent boot included) and removes its container."""
    slow, other = box.recipe("slow", image="slow"), box.recipe("other")
    box.weights_complete()
    started = _post(agent, box, "/api/run", {"recipe": slow})
    assert started.status_code == 202, started.text
    job_id = started.json()["id"]
    box.wait_for_container()
    assert _lock_holder(box) == f"run {slow} (agent) (pid {agent.pid})"
    busy = box.cli("run", other)
    assert busy.returncode == 75, busy.stderr
    assert f"busy: run {slow} (agent) (pid {agent.pid}) is in progress on this machine" in busy.stderr
    assert "cancel it on the agent's page" in busy.stderr and "Traceback" not in busy.stderr
    time.sleep(0.5)  # the double loads silently for 30 s
    asked = time.monotonic()
    cancel = _post(agent, box, f"/api/jobs/{job_id}/cancel", {})
    assert cancel.status_code == 202, cancel.text
    _until(lambda: agent.jobs()[0]["state"] != "running", timeout=30, what="the job to end")
    assert time.monotonic() - asked < 8  # the readiness wait's tick, not the 30 s load
    assert [(j["kind"], j["state"], j["exit_code"]) for j in agent.jobs()] == [("run", "cancelled", 130)]
    assert box.containers() == [] and _lock_holder(box) is None  # the job's cleanup removed its container; the lock is free


def test_ctrl_c_of_a_cli_run_beside_the_agent_leaves_nothing(box: Box, agent: RunningAgent) -> None:
    slow = box.recipe("slow", image="slow")
    box.weights_complete()
    proc = box.popen("run", slow)
    box.wait_for_container()
    time.sleep(0.5)
    interrupted_at = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert time.monotonic() - interrupted_at < 8  # the double loads silently for 30 s: interrupted well before
    assert box.containers() == [] and agent.jobs() == []  # the command cleaned up itself
    assert _lock_holder(box) is None


def test_the_pages_run_downloads_and_its_job_log_numbers_the_transfers(box: Box) -> None:
    """Missing weights: the page's run downloads them; its job log (the numbered events the page follows) carries
    the transfer, as the CLI's progress lines do."""
    from tests.fakehub.server import FakeHub, FakeRepo

    repo = FakeRepo.flagship()
    with FakeHub([repo]) as hub:
        box.env.update({"HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_XET": "1"})
        name = box.recipe("pulls")
        with running_agent(box) as agent:
            started = _post(agent, box, "/api/run", {"recipe": name})
            assert started.status_code == 202, started.text
            _until(lambda: agent.jobs()[0]["state"] != "running", timeout=120, what="the page's run")
            events = httpx.get(f"http://127.0.0.1:{agent.port}/api/jobs/{started.json()['id']}/events?after=0&wait=0",
                               timeout=10, trust_env=False).json()
            stopped = box.cli("stop", check=True)
    assert events["job"]["state"] == "done", events["job"]
    seqs = [e["seq"] for e in events["events"]]
    assert seqs == list(range(1, len(seqs) + 1))  # numbered, none missing
    transfers = [e for e in events["events"] if e["kind"] == "Transfer" and e["transfer"] == "weights"]
    assert transfers and transfers[-1]["progress"]["repo"] == "Sehyo/Qwen3.5-35B-A3B-NVFP4"
    assert "removed: yes" in stopped.stdout
