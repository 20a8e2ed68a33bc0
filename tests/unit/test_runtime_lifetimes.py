"""Every runtime is closed by whoever opened it, on every path: the CLI commands (which never closed theirs
before), the per-node runtimes of a multi-rank deployment (never the borrowed local one), the doctor's
shared connection."""

from __future__ import annotations

from typing import Any

import pytest

from metralectl.cli import ps_report, serve_cmds
from metralectl.errors import MetralError
from metralectl.lifecycle import deployment
from metralectl.seams.docker import runtime as docker_runtime
from metralectl.seams.docker.endpoints import Endpoint
from tests.fakes.runtime import FakeRuntime
from tests.unit import doctor_fakes as df


def _cli_runtime(monkeypatch: pytest.MonkeyPatch) -> FakeRuntime:
    """What open_runtime() hands out (every front end opens the real one through it, imported lazily)."""
    rt = FakeRuntime()
    monkeypatch.setattr(docker_runtime, "open_runtime", lambda *a, **kw: rt)
    return rt


def test_ps_closes_its_runtime(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    rt = _cli_runtime(monkeypatch)
    ps_report.ps(as_json=True)
    assert '"serving": []' in capsys.readouterr().out and rt.closed == 1


def test_logs_closes_its_runtime_when_nothing_is_served(monkeypatch: pytest.MonkeyPatch) -> None:
    rt = _cli_runtime(monkeypatch)
    with pytest.raises(MetralError, match="nothing is being served by metralectl"):
        serve_cmds.logs(recipe_name=None, follow=False, tail=10, rank=None, last_failed=False, on=None, namespace=None)  # type: ignore[arg-type]
    assert rt.closed == 1


def test_stop_closes_its_runtime(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    rt = _cli_runtime(monkeypatch)
    serve_cmds.stop(recipe_name=None, all_=False, timeout=1.0, as_json=False, on=None, namespace=None)  # type: ignore[arg-type]
    assert rt.closed == 1


def _record(url: str) -> deployment.RankRecord:
    return deployment.RankRecord(1, "worker", url, "--worker", "", "node2", "metralectl-x-r1")


def test_node_runtimes_close_what_they_opened_and_never_the_local_one(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[FakeRuntime] = []

    def open_runtime(endpoint: Endpoint | None = None, **_: Any) -> FakeRuntime:
        opened.append(FakeRuntime(endpoint=endpoint))
        return opened[-1]

    monkeypatch.setattr(deployment, "open_runtime", open_runtime)
    local = FakeRuntime()
    with deployment.Runtimes(local) as runtimes:
        assert runtimes.get(_record(local.endpoint.url)) is local
        worker = runtimes.require(_record("tcp://127.0.0.1:2376"))
        assert runtimes.require(_record("tcp://127.0.0.1:2376")) is worker  # one per endpoint
    assert [r.closed for r in opened] == [1] and local.closed == 0


def test_the_doctor_context_closes_the_connection_its_checks_shared(tmp_path: Any) -> None:
    rt = df.FakeRuntime()
    ctx = df.make_ctx(tmp_path, runtime=rt)
    ctx.docker_info()  # a check opened the shared runtime
    ctx.close()
    assert rt.closed == 1
