"""The memory budget that replaced "one model per box" (issue 32 item 2): the pure rule (core/budget.py: the
footprint from the fit estimate and the measured memory, the refusal's numbers, the gateway's eviction plan: least
recently used idle first, busy ones drained, pinned ones never) and `run` beside a served model on its own port, its
refusal with the numbers, `stop` with several served needing a name (64), against the shared fake runtime."""

from __future__ import annotations

from typing import Any

import pytest

from metralectl import paths
from metralectl.core.budget import (Budget, Footprint, Resident, Room, footprint_of_estimate, plan_room, short_words,
                                    with_measured)
from metralectl.core.fit import MemoryEstimate, Part
from metralectl.errors import ExitCode, MetralError, UsageError
from metralectl.lifecycle.launch import LaunchOptions, launch
from metralectl.seams import machine
from tests.fakes.lifecycle import Recorder, gb10_runtime, on_port
from tests.fakes.runtime import FakeRuntime, engine_boot
from tests.ports import own_port
from tests.unit.recipe_helpers import catalog

A, B = "qwen3.5-27b", "qwen3.5-35b-a3b"


def _est(weights: float | None, kv: float | None, budget: float | None) -> MemoryEstimate:
    return MemoryEstimate(Part("weights", weights, "w"), Part("KV pool", kv, "kv"), Part("reserve", 0.0, "r"),
                          Part("budget", budget, "128 GB unified × 0.8"), "gb10")


def test_a_footprint_is_the_estimate_or_the_share_the_engine_takes() -> None:
    assert footprint_of_estimate("m", _est(10, 2, 100), "static-weights-and-kv").gb == 12
    assert footprint_of_estimate("m", _est(10, 2, 100), "none").gb == 12
    vllm = footprint_of_estimate("m", _est(10, 2, 100), "fraction-of-total")  # vLLM takes its share whatever
    assert vllm.gb == 100 and "128 GB unified" in vllm.basis
    assert footprint_of_estimate("m", _est(None, 2, 100), "none").gb is None
    assert footprint_of_estimate("m", _est(None, 2, 100), "none").basis == "unknown: weights: w"
    assert with_measured(Footprint("m", 12, "estimate"), 15.0, "NVML") == Footprint("m", 15.0, "measured (NVML)")
    assert with_measured(Footprint("m", 12, "estimate"), 3.0, "RSS").gb == 12
    assert with_measured(Footprint("m", None, "unknown"), 3.0, "RSS").gb == 3.0


def test_the_refusal_says_the_numbers() -> None:
    room = Room(Budget(24.0, "--budget"), Footprint("b", 14.0, "estimate"),
                (Footprint("a", 12.0, "estimate"),))
    assert not room.fits and room.free_gb == 12.0
    assert short_words(room) == "b needs 14.00 GB, free 12.00 GB of budget 24.00 GB (--budget); held by a 12.00 GB"
    assert Room(Budget(26.0, "x"), Footprint("b", 14.0, ""), (Footprint("a", 12.0, ""),)).fits
    unknown = Room(Budget(None, "no GPU memory known"), Footprint("b", 1.0, ""), ())
    assert not unknown.fits and "budget is unknown (no GPU memory known)" in short_words(unknown)


def test_the_plan_evicts_the_least_recently_used_idle_model_first() -> None:
    residents = [Resident("old", 10, last_used=1.0), Resident("new", 10, last_used=5.0),
                 Resident("mid", 10, last_used=3.0)]
    assert plan_room(5, 40, residents).evict == ()  # type: ignore[union-attr]
    assert plan_room(15, 40, residents).evict == ("old",)  # type: ignore[union-attr]
    assert plan_room(25, 40, residents).evict == ("old", "mid")  # type: ignore[union-attr]


def test_pinned_and_loading_models_are_never_evicted_and_busy_ones_are_drained_last() -> None:
    residents = [Resident("pinned", 10, last_used=0.0, pinned=True), Resident("busy", 10, last_used=1.0, in_flight=2),
                 Resident("idle", 10, last_used=9.0), Resident("loading", 5, last_used=0.0, loading=True)]
    plan = plan_room(15, 40, residents)
    assert plan is not None and plan.evict == ("idle",) and plan.drain == ()
    plan = plan_room(25, 40, residents)
    assert plan is not None and plan.evict == ("idle",) and plan.drain == ("busy",)  # drained, never killed
    assert plan_room(36, 40, residents) is None  # only pinned and loading would be left to stop
    assert plan_room(None, 40, residents) is None and plan_room(5, None, residents) is None


@pytest.fixture()
def gb10(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "cpu_arch", lambda: "aarch64")
    monkeypatch.setattr(machine, "gpu_names", lambda *a: [])


def _launch(rt: FakeRuntime, name: str, port: int, listener: Recorder | None = None, **options: Any) -> Any:
    recipe, sets = on_port(catalog(), name, port)
    opts = LaunchOptions(check_weights=False, pull=False, sets=tuple(sets), **options)
    return launch(recipe, catalog(), rt, options=opts, on_event=listener or Recorder())


def test_run_of_a_second_model_that_fits_starts_beside_on_its_own_port(gb10: None) -> None:
    (paths.config_dir() / "box.yaml").write_text("budget: 250  # GB\n")  # two GB10 shares (101.75 GB each)
    rt, port = gb10_runtime(), own_port()
    rt.script(f"metralectl-{A}", engine_boot("Qwen/A"))
    rt.script(f"metralectl-{B}", engine_boot("Qwen/B"))
    first = _launch(rt, A, port)
    moved = Recorder()
    second = _launch(rt, B, port, moved)  # the same port asked for: held by A, so the next free one
    assert second.url != first.url and not second.already_serving
    assert sorted(c.name for c in rt.all() if c.running) == [f"metralectl-{A}", f"metralectl-{B}"]
    assert any(getattr(e, "detail", "").endswith(f"({port} is held by what serves)") for e in moved.events)
    again = _launch(rt, B, port)  # run of it again: served already, on the port it was moved to
    assert again.already_serving and again.url == second.url


def test_run_of_a_second_model_that_does_not_fit_is_refused_with_the_numbers(gb10: None) -> None:
    rt, port = gb10_runtime(), own_port()
    rt.script(f"metralectl-{A}", engine_boot("Qwen/A"))
    rt.script(f"metralectl-{B}", engine_boot("Qwen/B"))
    _launch(rt, A, port)
    with pytest.raises(MetralError) as refused:
        _launch(rt, B, own_port(), budget_gb=150.0)
    message, hint = refused.value.message, refused.value.hint or ""
    assert message.startswith(f"{B} needs 101.75 GB, free 48.25 GB of budget 150.00 GB (--budget); held by {A} "
                              "101.75 GB"), message
    assert f"`metralectl run {B} --replace`" in hint and f"`metralectl swap {B}`" in hint
    assert f"`metralectl stop {A}`" in hint
    assert refused.value.exit_code == ExitCode.FAILED
    assert [c.name for c in rt.all()] == [f"metralectl-{A}"]
    replaced = _launch(rt, B, own_port(), budget_gb=150.0, replace=True)  # --replace: as before
    assert [c.name for c in rt.all() if c.running] == [replaced.container]


def test_stop_with_several_served_needs_a_name_or_all() -> None:
    from metralectl.lifecycle.stop import select

    rt = FakeRuntime()
    rt.serving(A)
    rt.serving(B)
    with pytest.raises(UsageError) as asked:
        select(rt, None, False)
    assert asked.value.exit_code == ExitCode.USAGE
    assert asked.value.message == f"2 models are served ({A}, {B}); name one or use --all"
    assert "`metralectl stop RECIPE`" in (asked.value.hint or "")
    assert [c.name for c in select(rt, B, False)] == [f"metralectl-{B}"]
    assert len(select(rt, None, True)) == 2


def test_vllm_s_cpu_build_told_a_cache_size_takes_that_not_its_memory_fraction() -> None:
    """vLLM's CPU build with VLLM_CPU_KVCACHE_SPACE=N allocates N GiB of cache and no share of the RAM: its footprint
    is weights + N GiB + its processes, not (RAM − what the OS keeps) × memory-utilization (11 GB on a 25 GB box for
    a model that held 3 GB: the gateway evicted everything for it, and `run` refused it beside a 0.5 GB model)."""
    from dataclasses import replace

    from metralectl.core.engines.vllm import CPU_PROCESSES_GB
    from metralectl.core.fit import estimate

    cat = catalog()
    gpu_recipe = cat.recipes["qwen3.6-35b-a3b-vllm"]
    recipe, model = replace(gpu_recipe, hardware="cpu"), cat.model_of(gpu_recipe)
    cpu, meaning = cat.hardware["cpu"], cat.engines["vllm"].memory_meaning

    def footprint(env: dict[str, str]) -> Footprint:
        est = estimate(replace(recipe, env=env), model, cpu, None, meaning, host_ram_gb=25.0,
                       roles=cat.engines["vllm"].fit_roles)
        return footprint_of_estimate(recipe.name, est, meaning)

    share = footprint({})  # no cache size: its CPU worker takes memory-utilization of the RAM, as on a GPU
    assert share.gb is not None and "utilization" in share.basis, share
    told = footprint({"VLLM_CPU_KVCACHE_SPACE": "2"})
    weights = estimate(recipe, model, cpu, None, meaning, host_ram_gb=25.0).weights.gb
    assert weights is not None and told.basis == "estimate", told
    assert told.gb == pytest.approx(weights + 2 * 2**30 / 1e9 + CPU_PROCESSES_GB), told
    assert told.gb < share.gb or weights >= share.gb  # (the share is the weights where they alone exceed it)
    for ignored in ("0", "", "two"):  # vLLM's auto size, or a value it refuses itself: the share stands
        assert footprint({"VLLM_CPU_KVCACHE_SPACE": ignored}) == share


def test_a_checkpoint_in_fp32_or_fp16_is_sized_by_its_parameters() -> None:
    from metralectl.core.fit import WEIGHT_BITS

    assert WEIGHT_BITS["fp32"] == 32.0 and WEIGHT_BITS["fp16"] == 16.0
