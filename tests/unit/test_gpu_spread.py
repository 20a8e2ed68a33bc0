"""A recipe whose engine spreads the model over more GPUs than this box has (vLLM's tensor-parallel-size 2 on a
Spark's one GPU) is refused before anything starts, in the words `run`, the dashboard's plan and the page share;
a box with the GPUs, or a recipe that spreads over one, is not asked about its GPUs at all."""

from __future__ import annotations

import pytest

from metralectl.core.overrides import apply_sets
from metralectl.core.render import spec_for
from metralectl.errors import MetralError
from metralectl.lifecycle.launch import LaunchOptions, launch
from metralectl.lifecycle.preflight import launch_refusal, observe
from metralectl.seams import machine
from tests.fakes.lifecycle import Recorder
from tests.fakes.runtime import FakeRuntime, image
from tests.unit.recipe_helpers import catalog

VLLM = "qwen3.6-35b-a3b-vllm"
OPTIONS = LaunchOptions(check_weights=False, pull=False)


@pytest.fixture(autouse=True)
def arm64(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "cpu_arch", lambda: "aarch64")  # the gb10 image is linux/arm64


def _runtime() -> FakeRuntime:
    info = catalog().image_for(catalog().recipe(VLLM))
    return FakeRuntime(images=[image(info.ref, "linux/arm64")])


def _refusal(rt: FakeRuntime, *sets: str) -> str | None:
    cat = catalog()
    recipe = apply_sets(cat, cat.recipe(VLLM), list(sets))
    spec = spec_for(cat, recipe)
    refused = launch_refusal(recipe, spec, OPTIONS, observe(recipe, cat, rt, spec))
    return refused.error.message if refused is not None else None


def test_more_gpus_than_the_box_has_is_refused_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "gpu_names", lambda *a: ["NVIDIA GB10"])
    rt = _runtime()
    said = _refusal(rt, "serve.tensor-parallel-size=2")
    assert said == (f"{VLLM} spreads the model over 2 GPUs (serve's tensor-parallel-size 2 × pipeline-parallel-size 1); "
                    "this box has 1 GPU"), said
    cat = catalog()
    recipe = apply_sets(cat, cat.recipe(VLLM), ["serve.tensor-parallel-size=2"])
    with pytest.raises(MetralError) as refused:
        launch(recipe, cat, rt, options=OPTIONS, on_event=Recorder())
    assert refused.value.message == said and "`--set serve.tensor-parallel-size=1`" in (refused.value.hint or "")
    assert rt.all() == []  # no container made, none half-started


def test_a_box_with_the_gpus_or_a_recipe_on_one_is_not_refused_for_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "gpu_names", lambda *a: ["NVIDIA H100 80GB HBM3"] * 4)
    rt = _runtime()
    assert _refusal(rt, "serve.tensor-parallel-size=2", "serve.pipeline-parallel-size=2") is None

    def not_asked(*a: object) -> list[str]:
        raise AssertionError("a recipe on one GPU does not look at the box's GPUs")

    monkeypatch.setattr(machine, "gpu_names", not_asked)
    assert _refusal(rt) is None
