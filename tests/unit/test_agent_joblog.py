"""The agent's log of its jobs (metralectl/joblog.py): a line when a job starts and one when it ends, saying who
asked (the local API's client, or which peer), what (kind, recipe, sets; a unit's suite), and the result
(outcome, exit code, duration); outside text escaped. And the HTTP client's per-request lines quieted."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from metralectl.agent.api import LocalApiServer
from metralectl.agent.jobs import JobRunner
from metralectl.errors import ExitCode, MetralError
from metralectl.peers.unit_spec import UnitSpec
from metralectl.peers.units import ExecOutcome, Unit, UnitQueue

TOKEN = "t" * 43
JOBS = "metralectl.agent.jobs"


class Ops:
    """The API's operations, faked: a run that waits for `release`, a swap that fails."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def check(self, change: Any) -> None:
        pass

    def apply(self, change: Any, on_event: Any) -> Any:
        if change.kind == "swap":
            raise MetralError("the new model never became ready", "see its log")
        self.release.wait(5)
        return {"recipe": change.recipe}


@pytest.fixture()
def server() -> Iterator[tuple[LocalApiServer, Ops]]:
    ops = Ops()
    api = LocalApiServer(ops, token=TOKEN, port=0, jobs=JobRunner())  # type: ignore[arg-type]
    api.start("test-joblog-api")
    yield api, ops
    ops.release.set()
    api.stop()


def _post(api: LocalApiServer, route: str, body: dict[str, Any], agent: str = "test-client") -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{api.port}{route}", json=body, timeout=10, trust_env=False,
                      headers={"Authorization": f"Bearer {TOKEN}", "User-Agent": agent})


def _job_lines(caplog: pytest.LogCaptureFixture, needle: str, count: int) -> list[logging.LogRecord]:
    """The job log's records mentioning needle, once there are `count` of them (the end line is written
    just after the job's state turns final, so a test waits for the line itself)."""
    deadline = time.monotonic() + 10
    while True:
        found = [r for r in caplog.records if r.name == JOBS and needle in r.getMessage()]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def test_a_local_api_job_is_logged_at_start_and_end_with_who_what_and_result(
        server: tuple[LocalApiServer, Ops], caplog: pytest.LogCaptureFixture) -> None:
    api, ops = server
    caplog.set_level(logging.INFO, logger="metralectl")
    r = _post(api, "/api/run", {"recipe": "qwen3-8b", "sets": ["serve.port=8001"]}, agent="metralectl-page/1")
    assert r.status_code == 202
    job_id = r.json()["id"]
    start = _job_lines(caplog, job_id, 1)
    assert len(start) == 1 and "started" in start[0].getMessage()  # logged while the job still runs
    ops.release.set()
    start, end = _job_lines(caplog, job_id, 2)
    for record in (start, end):
        text = record.getMessage()
        assert "run qwen3-8b --set serve.port=8001" in text
        assert "the local API client 127.0.0.1:" in text and "(metralectl-page/1)" in text
    assert f"job {job_id} done (exit 0, " in end.getMessage() and end.levelno == logging.INFO
    assert " s)" in end.getMessage()  # its duration


def test_a_failed_job_ends_with_a_warning_its_exit_code_and_error(server: tuple[LocalApiServer, Ops],
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    api, _ = server
    caplog.set_level(logging.INFO, logger="metralectl")
    job_id = _post(api, "/api/swap", {"recipe": "gemma"}).json()["id"]
    end = _job_lines(caplog, job_id, 2)[-1]
    assert end.levelno == logging.WARNING
    assert f"job {job_id} failed (exit {int(ExitCode.FAILED)}, " in end.getMessage()
    assert end.getMessage().endswith(": the new model never became ready")


def test_outside_text_cannot_forge_a_log_line(server: tuple[LocalApiServer, Ops],
                                              caplog: pytest.LogCaptureFixture) -> None:
    api, ops = server
    ops.release.set()
    caplog.set_level(logging.INFO, logger="metralectl")
    evil = "x\n2026-12-01 metralectl.agent: job forged done\x1b[2J"
    job_id = _post(api, "/api/run", {"recipe": evil, "sets": ["a=\r\x07"]}, agent="ua\x1b]0;title\x07").json()["id"]
    lines = _job_lines(caplog, job_id, 2)
    assert len(lines) == 2
    for record in lines:
        text = record.getMessage()
        assert not any(ch in text for ch in "\n\r\x1b\x07"), text
        assert "x\\n2026-12-01" in text and "\\x1b[2J" in text and "a=\\r\\x07" in text


def test_a_refused_job_is_logged_too(server: tuple[LocalApiServer, Ops], caplog: pytest.LogCaptureFixture) -> None:
    api, _ = server
    caplog.set_level(logging.INFO, logger="metralectl")
    first = _post(api, "/api/run", {"recipe": "one"})
    second = _post(api, "/api/run", {"recipe": "two"})
    assert first.status_code == 202 and second.status_code == 409
    refused = [r.getMessage() for r in caplog.records if "refused run two" in r.getMessage()]
    assert refused and "busy" in refused[0] and "the local API client 127.0.0.1:" in refused[0]


class _Executor:
    def run(self, unit: Unit, emit: Any, cancel: threading.Event) -> ExecOutcome:
        return ExecOutcome(Path("/tmp/x"), ExitCode.GATE, None, {"status": "completed", "verdict": "fail"})


def test_a_peer_unit_is_logged_with_the_peer_and_the_suite(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="metralectl")
    queue = UnitQueue(tmp_path, _Executor()).start()
    try:
        spec = UnitSpec.from_json({"key": "cert-1", "suite": "decode", "params": {"repeats": 3}})
        unit, _ = queue.submit(spec, "SHA256:peerfingerprint")
        start, end = _job_lines(caplog, "cert-1", 2)
    finally:
        queue.stop()
    assert unit.state == "completed"
    for record in (start, end):
        text = record.getMessage()
        assert "asked by peer SHA256:peerfingerprint" in text and "bench unit decode (repeats=3)" in text
    assert "started" in start.getMessage()
    assert f"job cert-1 completed (exit {int(ExitCode.GATE)}, " in end.getMessage()


def test_a_unit_cancelled_before_it_ran_still_gets_its_end_line(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="metralectl")
    queue = UnitQueue(tmp_path, _Executor())  # not started: the unit stays queued
    queue.submit(UnitSpec.from_json({"key": "cert-2", "suite": "decode"}), "SHA256:other")
    queue.cancel("cert-2", "SHA256:other")
    (end,) = _job_lines(caplog, "cert-2", 1)
    assert "job cert-2 cancelled (exit -" in end.getMessage() and "before it started" in end.getMessage()
    assert end.levelno == logging.WARNING


def test_the_agent_quiets_the_http_clients_per_request_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """run_agent (what `metralectl agent` runs) sets httpx to WARNING: a request the agent's process makes
    through httpx while it runs leaves no INFO line."""
    from metralectl.agent import service

    for name in ("httpx", "httpcore"):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    caplog.set_level(logging.INFO)
    real_agent = service.Agent

    def quick_agent(options: Any, *, base: Path | None = None) -> Any:
        return real_agent(options, base=base,
                          check=lambda: {"can_run": True, "summary": "", "problems": [], "checks": []})

    monkeypatch.setattr(service, "Agent", quick_agent)
    seen: list[int] = []

    def ready(agent: Any) -> None:
        seen.append(httpx.get(f"http://127.0.0.1:{agent.api.port}/api/status", trust_env=False).status_code)
        agent.stopping.set()

    service.run_agent(service.AgentOptions(api_port=0, peer=False, regroup=False), base=tmp_path, on_ready=ready)
    assert seen == [200]
    assert logging.getLogger("httpx").level == logging.WARNING
    assert not [r for r in caplog.records if r.name.startswith(("httpx", "httpcore"))]


def test_without_the_quieting_httpx_would_log_each_request(caplog: pytest.LogCaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           server: tuple[LocalApiServer, Ops]) -> None:
    """The control for the test above: the same request at INFO does leave an httpx line."""
    api, _ = server
    monkeypatch.setattr(logging.getLogger("httpx"), "level", logging.NOTSET)
    caplog.set_level(logging.INFO)
    httpx.get(f"http://127.0.0.1:{api.port}/", trust_env=False)
    assert [r for r in caplog.records if r.name == "httpx"]


def test_a_change_refused_before_any_job_is_logged(server: tuple[LocalApiServer, Ops],
                                                   caplog: pytest.LogCaptureFixture) -> None:
    api, _ = server
    caplog.set_level(logging.INFO, logger="metralectl")
    r = _post(api, "/api/run", {"recipe": "x", "colour": "blue"})
    assert r.status_code == 400
    refused = [rec.getMessage() for rec in caplog.records if rec.getMessage().startswith("local API refused a run")]
    assert refused and "colour" in refused[0] and "127.0.0.1:" in refused[0]
