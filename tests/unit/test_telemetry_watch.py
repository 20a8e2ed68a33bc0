"""What runs behind `top`: the engine poller, engine discovery, the session, the JSONL recorder.
Fakes at the seams: fake pynvml under NvmlProbe, a fake /metrics client, a fake runtime."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from metralectl.errors import MetralError
from metralectl.seams.gpu import NvmlProbe
from metralectl.lifecycle.launch import LABEL_ENDPOINT
from metralectl.core.render import LABEL_MANAGED, LABEL_OWNER, LABEL_RECIPE, owner
from metralectl.seams.docker.containers import ContainerInfo
from metralectl.seams.docker.errors import DockerUnavailable
from metralectl.telemetry.thermal import ThermalLines
from metralectl.telemetry.engine_view import EngineTarget
from metralectl.telemetry.watch import (
    NO_ENGINE,
    EnginePoller,
    Recorder,
    TopSession,
    discover_engines,
    drop_torn_tail,
    fixed_targets,
)
from tests.fakes.runtime import FakeRuntime
from tests.unit import fake_pynvml as fk
from tests.unit.test_engine_metrics import METRICS, later

LINES = {"hopper": ThermalLines(80.0, 70.0)}


class FakeClient:
    """/metrics whose generation counter grows by `step` per scrape; `fail` makes it raise."""

    def __init__(self, step: int = 100) -> None:
        self.tokens = 12800
        self.step = step
        self.fail: str | None = None
        self.closed = False

    def metrics_text(self) -> str:
        if self.fail == "down":
            raise MetralError("cannot read http://e/metrics: [Errno 111] Connection refused")
        if self.fail == "html":
            return "<html>502</html>\n"
        self.tokens += self.step
        return later(METRICS, metrale_generation_tokens_total=self.tokens)

    def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def poller_with(targets: list[EngineTarget], clients: dict[str, FakeClient],
                **kw: Any) -> tuple[EnginePoller, Clock]:
    clock = Clock()
    state: dict[str, Any] = {"targets": targets, "note": None}
    poller = EnginePoller(lambda: (list(state["targets"]), state["note"]), clock=clock,
                          client_factory=lambda url, timeout, headers: clients.setdefault(url, FakeClient()), **kw)
    poller.state = state  # type: ignore[attr-defined]
    return poller, clock


def test_poller_keeps_the_trailing_window_and_rates_follow() -> None:
    from metralectl.telemetry.engine_view import engine_row

    poller, clock = poller_with([EngineTarget("http://e")], {}, interval_s=1.0, window_s=3.0)
    for _ in range(8):
        poller.poll_once()
        clock.t += 1.0
    (obs,), note = poller.observations()
    assert note is None and obs.state == "ok"
    assert [s.t for s in obs.snapshots] == [4.0, 5.0, 6.0, 7.0]  # 3 s window + the one at its start
    row = engine_row(obs)
    assert row.tokens_per_s == pytest.approx(100.0) and row.rates is not None and row.rates.dt_s == 3.0


def test_poller_errors_replace_numbers_and_recover() -> None:
    clients: dict[str, FakeClient] = {}
    poller, clock = poller_with([EngineTarget("http://e")], clients)
    poller.poll_once()
    clients["http://e"].fail = "down"
    clock.t += 1
    poller.poll_once()
    (obs,), _ = poller.observations()
    assert obs.state == "unreachable" and "Connection refused" in (obs.error or "") and obs.snapshots == ()
    clients["http://e"].fail = "html"
    poller.poll_once()
    (obs,), _ = poller.observations()
    assert obs.state == "bad-metrics" and "not Prometheus text" in (obs.error or "")
    clients["http://e"].fail = None
    poller.poll_once()
    (obs,), _ = poller.observations()
    assert obs.state == "ok" and obs.error is None and len(obs.snapshots) == 1


def test_poller_rediscovers_and_closes_gone_engines() -> None:
    clients: dict[str, FakeClient] = {}
    poller, clock = poller_with([EngineTarget("http://a")], clients, rediscover_s=5.0)
    poller.poll_once()
    poller.state["targets"] = [EngineTarget("http://b")]  # type: ignore[attr-defined]
    clock.t += 1.0
    poller.poll_once()
    assert [o.target.url for o in poller.observations()[0]] == ["http://a"]  # not yet: rediscovery every 5 s
    clock.t += 5.0
    poller.poll_once()
    assert [o.target.url for o in poller.observations()[0]] == ["http://b"] and clients["http://a"].closed
    poller.state["targets"], poller.state["note"] = [], "no engine found: Docker is down"  # type: ignore[attr-defined]
    clock.t += 5.0
    poller.poll_once()
    obs, note = poller.observations()
    assert [o.target.url for o in obs] == ["http://b"] and note  # a Docker hiccup does not blank the view
    poller.state["note"] = NO_ENGINE  # type: ignore[attr-defined]
    clock.t += 5.0
    poller.poll_once()
    assert poller.observations() == ([], NO_ENGINE)  # really stopped: say so


def container(name: str, status: str, labels: dict[str, str], who: str | None = None) -> ContainerInfo:
    labels = {LABEL_MANAGED: "true", LABEL_OWNER: who or owner(), **labels}
    return ContainerInfo(id=name, name=name, image="img", status=status, exit_code=None, oom_killed=False,
                         started_at=None, finished_at=None, labels=labels)


def runtime_with(containers: list[ContainerInfo]) -> FakeRuntime:
    rt = FakeRuntime()
    for c in containers:
        rt.seed(c)
    return rt


def test_discovery_reads_the_endpoint_label_of_running_containers() -> None:
    labels = {LABEL_ENDPOINT: "http://127.0.0.1:8888", LABEL_RECIPE: "a"}
    rt = runtime_with([container("metralectl-a", "running", labels),
                       container("metralectl-b", "exited", {LABEL_ENDPOINT: "http://127.0.0.1:8889"}),
                       container("metralectl-c", "running", {}),
                       container("metralectl-d", "running", {LABEL_ENDPOINT: "http://127.0.0.1:8890"}, "bob")])
    targets, note = discover_engines(lambda: rt)
    assert targets == [EngineTarget("http://127.0.0.1:8888", "metralectl-a", "a", "container"),
                       EngineTarget("http://127.0.0.1:8890", "metralectl-d", None, "container")]  # any owner's
    assert note is None
    assert rt.calls == [("containers", (), {"managed_only": True, "all_states": False, "mine": False})]
    assert rt.closed == 1
    assert discover_engines(lambda: FakeRuntime()) == ([], NO_ENGINE)


def test_discovery_without_docker_is_a_note() -> None:
    def broken() -> Any:
        raise DockerUnavailable("not-running", "the Docker daemon at unix:///x refuses connections",
                                "start it")

    targets, note = discover_engines(broken)
    assert targets == [] and note == "no engine found: the Docker daemon at unix:///x refuses connections"


def test_session_over_a_fake_gpu_and_engine() -> None:
    fake = fk.make_fake([fk.FakeDevice(energy_mj=fk.Counter(step_mj=50_000))])
    client = FakeClient()
    session = TopSession(NvmlProbe(nvml=fake), fixed_targets(["http://e/"]), LINES, interval_s=0.2,
                         hz=20, energy_hz=5, client_factory=lambda url, t, headers: client)
    session.start(poll_thread=False)
    try:
        session.poller.poll_once()
        time.sleep(0.2)
        session.poller.poll_once()
        session.wait_for_energy(2)
        view = session.view()
    finally:
        session.close()
    assert fake.calls[-1] == "shutdown" and client.closed
    (g,) = view.gpus
    assert g.energy.method == "counter" and g.energy.watts is not None and g.energy.watts > 0
    assert g.thermal is not None and g.thermal.state == "ok"
    (e,) = view.engines
    assert e.target.url == "http://e" and e.tokens_per_s is not None and e.tokens_per_s > 0
    data = view.to_json()
    json.dumps(data, allow_nan=False)
    assert data["sampler"]["hz"] == 20 and data["engine_note"] is None


def test_session_without_nvml_still_watches_the_engine() -> None:
    fake = fk.make_fake([fk.FakeDevice()], init_error=fk.LibraryNotFound)
    session = TopSession(NvmlProbe(nvml=fake), lambda: ([], NO_ENGINE), LINES)
    session.start(poll_thread=False)
    session.poller.poll_once()
    view = session.view()
    session.close()
    assert session.sampler is None and view.gpus == () and view.engine_note == NO_ENGINE
    assert view.to_json()["gpu"]["reason"].startswith("no GPU: no NVIDIA driver")
    assert fake.calls == ["init"]  # no error storm: one attempt, no shutdown of a library that never started


def test_session_reports_a_gpu_lost_while_sampling() -> None:
    dev = fk.FakeDevice()
    session = TopSession(NvmlProbe(nvml=fk.make_fake([dev])), lambda: ([], NO_ENGINE), LINES,
                         hz=50, energy_hz=50)
    session.start(poll_thread=False)
    dev.energy_mj = fk.GpuIsLost
    deadline = time.monotonic() + 2
    while session.sampler is not None and session.sampler.running and time.monotonic() < deadline:
        time.sleep(0.01)
    view = session.view()
    session.close()
    assert view.gpus == () and "the GPU sampler stopped" in view.to_json()["gpu"]["reason"]


def test_recorder_cuts_a_torn_tail_and_appends_lines(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "top.jsonl"
    path.parent.mkdir()
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c": 3, "trunc')
    rec = Recorder(path)
    rec.write({"d": 4})
    lines = path.read_text().splitlines()
    assert [json.loads(x) for x in lines] == [{"a": 1}, {"b": 2}, {"d": 4}] and rec.records == 1
    only_fragment = tmp_path / "frag.jsonl"
    only_fragment.write_bytes(b'{"x"')
    drop_torn_tail(only_fragment)
    assert only_fragment.read_bytes() == b""
    drop_torn_tail(tmp_path / "absent.jsonl")  # nothing to repair


def test_an_engine_of_ours_that_asks_the_token_is_scraped_with_it() -> None:
    """llama-server asks the key for /metrics too: `top` sends metralectl's engine token to an engine of ours that
    asks it (its labels), and to no other (any owner's engines are watched)."""
    from metralectl.core.labels import ENGINE_AUTH_TOKEN, LABEL_ENGINE_AUTH
    from metralectl.lifecycle import engine_token

    engine_token.ensure()
    asks = {LABEL_ENGINE_AUTH: ENGINE_AUTH_TOKEN, LABEL_OWNER: owner()}
    targets = [EngineTarget("http://a", labels=asks), EngineTarget("http://b"),
               EngineTarget("http://c", labels={**asks, LABEL_OWNER: "bob"})]
    seen: dict[str, dict[str, str] | None] = {}

    def factory(url: str, timeout: float, headers: dict[str, str] | None) -> FakeClient:
        seen[url] = headers
        return FakeClient()

    EnginePoller(lambda: (targets, None), client_factory=factory).poll_once()
    assert seen == {"http://a": {"Authorization": f"Bearer {engine_token.read()}"}, "http://b": {}, "http://c": {}}
