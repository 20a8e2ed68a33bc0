"""`swap()` on every path, against the shared fake runtime (tests/fakes/runtime.py): the old model is really
launched first (its labels are the ones `run` writes), each engine answers /health, /v1/models and /metrics on
loopback, and the swap keeps the served port. The real-daemon versions are in tests/integration/test_swap.py."""

from __future__ import annotations

import time

from typing import Any

import pytest

from metralectl.core.render import LABEL_RECIPE
from metralectl.lifecycle.events import Failed, Warning_
from metralectl.lifecycle.launch import LaunchOptions, launch
from metralectl.lifecycle.swap import (SwapDegraded, SwapInterrupted, SwapRolledBack, journal_path, repair_if_needed, swap,
                                       swaps_path)
from metralectl.seams import machine, store
from tests.fakes.lifecycle import Recorder, gb10_runtime, in_order, on_port, port_released
from tests.fakes.runtime import PREFIX, Boot, Exit, FakeRuntime, Listen, Log, engine_boot
from tests.unit.recipe_helpers import catalog
from tests.ports import own_port

OLD, NEW = "qwen3.5-27b", "qwen3.5-35b-a3b"
OLD_C, NEW_C = f"metralectl-{OLD}", f"metralectl-{NEW}"
CRASH = Boot((Log(PREFIX + "Metrale Engine starting..."), Listen(),
              Log("2026-08-26T05:35:05Z ERROR Error: Snapshot 'db821d7' has no weight files (metadata-only)",
                  after_s=0.05), Exit(1)))
OPTIONS = LaunchOptions(check_weights=False, pull=False)


@pytest.fixture(autouse=True)
def arm64(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "cpu_arch", lambda: "aarch64")  # the gb10 image is linux/arm64


def _serving_old(rt: FakeRuntime, port: int) -> None:
    """`run OLD --set resources.port=PORT`, as the CLI does it."""
    recipe, sets = on_port(catalog(), OLD, port)
    launch(recipe, catalog(), rt, options=LaunchOptions(check_weights=False, pull=False, sets=tuple(sets)))


def _setup(old: tuple[Boot, ...], new: tuple[Boot, ...]) -> tuple[FakeRuntime, int]:
    rt, port = gb10_runtime(), own_port()
    rt.script(OLD_C, *old)
    rt.script(NEW_C, *new)
    _serving_old(rt, port)
    return rt, port


def _swap(rt: FakeRuntime, listener: Recorder, **kw: Any) -> Any:
    return swap(catalog().recipe(NEW), [], catalog(), rt, on_event=listener, options=OPTIONS, **kw)


def _running(rt: FakeRuntime) -> list[tuple[str, str]]:
    return [(c.name, c.labels[LABEL_RECIPE]) for c in rt.all() if c.running]


def _last_swap() -> dict[str, Any]:
    return store.read_jsonl(swaps_path())[-1]


def test_a_swap_serves_the_new_model_on_the_old_port() -> None:
    rt, port = _setup((engine_boot("old/model"),), (engine_boot("new/model"),))
    listener = Recorder()
    result = _swap(rt, listener)
    assert result.outcome == "swapped" and result.url == f"http://127.0.0.1:{port}" and result.model == "new/model"
    assert set(result.phases) == {"drain", "stop", "boot"}
    assert in_order(listener.marks(), ["warning", "step:staging", "step:stopping", "step:starting",
                                       f"started:{NEW_C}", "ready"])
    assert "keeps the served address" in listener.of(Warning_)[0].message  # the new recipe asked for 8888
    assert rt.all() == [c for c in rt.all() if c.name == NEW_C and c.running]
    assert not journal_path().exists() and _last_swap()["outcome"] == "swapped"


def test_a_new_model_that_fails_is_rolled_back_to_the_old_one() -> None:
    rt, port = _setup((engine_boot("old/model"),), (CRASH,))
    listener = Recorder()
    with pytest.raises(SwapRolledBack, match=f"the previous recipe {OLD} serves again") as rolled:
        _swap(rt, listener)
    assert "empty-cache" in rolled.value.message
    assert in_order(listener.marks(), ["step:stopping", "step:starting", f"started:{NEW_C}", "failed:empty-cache",
                                       "warning", "step:starting", f"started:{OLD_C}", "ready"])
    assert "restoring" in listener.of(Warning_)[-1].message
    assert _running(rt) == [(OLD_C, OLD)] and len(rt.all()) == 1  # the failed new container is gone
    assert rt.health_of(OLD_C) == (200, {"status": "ready", "model": "old/model"})
    assert not journal_path().exists() and _last_swap()["outcome"] == "rolled-back"


def test_when_the_rollback_fails_too_the_swap_is_degraded_loudly_and_repairable() -> None:
    rt, port = _setup((engine_boot("old/model"), CRASH), (CRASH,))  # the old model's second start crashes
    listener = Recorder()
    with pytest.raises(SwapDegraded) as degraded:
        _swap(rt, listener)
    assert degraded.value.message.startswith("DEGRADED: nothing serves") and degraded.value.exit_code != 0
    assert "ps --repair" in (degraded.value.hint or "")
    assert [f.cause for f in listener.of(Failed)] == ["empty-cache", "empty-cache"]  # the new one, then the old one
    assert rt.all() == [] and port_released(port)  # nothing half-started, not two models
    journal = store.read_json(journal_path())
    assert journal["phase"] == "degraded" and "restore:" in journal["why"]
    assert _last_swap()["outcome"] == "degraded"
    rt.script(OLD_C, engine_boot("old/model"))  # whatever broke it is fixed: `ps --repair`
    outcome = repair_if_needed(rt, catalog())
    assert outcome == f"restored {OLD} after an interrupted swap" and _running(rt) == [(OLD_C, OLD)]
    assert not journal_path().exists()


def test_a_drain_that_does_not_finish_warns_and_goes_on() -> None:
    rt, port = _setup((engine_boot("old/model", requests_active=2),), (engine_boot("new/model"),))
    listener = Recorder()
    result = _swap(rt, listener, drain_timeout_s=0.5)
    warnings = [w.message for w in listener.of(Warning_)]
    assert any("2 requests still in flight after 0.5 s; stopping anyway" in w for w in warnings)
    assert in_order(listener.marks(), ["step:staging", "warning", "step:stopping"])
    assert result.outcome == "swapped" and result.phases["drain"] >= 0.5 and _running(rt) == [(NEW_C, NEW)]


def test_an_idle_engine_is_not_waited_for() -> None:
    rt, _ = _setup((engine_boot("old/model", requests_active=0),), (engine_boot("new/model"),))
    listener = Recorder()
    result = _swap(rt, listener, drain_timeout_s=30.0)
    assert result.phases["drain"] < 30.0 and not any("in flight" in w.message for w in listener.of(Warning_))


def test_ctrl_c_while_the_new_model_boots_leaves_a_journal_that_repair_follows() -> None:
    rt, port = _setup((engine_boot("old/model"),), (engine_boot("new/model", step_s=0.5),))
    listener = Recorder(interrupt_on=lambda e: type(e).__name__ == "ContainerStarted")
    with pytest.raises(SwapInterrupted) as said:
        _swap(rt, listener)
    # not a silent 130: the box's state in words, and the command that repairs it
    assert said.value.exit_code == 130 and "nothing serves now" in said.value.message
    assert f"{OLD} was stopped for the swap" in said.value.message and "ps --repair" in (said.value.hint or "")
    assert rt.all() == [] and port_released(port)  # the half-started new one was removed; the old one was stopped
    assert store.read_json(journal_path())["phase"] == "starting-new"
    outcome = repair_if_needed(rt, catalog())
    assert outcome == f"restored {OLD} after an interrupted swap" and _running(rt) == [(OLD_C, OLD)]


def test_a_refused_swap_releases_nothing() -> None:
    rt, port = _setup((engine_boot("old/model"),), (engine_boot("new/model"),))
    del rt.images["metrale/metrale-inference-gb10:latest"]  # the new recipe's image is gone (and --no-pull)
    listener = Recorder()
    with pytest.raises(Exception, match="is not here"):
        _swap(rt, listener)
    assert _running(rt) == [(OLD_C, OLD)] and not journal_path().exists()
    assert "step:stopping" not in listener.marks()


def test_ctrl_c_during_run_replace_says_nothing_serves_and_how_to_undo_it() -> None:
    from metralectl.lifecycle.launch import LaunchInterrupted

    rt, port = _setup((engine_boot("old/model"),), (engine_boot("new/model", step_s=0.5),))
    listener = Recorder(interrupt_on=lambda e: type(e).__name__ == "ContainerStarted")
    recipe, sets = on_port(catalog(), NEW, port)
    with pytest.raises(LaunchInterrupted) as said:
        launch(recipe, catalog(), rt, options=LaunchOptions(check_weights=False, pull=False, replace=True,
                                                            sets=tuple(sets)), on_event=listener)
    assert said.value.exit_code == 130 and "nothing serves now" in said.value.message
    assert OLD in said.value.message and f"metralectl run {OLD}" in (said.value.hint or "")
    assert rt.all() == [] and port_released(port)


def test_ctrl_c_during_a_plain_run_is_a_plain_interrupt() -> None:
    rt, port = gb10_runtime(), own_port()
    rt.script(NEW_C, engine_boot("new/model", step_s=0.5))
    listener = Recorder(interrupt_on=lambda e: type(e).__name__ == "ContainerStarted")
    recipe, sets = on_port(catalog(), NEW, port)
    with pytest.raises(KeyboardInterrupt):  # nothing was stopped for it: nothing more to say
        launch(recipe, catalog(), rt, options=LaunchOptions(check_weights=False, pull=False, sets=tuple(sets)),
               on_event=listener)
    assert rt.all() == []


SILENT = Boot((Log(PREFIX + "Metrale Engine starting...", after_s=5.0),))  # interrupted before it binds a port


def _interrupted_swap(new_boots: tuple[Boot, ...]) -> tuple[FakeRuntime, int]:
    rt, port = _setup((engine_boot("old/model"), engine_boot("old/model")), new_boots)
    with pytest.raises(SwapInterrupted):
        _swap(rt, Recorder(interrupt_on=lambda e: type(e).__name__ == "ContainerStarted"))
    return rt, port


def test_the_swap_after_an_interrupted_one_starts_the_new_model_without_booting_the_old() -> None:
    from metralectl.lifecycle.swap import swap_after_interruption

    rt, port = _interrupted_swap((SILENT, engine_boot("new/model")))
    creates_before = [c.name for c in rt.created if c.name == OLD_C]
    assert len(creates_before) == 1  # the first run
    listener = Recorder()
    result = swap_after_interruption(catalog().recipe(NEW), [], catalog(), rt, on_event=listener, options=OPTIONS)
    assert result is not None and result.outcome == "swapped" and _running(rt) == [(NEW_C, NEW)]
    assert [c.name for c in rt.created if c.name == OLD_C] == creates_before  # the old model was not booted again
    assert not journal_path().exists() and result.downtime_s > 0
    assert f"127.0.0.1:{port}" in result.url  # on the served address


def test_repair_keeps_a_kept_failed_container_and_records_the_real_downtime() -> None:
    rt, port = _interrupted_swap((SILENT,))
    rt.script("metralectl-qwen3.6-27b-fp8", CRASH)
    kept_recipe, kept_sets = on_port(catalog(), "qwen3.6-27b-fp8", own_port())
    with pytest.raises(Exception):
        launch(kept_recipe, catalog(), rt, options=LaunchOptions(check_weights=False, pull=False, keep_failed=True,
                                                                 sets=tuple(kept_sets)))
    kept = [c.name for c in rt.all() if not c.running]
    assert kept == ["metralectl-qwen3.6-27b-fp8"]
    time.sleep(0.2)
    outcome = repair_if_needed(rt, catalog())
    assert outcome == f"restored {OLD} after an interrupted swap"
    assert [c.name for c in rt.all() if not c.running] == kept  # the user's kept container is not the swap's
    record = _last_swap()
    assert record["outcome"] == "repaired" and record["downtime_s"] is not None and record["downtime_s"] >= 0.2
