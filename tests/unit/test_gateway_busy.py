"""`gateway --busy-poll MS` (gateway/busy.py): the event loop kept polling for a window after each read, on
asyncio's loop and uvloop; the window counted on a clock of the test's own (no wall-clock windows asserted); the
reads of a real gateway on loopback poke it; box.yaml's `gateway-busy-poll` read and refused by line."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from metralectl.gateway import busy
from metralectl.gateway.server import Limits
from tests.unit.test_gateway_cpus import _box_yaml
from tests.unit.test_gateway_pool import Engine, chat, gateway_before


def _loops() -> list[Callable[[Coroutine[Any, Any, None]], None]]:
    runs: list[Callable[[Coroutine[Any, Any, None]], None]] = [asyncio.run]
    try:
        import uvloop
    except ImportError:
        return runs
    return [*runs, uvloop.run]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("run", _loops(), ids=lambda run: run.__module__)
def test_a_poke_keeps_the_loop_turning_until_the_window_passes_with_no_read(
        run: Callable[[Coroutine[Any, Any, None]], None]) -> None:
    clock = Clock()
    poller = busy.BusyPoll(0.05, clock)

    async def turns(count: int) -> None:
        for _ in range(count):
            await asyncio.sleep(0)

    async def go() -> None:
        poller.start(asyncio.get_running_loop())
        poller.poke()
        await turns(20)
        assert poller.awake and poller.turns >= 10  # a turn of the callback in each turn of the loop
        clock.now += 0.04
        poller.poke()  # a read 40 ms in: awake for 50 ms from the callback's next turn
        await turns(3)
        clock.now += 0.04  # 80 ms after the first poke, 40 after the second: still awake
        await turns(3)
        assert poller.awake
        clock.now += 0.02  # past the window since the last read
        await turns(3)
        assert not poller.awake
        asleep = poller.turns
        await turns(20)
        assert poller.turns == asleep  # asleep, it costs no turn
        poller.poke()  # a read wakes it again
        await turns(3)
        assert poller.awake and poller.turns > asleep
        poller.stop()
        await turns(3)
        assert not poller.awake
        stopped = poller.turns
        poller.poke()  # stopped: a read after the gateway's stop does nothing
        await turns(5)
        assert poller.turns == stopped and not poller.awake

    run(go())


def test_off_sets_nothing_and_a_window_sets_the_one_the_reads_poke() -> None:
    async def go() -> None:
        assert busy.start(0) is None and busy.ACTIVE[0] is None
        poller = busy.start(0.01)
        assert poller is not None and busy.ACTIVE[0] is poller
        busy.stop()
        assert busy.ACTIVE[0] is None and poller.loop is None

    asyncio.run(go())


def test_a_gateway_with_a_window_is_awake_after_its_reads_and_answers_the_same() -> None:
    """The real gateway on loopback, in front of a stub engine: its client's and its engine's reads poke the poller,
    which is awake after a request, and the answer is whole; stopped with the gateway."""
    pokes: list[str] = []

    async def go() -> None:
        async with gateway_before(Engine().handle, Limits(busy_poll_s=5.0)) as (_gateway, port):
            poller = busy.ACTIVE[0]
            assert poller is not None
            poke = poller.poke

            def noted() -> None:
                pokes.append("poke")
                poke()

            poller.poke = noted  # type: ignore[method-assign]
            await chat(port)
            assert poller.awake and poller.turns > 0
        assert busy.ACTIVE[0] is None and not poller.awake

    asyncio.run(go())
    assert len(pokes) >= 2  # the request's read, and the engine's pieces


def test_box_yaml_sets_the_window_and_refuses_what_is_not_one_by_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from metralectl.errors import RecipeInvalid
    from metralectl.lifecycle.budget import box_config

    _box_yaml(tmp_path, monkeypatch, "budget: 24\n")
    assert box_config().gateway_busy_poll_ms == 0
    _box_yaml(tmp_path, monkeypatch, "gateway-busy-poll: 50\n")
    assert box_config().gateway_busy_poll_ms == 50
    for bad, said in (("gateway-busy-poll: fast\n", "must be a number"), ("gateway-busy-poll: -1\n", "at least 0"),
                      ("gateway-busy-poll: 20000\n", "at most 10000"), ("gateway-busy-poll: .nan\n", "not a finite number"),
                      ("gateway-busy-poll: .inf\n", "not a finite number"), ("gateway-busy-poll: true\n", "must be a number")):
        _box_yaml(tmp_path, monkeypatch, "budget: 24\n" + bad)
        with pytest.raises(RecipeInvalid) as refused:
            box_config()
        text = "\n".join(p.render() if hasattr(p, "render") else str(p) for p in refused.value.problems)
        assert said in text and "gateway-busy-poll" in text and ":2" in text, text  # the key, the file's line
