"""The gateway's loader with a fake machine (gateway/loader.py): a load that fits starts at once; one that does not
stops the least recently used idle model first, and BEFORE the start (a sampler of the fake's running set never sees
the budget exceeded); a pinned model is never evicted; a busy model is drained (its request finishes), not stopped
mid-request, and a drain that does not end refuses the load (503) with the busy model untouched; nothing evictable:
503 with the numbers; a launch that fails: 502 with the engine's reason. /v1/models lists a recipe larger than the
whole budget `too_large` with its need and the budget (found on a worker thread, kept a while), and one whose size or
budget is unknown, or whose ops fail, `loadable`."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable

import pytest

from metralectl.core.budget import Budget, Footprint
from metralectl.gateway.loader import Held, Loader, LoadRefused
from metralectl.gateway.oversize import Oversize
from metralectl.gateway.routes import Table
from metralectl.gateway.server import Gateway, serve


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


# /v1/models: a recipe larger than the whole budget is listed `too_large`, with its numbers (gateway/oversize.py)

class SizedOps(FakeOps):
    """budget() and footprint() as given: a number, None (unknown), or an exception raised; each call's thread."""

    def __init__(self, budget: float | None | Exception, sizes: dict[str, float | None | Exception]) -> None:
        super().__init__(0, {})
        self.given_budget, self.sizes = budget, sizes
        self.threads: list[int] = []

    def budget(self) -> Budget:
        self.threads.append(threading.get_ident())
        if isinstance(self.given_budget, Exception):
            raise self.given_budget
        return Budget(self.given_budget, "--budget")

    def footprint(self, recipe: str) -> Footprint:
        self.threads.append(threading.get_ident())
        size = self.sizes[recipe]
        if isinstance(size, Exception):
            raise size
        return Footprint(recipe, size, "estimate")


class NothingServed:
    def lifecycle(self) -> tuple[None, None]:
        return None, None

    def scan(self) -> Table:
        return Table()

    def close(self) -> None:
        pass


def listed(ops: SizedOps, names: dict[str, str]) -> tuple[dict[str, dict[str, object]], int]:
    """GET /v1/models of a gateway serving nothing that may load `names` with `ops`: each id's entry, and the
    event loop's thread."""
    async def ask() -> tuple[dict[str, dict[str, object]], int]:
        gateway = Gateway(NothingServed(), loader=Loader(ops, names))  # type: ignore[arg-type]
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        ready = asyncio.Event()
        server = asyncio.ensure_future(serve(gateway, sock, lambda _table: ready.set()))
        await ready.wait()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = await reader.read()
            writer.close()
        finally:
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), answer[:300]
        return {m["id"]: m for m in json.loads(body)["data"]}, threading.get_ident()

    got = run(ask())
    assert isinstance(got, tuple)
    return got


def test_models_lists_a_recipe_over_the_whole_budget_as_too_large_with_its_numbers_and_the_rest_loadable() -> None:
    ops = SizedOps(24.0, {"a": 8.0, "big": 27.5, "edge": 24.0, "unknown": None, "broken": RuntimeError("no weights")})
    names = {"a": "a", "big": "big", "big-alias": "big", "edge": "edge", "unknown": "unknown", "broken": "broken"}
    models, loop_thread = listed(ops, names)
    statuses = {name: m["status"] for name, m in models.items()}
    assert statuses == {"a": "loadable", "big": "too_large", "big-alias": "too_large", "edge": "loadable",
                        "unknown": "loadable", "broken": "loadable"}, models
    assert models["big"] == {"id": "big", "object": "model", "created": 0, "owned_by": "metralectl",
                             "recipe": "big", "status": "too_large", "needs_gb": 27.5, "budget_gb": 24.0}
    assert all("needs_gb" not in models[name] for name in ("a", "edge", "unknown", "broken"))
    assert ops.threads and loop_thread not in ops.threads  # the ops were asked on a worker thread, never the loop's


@pytest.mark.parametrize("budget", [None, RuntimeError("NVML failed")], ids=["unknown", "raises"])
def test_models_with_a_budget_unknown_or_failing_lists_every_recipe_loadable(budget: None | Exception) -> None:
    models, _ = listed(SizedOps(budget, {"a": 8.0, "big": 27.5}), {"a": "a", "big": "big"})
    assert {name: m["status"] for name, m in models.items()} == {"a": "loadable", "big": "loadable"}


def test_the_too_large_finding_is_kept_for_its_lifetime_then_found_again() -> None:
    ops = SizedOps(24.0, {"a": 8.0, "big": 27.5})
    now = [100.0]
    oversize = Oversize(ops, ["a", "big"], refresh_s=30.0, clock=lambda: now[0])

    async def scenario() -> list[set[str]]:
        seen = [set(await oversize.get())]
        asked = len(ops.threads)
        ops.sizes["a"] = 30.0  # the box changed (a larger quant of a)
        now[0] += 29.0
        seen.append(set(await oversize.get()))  # within its lifetime: the same finding, the ops not asked again
        assert len(ops.threads) == asked
        now[0] += 2.0
        await oversize.get()  # past it: a new finding is begun (the old one answers meanwhile)
        assert oversize._task is not None
        await oversize._task
        seen.append(set(await oversize.get()))
        return seen

    assert run(scenario()) == [{"big"}, {"big"}, {"a", "big"}]


class GpuOps(FakeOps):
    """A box of `gpus` GPUs, each with the budget; a start goes on the least-held GPU (as launch places it)."""

    def __init__(self, budget: float, sizes: dict[str, float], gpus: int) -> None:
        super().__init__(budget, sizes)
        self.gpus, self.on = gpus, {}  # type: ignore[var-annotated]

    def budget(self) -> Budget:
        return Budget(self._budget, "--budget", self.gpus)

    def footprint(self, recipe: str) -> Footprint:
        return Footprint(recipe, self.size[recipe], "estimate", gpus=1)

    def held(self) -> list[Held]:
        return [Held(Footprint(r, self.size[r], "estimate", (self.on[r],)), True) for r in self.running]

    def start(self, recipe: str, progress: Callable[[], None]) -> None:
        load = [sum(self.size[r] for r in self.running if self.on[r] == i) for i in range(self.gpus)]
        self.on[recipe] = min(range(self.gpus), key=lambda i: (load[i], i))
        super().start(recipe, progress)
        assert load[self.on[recipe]] + self.size[recipe] <= self._budget  # never over a GPU's budget


def test_on_a_box_of_several_gpus_a_model_loads_on_a_free_gpu_and_evicts_only_what_makes_room() -> None:
    ops = GpuOps(80, {"a": 70, "b": 70, "c": 70}, gpus=2)
    loader = Loader(ops, NAMES)

    async def scenario() -> None:
        await loader.ensure("a")
        loader.begin("a"); loader.end("a")  # noqa: E702
        await loader.ensure("b")  # GPU 1 is free: nothing stopped (the sum rule would stop a)
        time.sleep(0.01)
        loader.begin("b"); loader.end("b")  # noqa: E702
        await loader.ensure("c")  # no GPU has room: the least recently used (a) goes, and only it

    run(scenario())
    assert ops.log == ["start a", "start b", "stop a", "start c"]
    assert ops.on == {"a": 0, "b": 1, "c": 0} and sorted(ops.running) == ["b", "c"]


def test_on_a_box_of_several_gpus_nothing_evictable_names_the_gpus() -> None:
    ops = GpuOps(80, {"a": 70, "b": 70, "c": 70}, gpus=2)
    ops.running, ops.on = ["a", "b"], {"a": 0, "b": 1}
    loader = Loader(ops, NAMES, pins=("a", "b"))
    with pytest.raises(LoadRefused) as refused:
        run(lambda: loader.ensure("c"))
    assert refused.value.status == 503 and refused.value.code == "model_does_not_fit"
    assert refused.value.message.startswith("cannot load `c`: c needs 70.00 GB on 1 of this box's 2 GPUs")
    assert "GPU 0: free 10.00 GB (held by a 70.00 GB)" in refused.value.message
    assert ops.log == []
