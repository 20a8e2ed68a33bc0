"""The local API's security over real loopback HTTP (fake operations behind it): Host allow-list, no
cross-origin, bearer token on every change, no change on GET; plus jobs, the page, the capability loop."""

from __future__ import annotations

import os
import re
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from metralectl.agent import security
from metralectl.agent.api import LocalApiServer
from metralectl.agent.capability import CapabilityMonitor
from metralectl.agent.jobs import JobRunner
from metralectl.agent.ops import static_dir
from metralectl.errors import MetralError
from metralectl.lifecycle.events import Step

TOKEN = "t" * 43


class FakeOps:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.can_run = False
        self.release = threading.Event()
        self.release.set()

    def capability(self) -> dict[str, Any]:
        return {"can_run": self.can_run, "summary": "fake", "problems": [], "checks": []}

    def serving(self) -> dict[str, Any]:
        return {"serving": []}

    def recipes(self) -> dict[str, Any]:
        return {"recipes": []}

    def telemetry(self) -> dict[str, Any]:
        return {"available": False, "reason": "fake"}

    def history(self) -> dict[str, Any]:
        raise MetralError("history store broken", "fix it")

    def check(self, change: Any) -> None:
        pass

    def apply(self, change: Any, on_event: Any) -> Any:  # the Change read from the body, as LifecycleOps gets it
        return getattr(self, change.kind)(change.recipe, on_event)

    def run(self, recipe: str, on_event: Any, **kwargs: Any) -> Any:
        self.calls.append(("run", recipe))
        on_event(Step("starting", f"container for {recipe}"))
        self.release.wait(5)
        return {"recipe": recipe}

    def swap(self, recipe: str, on_event: Any, **kwargs: Any) -> Any:
        self.calls.append(("swap", recipe))
        return {"to": recipe}

    def stop(self, recipe: str | None, on_event: Any, **kwargs: Any) -> Any:
        self.calls.append(("stop", recipe))
        return {"stopped": []}


@pytest.fixture(scope="module")
def _server() -> Iterator[LocalApiServer]:
    server = LocalApiServer(FakeOps(), token=TOKEN, port=0)
    server.start("test-api")
    yield server
    server.stop()


@pytest.fixture()
def api(_server: LocalApiServer) -> Iterator[tuple[LocalApiServer, FakeOps]]:
    ops = FakeOps()
    _server.ops = ops  # a fresh fake and job list per test (the lock dir is per test: isolated_env)
    _server.jobs = JobRunner()
    yield _server, ops
    ops.release.set()
    for job in _server.jobs.list():
        while job.finished is None:
            time.sleep(0.01)


def _url(server: LocalApiServer, path: str) -> str:
    return f"http://127.0.0.1:{server.port}{path}"


def _post(server: LocalApiServer, path: str, body: Any = None, **headers: str) -> httpx.Response:
    base = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    return httpx.post(_url(server, path), json=body or {}, headers={**base, **headers}, timeout=5, trust_env=False)


def _raw(server: LocalApiServer, request: bytes) -> str:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(request)
        return sock.recv(65536).decode(errors="replace")


# -- Host ----------------------------------------------------------------------------------------
def test_allowed_hosts_answer(api: tuple[LocalApiServer, FakeOps]) -> None:
    server, _ = api
    for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", f"[::1]:{server.port}"):
        r = httpx.get(_url(server, "/api/status"), headers={"Host": host}, trust_env=False)
        assert r.status_code == 200, host


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1", "localhost:1",
                                  "127.0.0.1:{port}.evil.example", "LOCALHOST:{port}x"])
def test_foreign_host_refused(api: tuple[LocalApiServer, FakeOps], host: str) -> None:
    server, ops = api
    r = httpx.get(_url(server, "/api/status"), headers={"Host": host.format(port=server.port)}, trust_env=False)
    assert r.status_code == 421
    r = httpx.post(_url(server, "/api/stop"), headers={"Host": host.format(port=server.port),
                                                       "Authorization": f"Bearer {TOKEN}"}, json={}, trust_env=False)
    assert r.status_code == 421 and ops.calls == []


def test_empty_or_missing_host_refused(api: tuple[LocalApiServer, FakeOps]) -> None:
    server, _ = api
    assert " 421 " in _raw(server, b"GET /api/status HTTP/1.1\r\nHost: \r\nConnection: close\r\n\r\n").split("\r\n")[0] + " "
    assert " 421 " in _raw(server, b"GET /api/status HTTP/1.1\r\nConnection: close\r\n\r\n").split("\r\n")[0] + " "
    assert " 421 " in _raw(server, b"GET /api/status HTTP/1.0\r\n\r\n").split("\r\n")[0] + " "


# -- Origin / CORS -------------------------------------------------------------------------------
@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://127.0.0.1:1", "https://127.0.0.1:{port}",
                                    "http://localhost:{port}"])
def test_cross_origin_refused(api: tuple[LocalApiServer, FakeOps], origin: str) -> None:
    server, ops = api
    o = origin.format(port=server.port)
    assert httpx.get(_url(server, "/api/status"), headers={"Origin": o}, trust_env=False).status_code == 403
    r = _post(server, "/api/stop", Origin=o)
    assert r.status_code == 403 and ops.calls == []
    assert "access-control-allow-origin" not in r.headers


def test_same_origin_allowed_and_sec_fetch_site(api: tuple[LocalApiServer, FakeOps]) -> None:
    server, ops = api
    same = f"http://127.0.0.1:{server.port}"
    assert httpx.get(_url(server, "/api/status"), headers={"Origin": same}, trust_env=False).status_code == 200
    assert _post(server, "/api/stop", Origin=same, **{"Sec-Fetch-Site": "same-origin"}).status_code == 202
    for site in ("cross-site", "same-site"):
        r = httpx.get(_url(server, "/api/status"), headers={"Sec-Fetch-Site": site}, trust_env=False)
        assert r.status_code == 403


def test_no_cors_preflight_and_no_cors_headers(api: tuple[LocalApiServer, FakeOps]) -> None:
    server, _ = api
    r = httpx.request("OPTIONS", _url(server, "/api/run"), trust_env=False,
                      headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert r.status_code in (403, 405)
    r = httpx.request("OPTIONS", _url(server, "/api/run"), trust_env=False)
    assert r.status_code == 405
    for path in ("/", "/api/status", "/api/serving"):
        assert not [h for h in httpx.get(_url(server, path), trust_env=False).headers if h.startswith("access-control")]


# -- token -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("auth", [None, "", "Bearer", f"Basic {TOKEN}", "Bearer wrong",
                                  f"Bearer {TOKEN[:-1]}", f"Bearer {TOKEN}x", f"Bearer {TOKEN.upper()}"])
def test_missing_or_wrong_token_refused(api: tuple[LocalApiServer, FakeOps], auth: str | None) -> None:
    server, ops = api
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = auth
    for path in ("/api/stop", "/api/run", "/api/swap"):
        r = httpx.post(_url(server, path), json={"recipe": "x"}, headers=headers, trust_env=False)
        assert r.status_code == 401, (path, auth)
    assert ops.calls == []


def test_token_compared_in_constant_time() -> None:
    import inspect

    assert "hmac.compare_digest" in inspect.getsource(security.check)


def test_json_only(api: tuple[LocalApiServer, FakeOps]) -> None:
    server, ops = api
    r = httpx.post(_url(server, "/api/stop"), content=b"recipe=x", trust_env=False,
                   headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415 and ops.calls == []
    assert _post(server, "/api/run", {"recipe": 3}).status_code == 400
    assert _post(server, "/api/run", {}).status_code == 400


# -- GET never changes anything --------------------------------------------------------------------
def test_get_changes_nothing(api: tuple[LocalApiServer, FakeOps]) -> None:
    server, ops = api
    for path in ("/api/run", "/api/swap", "/api/stop", "/api/run?recipe=x", "/api/status", "/api/serving",
                 "/api/recipes", "/api/telemetry", "/api/history", "/api/jobs", "/api/agent", "/", "/app.js"):
        r = httpx.get(_url(server, path), headers={"Authorization": f"Bearer {TOKEN}"}, trust_env=False)
        assert r.status_code in (200, 404, 503), path
        r = httpx.head(_url(server, path), trust_env=False)
        assert r.status_code in (200, 404, 503), path
    assert ops.calls == []
    assert server.jobs.list() == []
    for method in ("PUT", "DELETE", "PATCH"):
        r = httpx.request(method, _url(server, "/api/stop"), headers={"Authorization": f"Bearer {TOKEN}"},
                          trust_env=False)
        assert r.status_code == 405
    assert ops.calls == []


def test_read_errors_are_answers(api: tuple[LocalApiServer, FakeOps]) -> None:
    server, _ = api
    r = httpx.get(_url(server, "/api/history"), trust_env=False)
    assert r.status_code == 503 and r.json() == {"error": "history store broken", "hint": "fix it"}


# -- jobs under the lifecycle lock -----------------------------------------------------------------
def test_post_starts_a_job_under_the_lock(api: tuple[LocalApiServer, FakeOps]) -> None:
    server, ops = api
    from metralectl.seams.store import lock_held

    ops.release.clear()
    r = _post(server, "/api/run", {"recipe": "qwen3.5-35b-a3b"})
    assert r.status_code == 202 and r.headers["location"] == f"/api/jobs/{r.json()['id']}"
    assert lock_held()
    again = _post(server, "/api/swap", {"recipe": "other"})
    assert again.status_code == 409 and "busy" in again.json()["error"]
    ops.release.set()
    job: dict[str, Any] = {}
    for _ in range(50):
        job = httpx.get(_url(server, r.headers["location"]), trust_env=False).json()
        if job["state"] == "done":
            break
        time.sleep(0.05)
    assert job["state"] == "done" and job["result"] == {"recipe": "qwen3.5-35b-a3b"}
    assert job["events"][0]["kind"] == "Step" and "qwen3.5" in job["events"][0]["detail"]
    assert not lock_held()
    assert ops.calls == [("run", "qwen3.5-35b-a3b")]


def test_busy_from_a_cli_holder(api: tuple[LocalApiServer, FakeOps]) -> None:
    server, ops = api
    from metralectl.seams.store import lifecycle_lock

    with lifecycle_lock("swap to x"):
        r = _post(server, "/api/stop")
    assert r.status_code == 409 and "swap to x" in r.json()["error"] and ops.calls == []


def test_failed_job_records_the_error() -> None:
    runner = JobRunner()

    def boom(emit: Any) -> Any:
        raise MetralError("start failed", "look at the logs")

    job = runner.start("run", "x", boom)
    for _ in range(100):
        if job.state == "failed":
            break
        time.sleep(0.02)
    assert (job.state, job.error, job.hint) == ("failed", "start failed", "look at the logs")


# -- the page ---------------------------------------------------------------------------------------
def test_page_is_served_with_a_strict_policy(api: tuple[LocalApiServer, FakeOps]) -> None:
    server, _ = api
    page = httpx.get(_url(server, "/"), trust_env=False)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp and "script-src 'self'" in csp
    assert page.headers["x-frame-options"] == "DENY"
    js = httpx.get(_url(server, "/app.js"), trust_env=False)
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert httpx.get(_url(server, "/../../etc/passwd"), trust_env=False).status_code == 404


def test_static_files_load_nothing_from_elsewhere() -> None:
    for path in static_dir().iterdir():
        text = path.read_text()
        assert not re.search(r"(src|href)\s*=\s*[\"'](https?:)?//", text), path
        assert not re.search(r"https?://(?!127\.0\.0\.1)", text.replace("http://127.0.0.1", "")), path


def test_api_refuses_non_loopback() -> None:
    with pytest.raises(MetralError, match="loopback"):
        LocalApiServer(FakeOps(), token=TOKEN, host="0.0.0.0", port=0)


def test_token_file(isolated_env: Path) -> None:
    token = security.load_or_create_token()
    path = security.token_path()
    assert len(token) >= 43 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert security.load_or_create_token() == token
    os.chmod(path, 0o640)
    with pytest.raises(MetralError, match="refusing"):
        security.load_or_create_token()


# -- the capability loop ----------------------------------------------------------------------------
def test_capability_changes_by_itself_within_an_interval() -> None:
    state = {"ok": False}

    def check() -> dict[str, Any]:
        return {"can_run": state["ok"], "summary": "ready" if state["ok"] else "Docker is stopped",
                "problems": [] if state["ok"] else [{"id": "docker.daemon", "detail": "not running",
                                                     "remedy": "sudo systemctl start docker"}]}

    changes: list[bool] = []
    monitor = CapabilityMonitor(check, interval_s=0.2, on_change=lambda a: changes.append(a["can_run"])).start()
    try:
        assert monitor.latest(wait_s=2)["can_run"] is False  # type: ignore[index]
        state["ok"] = True  # "Docker started"
        assert monitor.wait_rounds(2, timeout=3)
        assert monitor.latest()["can_run"] is True  # type: ignore[index]
    finally:
        monitor.stop()
    assert changes == [False, True]


def test_a_broken_check_is_an_answer_not_a_dead_loop() -> None:
    calls = []

    def check() -> dict[str, Any]:
        calls.append(1)
        raise RuntimeError("boom")

    monitor = CapabilityMonitor(check, interval_s=0.2).start()
    try:
        assert monitor.wait_rounds(2, timeout=3)
        answer = monitor.latest()
        assert answer and answer["can_run"] is False and "boom" in answer["summary"]
    finally:
        monitor.stop()


def test_agent_serves_the_monitor_answer_and_regroup_rule(tmp_path: Path) -> None:
    from metralectl.agent.service import Agent, AgentOptions, needs_regroup, read_state

    state = {"ok": False}
    agent = Agent(AgentOptions(api_port=0, peer_port=0, peer_host="127.0.0.1", interval_s=0.2, regroup=False),
                  base=tmp_path, check=lambda: {"can_run": state["ok"], "summary": "", "problems": [], "checks": []},
                  ops=None)
    agent.start()
    try:
        assert read_state(tmp_path)["api_port"] == agent.api.port  # type: ignore[index]
        url = f"http://127.0.0.1:{agent.api.port}/api/status"
        assert agent.monitor.wait_rounds(1, timeout=3)
        assert httpx.get(url, trust_env=False).json()["can_run"] is False
        state["ok"] = True
        assert agent.monitor.wait_rounds(2, timeout=3)
        assert httpx.get(url, trust_env=False).json()["can_run"] is True
    finally:
        agent.stop()
    assert read_state(tmp_path) is None
    def answer(active: bool) -> dict[str, Any]:
        return {"checks": [{"id": "docker.daemon", "status": "problem",
                            "data": {"cause": "permission-denied", "in_docker_group": True,
                                     "docker_group_active": active}}]}

    assert needs_regroup(answer(False))
    assert not needs_regroup(answer(True))
