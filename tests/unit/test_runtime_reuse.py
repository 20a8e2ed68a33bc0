"""Long-lived watchers keep one Docker connection: `metralectl top`'s engine discovery and the dashboard's
services open the runtime once, reuse it round after round, open it again only after it failed to
reach the daemon (restarted), and close it at the end. A counting factory stands in for open_runtime."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from metralectl.core.render import LABEL_MANAGED, LABEL_OWNER, owner
from metralectl.lifecycle.launch import LABEL_ENDPOINT
from metralectl.seams.docker import runtime as docker_runtime
from metralectl.seams.docker.containers import ContainerInfo
from metralectl.seams.docker.errors import DockerUnavailable
from tests.fakes.runtime import FakeRuntime

pytest.importorskip("textual")


class FlakyRuntime(FakeRuntime):
    """A FakeRuntime whose daemon can go away: `down` makes every listing raise DockerUnavailable."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        c = ContainerInfo(id="a", name="metralectl-a", image="img", status="running", exit_code=None,
                          oom_killed=False, started_at=None, finished_at=None,
                          labels={LABEL_MANAGED: "true", LABEL_OWNER: owner(), LABEL_ENDPOINT: "http://127.0.0.1:8888"})
        self.seed(c)

    def containers(self, **kw: Any) -> list[ContainerInfo]:
        if self.down:
            raise DockerUnavailable("not-running", "the Docker daemon at unix:///x refuses connections", "start it")
        return super().containers(**kw)


class CountingFactory:
    def __init__(self) -> None:
        self.opened: list[FlakyRuntime] = []
        self.lock = threading.Lock()

    def __call__(self, *_: Any, **__: Any) -> FlakyRuntime:
        with self.lock:
            rt = FlakyRuntime()
            self.opened.append(rt)
            return rt


@pytest.fixture()
def factory(monkeypatch: pytest.MonkeyPatch) -> CountingFactory:
    f = CountingFactory()
    monkeypatch.setattr(docker_runtime, "open_runtime", f)
    return f


def test_top_discovers_over_one_connection_and_reconnects_after_a_failure(factory: CountingFactory) -> None:
    from metralectl.cli.top_cmd import _session

    session = _session(1.0, [])  # what `metralectl top` builds (no --url: engines discovered from Docker)
    discover = session.poller._discover
    for _ in range(5):  # five rediscovery rounds
        targets, note = discover()
        assert [t.url for t in targets] == ["http://127.0.0.1:8888"] and note is None
    assert len(factory.opened) == 1, f"opened {len(factory.opened)} connections for 5 rounds"
    assert factory.opened[0].closed == 0

    factory.opened[0].down = True  # the daemon restarts: the kept connection fails once
    targets, note = discover()
    assert targets == [] and note is not None and "refuses connections" in note
    assert factory.opened[0].closed == 1  # the broken connection is dropped...
    for _ in range(3):
        targets, _note = discover()
        assert [t.url for t in targets] == ["http://127.0.0.1:8888"]
    assert len(factory.opened) == 2  # ...and one new one serves the next rounds
    session.close()
    assert factory.opened[1].closed == 1  # closed when top ends


def test_top_opens_nothing_when_docker_is_down_and_retries_each_round(factory: CountingFactory,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from metralectl.telemetry.watch import EngineDiscovery

    attempts = [0]

    def no_daemon(*_: Any, **__: Any) -> Any:
        attempts[0] += 1
        raise DockerUnavailable("not-running", "the Docker daemon at unix:///x refuses connections", "start it")

    discover = EngineDiscovery(no_daemon)
    for _ in range(3):
        assert discover()[0] == []
    assert attempts[0] == 3  # no connection to keep: each round tries again
    discover.close()


def test_dashboard_services_share_one_runtime_across_threads(factory: CountingFactory) -> None:
    from metralectl.tui.core_services import CoreServices
    from tests.unit.tui.fakes import FakeBench

    services = CoreServices(bench=FakeBench())  # type: ignore[arg-type]
    errors: list[BaseException] = []

    def poll() -> None:
        try:
            for _ in range(5):
                services.status()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=poll) for _ in range(4)]  # the dashboard's workers are threads
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(factory.opened) == 1, f"opened {len(factory.opened)} connections for 20 polls"
    assert factory.opened[0].closed == 0  # borrowed, not closed after each poll

    factory.opened[0].down = True
    with pytest.raises(DockerUnavailable):
        services.status()
    services.status()  # the daemon is back: a new connection
    assert len(factory.opened) == 2 and factory.opened[0].closed == 1
    services.close()
    assert factory.opened[1].closed == 1
