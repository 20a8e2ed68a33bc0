"""GPU placement on a box of several GPUs (core/placement.py, core/budget.Room): a new engine goes on the GPUs that
hold least (ties: the lower index), fits when each keeps held + need within the per-GPU budget, never on a GPU whose
holder's footprint is unknown; a box of one GPU keeps the sum rule; the `gpu-ids` label is read back strictly."""

from __future__ import annotations

from dataclasses import replace

import pytest

from metralectl.core.budget import Budget, Footprint, Resident, Room, RoomPlan, plan_gpus, plan_room, short_words
from metralectl.core.placement import Holding, choose, devices_held, held_per_gpu, ids_text, parse_ids

BUDGET = Budget(80.0, "NVIDIA H100 80GB HBM3 memory")


def test_the_least_held_gpus_are_chosen_ties_by_index() -> None:
    held = [Holding("a", 60.0, (0,)), Holding("b", 10.0, (2,)), Holding("c", 10.0, (3,))]
    p = choose(4, 80.0, held, 30.0, 2)
    assert p.chosen == (1, 2) and p.fits  # GPU 1 holds nothing; 2 and 3 tie at 10 GB: the lower index
    assert choose(4, 80.0, held, 30.0, 1).chosen == (1,)
    assert choose(8, 80.0, [], 30.0, 3).chosen == (0, 1, 2)


def test_a_set_that_does_not_fit() -> None:
    held = [Holding("a", 60.0, (0, 1)), Holding("b", 70.0, (2, 3))]
    p = choose(4, 80.0, held, 30.0, 1)
    assert p.chosen == (0,) and not p.fits
    assert choose(4, 80.0, held, 20.0, 2).fits  # GPUs 0 and 1: 60 + 20
    assert not choose(4, 80.0, held, 20.5, 2).fits
    assert not choose(4, 80.0, held, 10.5, 4).fits  # GPUs 2 and 3: 70 + 10.5


def test_too_many_gpus_asked() -> None:
    p = choose(2, 80.0, [], 10.0, 4)
    assert p.chosen == () and not p.fits


def test_unknown_holding_never_has_room_but_others_do() -> None:
    held = [Holding("a", None, (0,))]
    assert held_per_gpu(2, held) == (None, 0.0)
    p = choose(2, 80.0, held, 10.0, 1)
    assert p.chosen == (1,) and p.fits
    assert not choose(2, 80.0, held, 10.0, 2).fits
    assert not choose(2, 80.0, [], None, 1).fits  # the new one's footprint unknown
    assert not choose(2, None, [], 10.0, 1).fits  # the budget unknown


def test_held_sums_per_gpu() -> None:
    held = [Holding("a", 20.0, (0, 1)), Holding("b", 30.0, (1,)), Holding("c", 5.0, (7,))]
    assert held_per_gpu(3, held) == (20.0, 50.0, 0.0)  # an index beyond the box is no GPU of it


def test_parse_ids_is_strict() -> None:
    assert parse_ids("1,3", 8) == (1, 3)
    assert parse_ids("0", 1) == (0,)
    for bad in ("", None, "1,,3", "1, 3", "-1", "8", "1,1", "a", "1.0", "٣", "1;rm", "9" * 300):
        assert parse_ids(bad, 8) is None, bad
    assert ids_text((1, 3)) == "1,3"


def test_devices_held() -> None:
    assert devices_held("all", 4, None) == (0, 1, 2, 3)
    assert devices_held("none", 4, "1") == ()
    assert devices_held(2, 4, None, accelerator=False) == ()
    assert devices_held(2, 8, "5,6") == (5, 6)
    assert devices_held(2, 8, None) == (0, 1)  # an older metralectl's engine: the first ones
    assert devices_held(2, 8, "5") == (0, 1)  # a label of the wrong length: as if unlabelled
    assert devices_held(2, 4, "1,7") == (0, 1)  # beyond the box
    assert devices_held(1, 0, "0") == ()


def _fp(name: str, gb: float | None, devices: tuple[int, ...] | None = None) -> Footprint:
    return Footprint(name, gb, "estimate", devices)


def _budget(gpus: int) -> Budget:
    return Budget(BUDGET.gb, BUDGET.basis, gpus)


def _need(new: Footprint, gpus: int) -> Footprint:
    return replace(new, gpus=gpus)


@pytest.mark.parametrize("gpus", [0, 1])
def test_one_gpu_box_is_the_sum_rule(gpus: int) -> None:
    held = (_fp("a", 50.0, (0,)),)
    assert Room(_budget(gpus), _need(_fp("b", 30.0), 1), held).fits
    assert not Room(_budget(gpus), _need(_fp("b", 30.5), 1), held).fits
    assert Room(_budget(gpus), _need(_fp("b", 30.0), 1), held).placement is None
    words = short_words(Room(_budget(gpus), _need(_fp("b", 30.5), 1), held))
    assert words == short_words(Room(BUDGET, _fp("b", 30.5), held))


def test_two_one_gpu_models_on_a_box_of_eight() -> None:
    held = (_fp("a", 70.0, (0,)),)
    room = Room(_budget(8), _need(_fp("b", 70.0), 1), held)
    assert room.fits and room.placement is not None and room.placement.chosen == (1,)
    assert not Room(BUDGET, _fp("b", 70.0), held).fits  # the sum rule would refuse it


def test_gpus_all_and_unplaced_holders() -> None:
    held = (_fp("a", 70.0, (3,)),)
    assert not Room(_budget(4), _need(_fp("b", 20.0), 4), held).fits  # `all`: GPU 3 too
    assert Room(_budget(4), _need(_fp("b", 10.0), 4), held).fits
    # a holder whose GPUs are unknown counts on every one
    assert not Room(_budget(4), _need(_fp("b", 20.0), 1), (_fp("a", 70.0),)).fits


def test_refusal_names_the_gpus() -> None:
    held = (_fp("a", 70.0, (0, 1)), _fp("c", 75.0, (2,)), _fp("d", 60.0, (3,)))
    room = Room(_budget(4), _need(_fp("b", 30.0), 2), held)
    assert not room.fits
    words = short_words(room)
    assert words.startswith("b needs 30.00 GB on each of 2 of this box's 4 GPUs")
    assert "budget 80.00 GB per GPU, NVIDIA H100 80GB HBM3 memory" in words
    assert "GPU 0: free 10.00 GB (held by a 70.00 GB)" in words and "GPU 3: free 20.00 GB (held by d 60.00 GB)" in words
    one = short_words(Room(_budget(4), _need(_fp("b", 30.0), 1), held))
    assert "on 1 of this box's 4 GPUs" in one and "GPU 3:" in one
    assert short_words(Room(_budget(2), _need(_fp("b", 1.0), 3), ())) == "b needs 3 GPUs; this box has 2 GPUs"


# The gateway's plan on a box of several GPUs (core/budget.plan_gpus): the LRU order, per GPU, no more than needed.

def _r(name: str, gb: float | None, devices: tuple[int, ...] | None, last_used: float, **kw: object) -> Resident:
    return Resident(name, gb, last_used, devices=devices, **kw)  # type: ignore[arg-type]


def test_plan_on_a_free_gpu_evicts_nothing() -> None:
    residents = [_r("a", 70.0, (0,), 1.0)]
    assert plan_gpus(_need(_fp("b", 70.0), 1), _budget(2), residents) == RoomPlan((), ())
    assert plan_room(70.0, 80.0, residents) == RoomPlan(("a",), ())  # the sum rule would stop a
    assert plan_gpus(_need(_fp("b", 70.0), 1), _budget(1), residents) == plan_room(70.0, 80.0, residents)


def test_plan_evicts_in_lru_order_but_keeps_those_that_made_no_room() -> None:
    residents = [_r("old", 50.0, (0,), 1.0), _r("mid", 50.0, (1,), 2.0), _r("new", 10.0, (2,), 3.0)]
    # 60 GB on each of 2 GPUs: GPU 2 has room (10 + 60), GPU 0 or 1 only once its holder stops
    plan = plan_gpus(_need(_fp("x", 60.0), 2), _budget(3), residents)
    assert plan == RoomPlan(("old",), ())  # GPUs 0 and 2
    # a model of one GPU fits on GPU 2 beside `new`: nothing stopped
    assert plan_gpus(_need(_fp("x", 60.0), 1), _budget(3), residents) == RoomPlan((), ())
    # 75 GB on one GPU: old is stopped first (LRU) and makes the room on GPU 0
    assert plan_gpus(_need(_fp("x", 75.0), 1), _budget(3), residents) == RoomPlan(("old",), ())


def test_plan_never_stops_one_that_did_not_make_the_room() -> None:
    residents = [_r("old", 10.0, (3,), 1.0), _r("a", 75.0, (0,), 2.0), _r("b", 75.0, (1,), 3.0),
                 _r("c", 75.0, (2,), 4.0)]
    # x needs 70 on 2 GPUs: GPU 3 (10 held) and one of 0..2 once its holder stops; `old` (LRU) made no room
    plan = plan_gpus(_need(_fp("x", 70.0), 2), _budget(4), residents)
    assert plan == RoomPlan(("a",), ())


def test_plan_pinned_busy_unknown_and_too_many() -> None:
    residents = [_r("p", 70.0, (0,), 1.0, pinned=True), _r("busy", 70.0, (1,), 0.5, in_flight=2)]
    assert plan_gpus(_need(_fp("x", 20.0), 1), _budget(2), residents) == RoomPlan((), ("busy",))
    assert plan_gpus(_need(_fp("x", 20.0), 2), _budget(2), residents) is None  # GPU 0 is pinned
    unknown = [_r("u", None, (0,), 1.0), _r("k", 70.0, (1,), 2.0, pinned=True)]
    assert plan_gpus(_need(_fp("x", 20.0), 1), _budget(2), unknown) == RoomPlan(("u",), ())
    assert plan_gpus(_need(_fp("x", 1.0), 3), _budget(2), []) is None
    assert plan_gpus(_need(_fp("x", None), 1), _budget(2), []) is None


def test_a_new_engine_on_fixed_gpus_is_judged_on_those() -> None:
    """A host process whose recipe sets CUDA_VISIBLE_DEVICES is on those GPUs whatever placement would choose."""
    held = (_fp("a", 70.0, (0,)),)
    pinned = Room(_budget(4), replace(_fp("b", 20.0, (0,)), gpus=1), held)
    assert pinned.placement is not None and pinned.placement.chosen == (0,) and not pinned.fits
    assert "its own CUDA_VISIBLE_DEVICES do not fit" in short_words(pinned)
    assert "GPU 0: free 10.00 GB (held by a 70.00 GB)" in short_words(pinned)
    assert Room(_budget(4), replace(_fp("b", 20.0, (2,)), gpus=1), held).fits
    assert not choose(4, 80.0, [], 1.0, 1, fixed=(7,)).fits  # beyond the box
    assert plan_gpus(replace(_fp("b", 20.0, (0,)), gpus=1), _budget(4),
                     [_r("a", 70.0, (0,), 1.0), _r("c", 70.0, (1,), 0.5)]) == RoomPlan(("a",), ())


def test_own_devices_of_a_host_process_recipe() -> None:
    from metralectl.core.overrides import apply_sets
    from metralectl.lifecycle.budget import own_devices
    from tests.unit.recipe_helpers import catalog

    cat = catalog()
    base = cat.recipe("qwen3.5-35b-a3b-llamacpp")
    proc = apply_sets(cat, base, ["runtime=process", "resources.gpus=1", "env.CUDA_VISIBLE_DEVICES=3"])
    assert own_devices(proc, 8) == (3,)
    assert own_devices(proc, 2) is None  # not a GPU of this box: placed as any other
    assert own_devices(apply_sets(cat, base, ["resources.gpus=1", "env.CUDA_VISIBLE_DEVICES=3"]), 8) is None
    uuid = apply_sets(cat, base, ["runtime=process", "env.CUDA_VISIBLE_DEVICES=GPU-5d1e"])
    assert own_devices(uuid, 8) is None
