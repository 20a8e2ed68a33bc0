"""The gateway's loader with a fake machine (gateway/loader.py): a load that fits starts at once; one that does not
stops the least recently used idle model first, and BEFORE the start (a sampler of the fake's running set never sees
the budget exceeded); a pinned model is never evicted; a busy model is drained (its request finishes), not stopped
mid-request, and a drain that does not end refuses the load (503) with the busy model untouched; nothing evictable:
503 with the numbers; a launch that fails: 502 with the engine's reason."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from metralectl.core.budget import Budget, Footprint
from metralectl.gateway.loader import Held, Loader, LoadRefused


class FakeOps:
    def __init__(self, budget: float, sizes: dict[str, float], running: tuple[str, ...] = (),
                 fail: dict[str, str] | None = None) -> None:
        self.size, self.running = sizes, list(running)
        self._budget = budget
        self.fail = fail or {}
        self.log: list[str] = []
        self.peak = sum(sizes[r] for r in running)

    def budget(self) -> Budget:
        return Budget(self._budget, "--budget")

    def footprint(self, recipe: str) -> Footprint:
        return Footprint(recipe, self.size[recipe], "estimate")

    def held(self) -> list[Held]:
        return [Held(Footprint(r, self.size[r], "estimate"), True) for r in self.running]

    def stop(self, recipe: str) -> None:
        self.log.append(f"stop {recipe}")
        self.running.remove(recipe)

    def start(self, recipe: str, progress: Callable[[], None]) -> None:
        self.log.append(f"start {recipe}")
        if recipe in self.fail:
            raise RuntimeError(self.fail[recipe])
        self.running.append(recipe)
        self.peak = max(self.peak, sum(self.size[r] for r in self.running))


def run(what: object) -> object:
    """Run a coroutine, or a loader's load (made inside the loop when given as a callable)."""
    async def main() -> object:
        got = what() if callable(what) else what
        return await got  # type: ignore[misc]
    return asyncio.run(main())


NAMES = {"a": "a", "b": "b", "c": "c", "alias-c": "c"}


def test_a_load_that_fits_starts_at_once_and_one_that_does_not_evicts_the_lru_idle_model_first() -> None:
    ops = FakeOps(20, {"a": 8, "b": 8, "c": 8})
    loader = Loader(ops, NAMES)

    async def scenario() -> None:
        await loader.ensure("a")
        loader.begin("a"); loader.end("a")  # noqa: E702  (a used, then b: a is the least recently used)
        await loader.ensure("b")
        time.sleep(0.01)
        loader.begin("b"); loader.end("b")  # noqa: E702
        await loader.ensure("c")

    run(scenario())
    assert ops.log == ["start a", "start b", "stop a", "start c"]  # stopped before the start
    assert ops.peak <= 20 and sorted(ops.running) == ["b", "c"]
    assert loader.recipe_for("alias-c") == "c" and loader.recipe_for("nope") is None


def test_a_pinned_model_is_never_evicted_and_nothing_evictable_is_a_503_with_the_numbers() -> None:
    ops = FakeOps(20, {"a": 8, "b": 8, "c": 8}, running=("a", "b"))
    loader = Loader(ops, NAMES, pins=("a",))
    run(lambda: loader.ensure("c"))
    assert ops.log == ["stop b", "start c"]
    pinned = Loader(FakeOps(20, {"a": 8, "b": 8, "c": 8}, running=("a", "b")), NAMES, pins=("a", "b"))
    with pytest.raises(LoadRefused) as refused:
        run(lambda: pinned.ensure("c"))
    assert refused.value.status == 503 and refused.value.retry_after == 30
    assert refused.value.message == ("cannot load `c`: c needs 8.00 GB, free 4.00 GB of budget 20.00 GB (--budget); "
                                     "held by a 8.00 GB, b 8.00 GB; nothing more can be evicted (pinned or not "
                                     "ours: a, b)")


def test_a_model_larger_than_the_whole_budget_is_refused_at_once_with_no_retry_and_nothing_stopped() -> None:
    ops = FakeOps(20, {"a": 8, "b": 8, "c": 24}, running=("a", "b"))
    loader = Loader(ops, NAMES)
    with pytest.raises(LoadRefused) as refused:
        run(lambda: loader.ensure("c"))
    assert (refused.value.status, refused.value.code, refused.value.retry_after) == (503, "model_too_large", None)
    assert refused.value.message == ("cannot load `c`: it needs 24.00 GB, more than the whole budget 20.00 GB "
                                     "(--budget); it cannot be served on this box as it is (a leaner quant, or a "
                                     "larger budget)")
    assert ops.log == [] and ops.running == ["a", "b"]  # nobody evicted for a load that could never fit


def test_a_busy_model_is_drained_first_never_stopped_mid_request() -> None:
    ops = FakeOps(20, {"a": 8, "b": 8, "c": 8}, running=("a", "b"))
    loader = Loader(ops, NAMES, drain_timeout_s=5.0)
    order: list[str] = []

    async def scenario() -> None:
        loader.begin("a")
        loader.begin("b")  # both busy: b is the most recent, a is drained

        async def finish_a() -> None:
            await asyncio.sleep(0.2)
            order.append("a's request done")
            loader.end("a")

        finishing = asyncio.ensure_future(finish_a())
        load = loader.ensure("c")
        await asyncio.sleep(0.1)
        assert loader.holds("a") and loader.holds("c") and ops.log == []  # draining: nothing new goes to a
        await load
        await finishing
        loader.end("b")

    run(scenario())
    assert order == ["a's request done"] and ops.log == ["stop a", "start c"]


def test_a_drain_that_does_not_end_refuses_the_load_and_leaves_the_busy_model() -> None:
    ops = FakeOps(20, {"a": 8, "b": 8, "c": 8}, running=("a", "b"))
    loader = Loader(ops, NAMES, drain_timeout_s=0.2, pins=("b",))

    async def scenario() -> None:
        loader.begin("a")
        await loader.ensure("c")

    with pytest.raises(LoadRefused) as refused:
        run(scenario())
    assert refused.value.status == 503 and "did not finish within 0.2 s" in refused.value.message
    assert ops.log == [] and not loader.holds("a")  # untouched, and served again


def test_a_launch_that_fails_is_a_502_with_the_engines_reason() -> None:
    ops = FakeOps(20, {"a": 8, "b": 8, "c": 8}, fail={"c": "start failed (corrupt-weights): invalid magic"})
    with pytest.raises(LoadRefused) as refused:
        run(lambda: Loader(ops, NAMES).ensure("c"))
    assert refused.value.status == 502 and refused.value.code == "model_load_failed"
    assert refused.value.message == "loading `c` failed: start failed (corrupt-weights): invalid magic"
