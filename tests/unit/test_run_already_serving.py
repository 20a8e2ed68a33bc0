"""`run` of exactly what serves is done already (issue 28, item 5): the same recipe with the same settings
(its spec hash: image, flags, environment, mounts, port) answers with the served endpoint and starts
nothing; the same recipe with other `--set`s is refused unless `--replace`; one that runs but does not
answer ready is refused, naming its health. Against the shared fake runtime (tests/fakes/), whose engine
answers /health over real loopback HTTP; the CLI's own words are in tests/integration/test_exit_walk.py."""

from __future__ import annotations

from typing import Any

import pytest

from metralectl.core.render import LABEL_RUN_ID
from metralectl.errors import ExitCode, MetralError
from metralectl.lifecycle.launch import LaunchOptions, launch
from metralectl.lifecycle.preflight import launch_refusal, observe
from metralectl.seams import machine
from tests.fakes.lifecycle import Recorder, gb10_runtime, on_port
from tests.fakes.runtime import Answer, Boot, FakeRuntime, Listen, engine_boot
from tests.ports import own_port
from tests.unit.recipe_helpers import catalog

NAME = "qwen3.5-27b"
CONTAINER = f"metralectl-{NAME}"


@pytest.fixture(autouse=True)
def arm64(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "cpu_arch", lambda: "aarch64")  # the gb10 image is linux/arm64


def _launch(rt: FakeRuntime, port: int, listener: Recorder | None = None, **options: Any) -> Any:
    recipe, sets = on_port(catalog(), NAME, port)
    opts = LaunchOptions(check_weights=False, pull=False, sets=tuple(sets), **options)
    return launch(recipe, catalog(), rt, options=opts, on_event=listener or Recorder())


def test_run_of_what_serves_answers_with_its_endpoint_and_starts_nothing() -> None:
    rt, port = gb10_runtime(), own_port()
    rt.script(CONTAINER, engine_boot("Qwen/Qwen3.5-27B"))
    first = _launch(rt, port)
    assert first.already_serving is False
    (served,) = rt.all()

    again = Recorder()
    second = _launch(rt, port, again)
    assert second.already_serving is True
    assert (second.url, second.model, second.container, second.container_id, second.run_id) == (
        first.url, "Qwen/Qwen3.5-27B", CONTAINER, served.id, served.labels[LABEL_RUN_ID])
    assert rt.all() == [served] and rt.all()[0].running  # the same container, untouched
    assert again.marks() == ["step:serving"], again.marks()  # no image, weights or port checks, no start
    assert "already served with these settings" in again.events[0].detail  # type: ignore[attr-defined]


def test_the_same_recipe_with_other_settings_is_refused_unless_replace() -> None:
    rt, port = gb10_runtime(), own_port()
    rt.script(CONTAINER, engine_boot())
    _launch(rt, port)
    (served,) = rt.all()
    with pytest.raises(MetralError) as refused:
        _launch(rt, own_port())  # --set resources.port=another: another spec
    assert refused.value.exit_code == ExitCode.FAILED
    assert refused.value.message.startswith(f"{NAME} is already being served by metralectl with other settings: "
                                            f"{CONTAINER} ({NAME})"), refused.value.message
    assert f"`metralectl swap {NAME}` with these --set" in (refused.value.hint or "")
    assert rt.all() == [served]

    restarted = _launch(rt, port, replace=True)  # --replace: asked to start it again, it does
    assert restarted.already_serving is False and restarted.run_id != served.labels[LABEL_RUN_ID]
    assert [c.id for c in rt.all()] == [restarted.container_id] != [served.id]


def test_running_with_these_settings_but_not_ready_is_refused_with_its_health() -> None:
    rt, port = gb10_runtime(), own_port()
    rt.script(CONTAINER, Boot((Listen(), Answer(200, {"status": "ready", "model": "m"}),
                               Answer(503, {"status": "faulted", "reason": "Xid 79"}, after_s=1.5))))
    _launch(rt, port)
    import time

    deadline = time.monotonic() + 10
    while rt.health_of(CONTAINER)[0] != 503:  # type: ignore[index]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with pytest.raises(MetralError) as refused:
        _launch(rt, port)
    assert refused.value.exit_code == ExitCode.FAILED
    assert f"{NAME} is already running with these settings ({CONTAINER}), but its engine is not ready" in \
        refused.value.message and "503 faulted: Xid 79" in refused.value.message, refused.value.message
    assert f"`metralectl run {NAME} --replace` restarts it" in (refused.value.hint or "")
    assert len(rt.all()) == 1 and rt.all()[0].running


def test_the_dashboards_plan_says_it_is_served_instead_of_offering_a_swap_to_itself() -> None:
    from metralectl.core.render import spec_for

    rt, port = gb10_runtime(), own_port()
    rt.script(CONTAINER, engine_boot())
    _launch(rt, port)
    recipe, _ = on_port(catalog(), NAME, port)
    spec = spec_for(catalog(), recipe)
    refused = launch_refusal(recipe, spec, LaunchOptions(check_weights=False, pull=False),
                             observe(recipe, catalog(), rt, spec))
    assert refused is not None and refused.fix is None  # not "swap": a swap to itself is refused too
    assert refused.error.message == f"{NAME} is already being served with these settings: {CONTAINER} ({NAME})"
