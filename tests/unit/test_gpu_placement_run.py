"""`run` on a box of several GPUs (a fake driver listing 2-8 H100s): a second model of one GPU goes on a GPU of
its own instead of being refused beside the first on GPU 0; the refusal, when no GPU has room, names the GPUs and
what holds them; an engine started before placement (no gpu-ids label) holds the first GPUs; NVML's per-GPU
figures say where an engine really is; a box of one GPU keeps the sum rule."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from metralectl import paths
from metralectl.core.catalog import Catalog, load_catalog
from metralectl.core.labels import LABEL_GPU_IDS
from metralectl.core.overrides import apply_sets
from metralectl.core.render import spec_for
from metralectl.errors import MetralError
from metralectl.lifecycle.launch import LaunchOptions, launch
from metralectl.lifecycle.placing import place_for_print
from metralectl.lifecycle.ps_memory import measured_bytes, measured_per_gpu
from metralectl.seams import machine
from tests.fakes.lifecycle import Recorder
from tests.fakes.runtime import FakeRuntime, engine_boot, image
from tests.ports import own_port

A, B = "qwen3.5-35b-a3b-hopper", "hopper-b"
H100 = "NVIDIA H100 80GB HBM3"


def _box(monkeypatch: pytest.MonkeyPatch, gpus: int) -> None:
    monkeypatch.setattr(machine, "cpu_arch", lambda: "x86_64")
    monkeypatch.setattr(machine, "gpu_names", lambda *a: [H100] * gpus)


def _catalog() -> Catalog:
    user = paths.config_dir() / "recipes"
    user.mkdir(parents=True, exist_ok=True)
    (user / f"{B}.yaml").write_text(f"extends: {A}\nname: {B}\ndescription: a second model\n")
    return load_catalog()


def _runtime(cat: Catalog) -> FakeRuntime:
    rt = FakeRuntime(images=[image(cat.image_for(cat.recipe(A)).ref, "linux/amd64")])
    rt.script(f"metralectl-{A}", engine_boot("Qwen/A"))
    rt.script(f"metralectl-{B}", engine_boot("Qwen/B"))
    return rt


def _launch(cat: Catalog, rt: FakeRuntime, name: str, gpus: int | str, port: int | None = None, **options: Any) -> Any:
    sets = [f"resources.port={port or own_port()}", f"resources.gpus={gpus}"]
    opts = LaunchOptions(check_weights=False, pull=False, sets=tuple(sets), **options)
    return launch(apply_sets(cat, cat.recipe(name), sets), cat, rt, options=opts, on_event=Recorder())


def _labels(rt: FakeRuntime, name: str) -> dict[str, str]:
    """The labels of the daemon's container itself (rt.all() gives copies)."""
    return next(c for c in rt._by_id.values() if c.name == name).labels


def _ids(rt: FakeRuntime) -> dict[str, str | None]:
    return {c.name: c.labels.get(LABEL_GPU_IDS) for c in rt.all() if c.running}


def test_a_second_model_goes_on_a_gpu_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    _box(monkeypatch, 8)
    cat = _catalog()
    rt = _runtime(cat)
    _launch(cat, rt, A, 1)
    _launch(cat, rt, B, 1)  # ~70 GB each of an 80 GB GPU: refused beside A before placement
    assert _ids(rt) == {f"metralectl-{A}": "0", f"metralectl-{B}": "1"}
    assert [s.gpu_ids for s in rt.created] == [(0,), (1,)]


def test_a_model_of_two_gpus_goes_on_the_least_held_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    _box(monkeypatch, 4)
    cat = _catalog()
    rt = _runtime(cat)
    _launch(cat, rt, A, 1)
    _launch(cat, rt, B, 2)
    assert _ids(rt) == {f"metralectl-{A}": "0", f"metralectl-{B}": "1,2"}


def test_no_gpu_with_room_is_refused_naming_the_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    _box(monkeypatch, 2)
    cat = _catalog()
    rt = _runtime(cat)
    _launch(cat, rt, A, 2)
    with pytest.raises(MetralError) as refused:
        _launch(cat, rt, B, 1)
    message, hint = refused.value.message, refused.value.hint or ""
    assert message.startswith(f"{B} needs 70.40 GB on 1 of this box's 2 GPUs, and not even the least held fit "
                              f"(budget 80.00 GB per GPU, {H100} memory): GPU 0: free 9.60 GB (held by {A} 70.40 GB)"), \
        message
    assert f"`metralectl stop {A}`" in hint and "per GPU" in hint and f"`metralectl run {B} --replace`" in hint
    assert len(rt.created) == 1
    replaced = _launch(cat, rt, B, 1, replace=True)  # --replace stops A: B on the first GPU
    assert _ids(rt) == {replaced.container: "0"}


@pytest.mark.parametrize(("a_gpus", "label", "b_goes_to"), [
    (2, None, "2"),  # no label, as an older metralectl started A: it holds the first GPUs (0, 1)
    (1, "2", "0"),  # the label says where A is
    (1, "3;rm -rf /", "1"),  # a garbled label is read as none: A counted on GPU 0, as if unlabelled
])
def test_the_gpus_an_engine_holds_are_read_from_its_label_or_else_the_first(
        monkeypatch: pytest.MonkeyPatch, a_gpus: int, label: str | None, b_goes_to: str) -> None:
    _box(monkeypatch, 4)
    cat = _catalog()
    rt = _runtime(cat)
    _launch(cat, rt, A, a_gpus)
    if label is None:
        del _labels(rt, f"metralectl-{A}")[LABEL_GPU_IDS]
    else:
        _labels(rt, f"metralectl-{A}")[LABEL_GPU_IDS] = label
    _launch(cat, rt, B, 1)
    assert _ids(rt)[f"metralectl-{B}"] == b_goes_to


def test_the_same_recipe_on_other_gpus_is_served_already(monkeypatch: pytest.MonkeyPatch) -> None:
    _box(monkeypatch, 4)
    cat = _catalog()
    rt = _runtime(cat)
    port = own_port()
    first = _launch(cat, rt, A, 1, port)
    _labels(rt, f"metralectl-{A}")[LABEL_GPU_IDS] = "3"  # placed elsewhere: the spec hash is the same
    again = _launch(cat, rt, A, 1, port)
    assert again.already_serving and again.container == first.container and len(rt.created) == 1


def test_one_gpu_box_keeps_the_sum_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    _box(monkeypatch, 1)
    cat = _catalog()
    rt = _runtime(cat)
    _launch(cat, rt, A, 1)
    assert _ids(rt) == {f"metralectl-{A}": None} and rt.created[0].gpu_ids is None
    with pytest.raises(MetralError) as refused:
        _launch(cat, rt, B, 1)
    assert refused.value.message.startswith(f"{B} needs 70.40 GB, free 9.60 GB of budget 80.00 GB")


def test_print_shows_the_gpus_run_would_choose(monkeypatch: pytest.MonkeyPatch) -> None:
    _box(monkeypatch, 8)
    cat = _catalog()
    recipe = apply_sets(cat, cat.recipe(B), ["resources.gpus=2"])
    spec = spec_for(cat, recipe)
    import metralectl.lifecycle.local_runtime as local

    rt = _runtime(cat)
    rt.serving(A)
    _labels(rt, f"metralectl-{A}").update({"ai.metrale.metralectl.sets": "resources.gpus=1", LABEL_GPU_IDS: "0"})
    monkeypatch.setattr(local, "open_local", lambda **_: _Opened(rt))
    assert place_for_print(cat, recipe, spec).gpu_ids == (1, 2)

    def unreachable(**_: Any) -> Any:
        raise MetralError("Cannot connect to the Docker daemon")

    monkeypatch.setattr(local, "open_local", unreachable)
    assert place_for_print(cat, recipe, spec) is spec


class _Opened:
    def __init__(self, rt: FakeRuntime) -> None:
        self.rt = rt

    def __enter__(self) -> FakeRuntime:
        return self.rt

    def __exit__(self, *_: object) -> None:
        return None


class _Probe:
    """NVML of 4 GPUs: pid 10 on GPUs 1 and 2, pid 20 on GPU 3."""

    def open(self) -> object:
        return object()

    def sample(self) -> tuple[Any, ...]:
        def proc(pid: int, used: int) -> Any:
            return SimpleNamespace(pid=pid, used_bytes=used)

        procs = {1: [proc(10, 30 * 10**9)], 2: [proc(10, 40 * 10**9)], 3: [proc(20, 5 * 10**9)]}
        return tuple(SimpleNamespace(index=i, processes=procs.get(i, [])) for i in range(4))

    def close(self) -> None:
        return None


def test_nvml_says_what_each_engine_holds_on_each_gpu() -> None:
    pids = {"a": {10}, "b": {20}, "c": {30}}.__getitem__
    per_gpu = measured_per_gpu(["a", "b", "c"], pids, _Probe)
    assert set(per_gpu) == {"a", "b"} and set(per_gpu["a"]) == {1, 2} and set(per_gpu["b"]) == {3}
    busiest = measured_bytes(["a", "b", "c"], pids, _Probe, busiest_gpu=True)
    assert busiest["a"] == max(per_gpu["a"].values()) and busiest["b"] == per_gpu["b"][3]


def test_an_engine_holds_every_gpu_nvml_sees_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from metralectl.lifecycle import ps_memory
    from metralectl.lifecycle.budget import running_footprints

    _box(monkeypatch, 4)
    cat = _catalog()
    rt = _runtime(cat)
    _launch(cat, rt, A, 1)  # labelled "0"
    monkeypatch.setattr(ps_memory, "measured_per_gpu", lambda *a, **k: {f"metralectl-{A}": {0: 75 * 10**9, 3: 10**9}})
    running = [c for c in rt.containers() if c.running]
    [held] = running_footprints(cat, rt, running, 4)
    assert held.devices == (0, 3) and held.gb == 75.0 and held.basis == "measured (NVML)"
    [single] = running_footprints(cat, rt, running)  # a box of one GPU: no devices, as before
    assert single.devices is None


def test_an_engine_of_an_unknown_recipe_holds_its_labelled_gpus_else_every_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from metralectl.lifecycle.budget import running_footprints

    _box(monkeypatch, 4)
    cat = _catalog()
    rt = _runtime(cat)
    rt.serving("gone-recipe")
    running = [c for c in rt.containers() if c.running]
    [held] = running_footprints(cat, rt, running, 4)
    assert held.devices is None  # no label: counted on every GPU
    _labels(rt, "metralectl-gone-recipe")[LABEL_GPU_IDS] = "1"
    [held] = running_footprints(cat, rt, [c for c in rt.containers() if c.running], 4)
    assert held.devices == (1,)
