"""Memory estimate arithmetic."""

from __future__ import annotations

import dataclasses
import math

import pytest

from metralectl.core.fit import estimate, high_precision_layers, kv_element_bytes
from metralectl.core.overrides import apply_sets
from tests.unit.recipe_helpers import catalog


def _estimate(name: str, *sets: str):
    cat = catalog()
    recipe = apply_sets(cat, cat.recipes[name], list(sets))
    return estimate(recipe, cat.model_of(recipe), cat.hardware[recipe.hardware],
                    roles=cat.engines[recipe.engine].fit_roles)  # the flags the engine's data names for the pool


def test_flagship_kv_pool_by_the_formula() -> None:
    est = _estimate("qwen3.5-35b-a3b")
    # 8192 tokens x 2 seqs x 10 attention layers x 2 kv-heads x 256 head-dim x 2 (K,V) x 1 B (fp8)
    assert est.kv_pool.gb == pytest.approx(8192 * 2 * 10 * 2 * 256 * 2 * 1.0 / 1e9)
    assert est.reserve.gb == pytest.approx(1.024)
    assert est.budget.gb == pytest.approx(119.7 * 0.85)
    assert est.weights.gb == pytest.approx(35 * 4.5 / 8)
    assert est.fits is True and est.total_gb == pytest.approx(est.weights.gb + est.kv_pool.gb + est.reserve.gb)


def test_kv_scales_with_dtype_and_blocks() -> None:
    nvfp4 = _estimate("qwen3.5-35b-a3b", "kv-cache-dtype=nvfp4")
    fp8 = _estimate("qwen3.5-35b-a3b")
    assert fp8.kv_pool.gb == pytest.approx(2 * nvfp4.kv_pool.gb)
    odd = _estimate("qwen3.5-35b-a3b", "max-seq-len=8193")  # rounds up to whole 16-token blocks
    assert odd.kv_pool.gb == pytest.approx(fp8.kv_pool.gb * 8208 / 8192)
    # one of the engine's 16 dtypes; a turbo V side gets the automatic BF16 boundary (4 of 10 layers)
    pair = _estimate("qwen3.5-35b-a3b", "kv-cache-dtype=fp8k_turbo4v")
    per_layer_fp8 = fp8.kv_pool.gb / 10
    assert pair.kv_pool.gb == pytest.approx(per_layer_fp8 * (4 * 2.0 + 6 * (1.0 + 0.5) / 2))


def test_auto_batch_size_leaves_the_kv_pool_unknown() -> None:
    est = _estimate("qwen3.5-35b-a3b", "max-batch-size=auto")
    assert est.kv_pool.gb is None and "auto" in est.kv_pool.basis and est.fits is None


def test_high_precision_layers_rule() -> None:
    assert high_precision_layers(0, "fp8", 10) == 0
    assert high_precision_layers(2, "nvfp4", 12) == 4
    assert high_precision_layers("auto", "nvfp4", 12) == 4
    assert high_precision_layers("max", "fp8", 12) == 12
    assert high_precision_layers(0, "turbo3", 12) == max(2, math.ceil(12 / 3))
    assert high_precision_layers(0, "turbo2", 12) == max(4, math.ceil(4 * 12 / 5))
    assert kv_element_bytes("bf16k_turbo3v") == (2.0, 0.375)
    assert kv_element_bytes("nonsense") is None


def test_memory_that_does_not_fit() -> None:
    est = _estimate("qwen3.5-35b-a3b", "max-seq-len=262144", "max-batch-size=64")
    assert est.fits is False and est.headroom_gb is not None and est.headroom_gb < 0


def test_unknown_figures_stay_unknown() -> None:
    cat = catalog()
    unknown = [r for r in cat.recipes.values()
               if None in (cat.model_of(r).kv_heads, cat.model_of(r).head_dim, cat.model_of(r).attention_layers)]
    assert unknown, "the data has figures left unknown (Gemma-4, ...); this test guards how they are shown"
    for recipe in unknown:
        est = estimate(recipe, cat.model_of(recipe), cat.hardware[recipe.hardware],
                       roles=cat.engines[recipe.engine].fit_roles)
        assert est.kv_pool.gb is None and est.fits is None and "unknown" in est.kv_pool.basis


def test_the_kv_pool_reads_the_flags_the_engine_s_data_names() -> None:
    """The generic pool's context length, sequences and KV dtype are whatever flags `fit-roles:` names; an engine
    whose data names none sizes its cache itself (unknown here, and said)."""
    from metralectl.core.engine_profile import FitRoles

    cat = catalog()
    recipe = cat.recipes["qwen3.5-35b-a3b"]
    metrale = cat.engines[recipe.engine].fit_roles
    assert (metrale.context_length, metrale.sequences, metrale.kv_dtype) == ("max-seq-len", "max-batch-size",
                                                                              "kv-cache-dtype")
    own = estimate(recipe, cat.model_of(recipe), cat.hardware[recipe.hardware], roles=metrale)
    none = estimate(recipe, cat.model_of(recipe), cat.hardware[recipe.hardware], roles=FitRoles())
    assert own.kv_pool.gb and none.kv_pool.gb is None and "sizes its KV cache itself" in none.kv_pool.basis
    other = FitRoles(context_length="max-seq-len", sequences="max-sequences")  # a flag this recipe does not set
    said = estimate(recipe, cat.model_of(recipe), cat.hardware[recipe.hardware], roles=other).kv_pool.basis
    assert "max-seq-len × max-sequences" in said and "does not set max-sequences" in said


def test_an_engine_over_several_gpus_is_estimated_per_gpu() -> None:
    """tensor × pipeline parallel (the flags the engine's data names for those roles) split the weights over the
    GPUs, and the KV pool over its KV heads and stages: the estimate, like the budget it is judged against, is what
    one GPU holds. Where the heads are fewer than the tensor ranks, they are copied, not split further."""
    cat = catalog()
    hopper = cat.hardware["hopper"]

    def on_hopper(name: str, *sets: str):
        recipe = apply_sets(cat, cat.recipes[name], list(sets))
        return estimate(recipe, cat.model_of(recipe), hopper, "NVIDIA H100 80GB HBM3",
                        cat.engines[recipe.engine].memory_meaning, roles=cat.engines[recipe.engine].fit_roles)

    one, four = on_hopper("qwen3.6-35b-a3b-vllm"), on_hopper("qwen3.6-35b-a3b-vllm", "serve.tensor-parallel-size=4")
    assert one.weights.gb and four.weights.gb == pytest.approx(one.weights.gb / 4)
    assert "÷ 4 GPUs (tensor 4 × pipeline 1 parallel)" in four.weights.basis
    assert four.budget.gb == one.budget.gb  # the memory fraction is of each GPU
    staged = on_hopper("qwen3.6-35b-a3b-vllm", "serve.tensor-parallel-size=2", "serve.pipeline-parallel-size=2")
    assert staged.weights.gb == pytest.approx(four.weights.gb)
    # the generic pool (sized from the recipe): 2 KV heads split over 2 tensor ranks, over 4 no further than 2
    flagship = cat.recipes["qwen3.5-35b-a3b"]
    roles = dataclasses.replace(cat.engines[flagship.engine].fit_roles, tensor_parallel="tp-under-test")

    def generic(tp: int):
        recipe = dataclasses.replace(flagship, serve={**flagship.serve, "tp-under-test": tp})
        return estimate(recipe, cat.model_of(recipe), cat.hardware[recipe.hardware], roles=roles)

    assert cat.model_of(flagship).kv_heads == 2
    base, tp2, tp4 = generic(1), generic(2), generic(4)
    assert base.kv_pool.gb and tp2.kv_pool.gb == pytest.approx(base.kv_pool.gb / 2)
    assert tp4.kv_pool.gb == pytest.approx(base.kv_pool.gb / 2) and tp4.weights.gb == pytest.approx(
        base.weights.gb / 4)  # type: ignore[operator]
    assert "÷ 2 GPUs" in tp4.kv_pool.basis
    trt = on_hopper("qwen3-8b-fp8-trtllm", "serve.tp_size=4")  # TRT-LLM's own flag; its pool it sizes itself
    assert trt.weights.gb == pytest.approx(on_hopper("qwen3-8b-fp8-trtllm").weights.gb / 4)  # type: ignore[operator]
    # SGLang names its own flags for the roles
    assert on_hopper("qwen3-8b-fp8-sglang", "serve.tp-size=2").weights.gb == pytest.approx(
        on_hopper("qwen3-8b-fp8-sglang").weights.gb / 2)  # type: ignore[operator]


def test_a_gpu_count_below_the_parallel_sizes_is_refused_by_the_checker() -> None:
    from metralectl.errors import RecipeInvalid

    cat = catalog()
    with pytest.raises(RecipeInvalid) as refused:
        apply_sets(cat, cat.recipes["qwen3.6-35b-a3b-vllm"], ["serve.tensor-parallel-size=4", "resources.gpus=2"])
    said = str(refused.value)
    assert "gpus: 2 gives the engine 2 GPUs, but serve's tensor-parallel-size 4 × pipeline-parallel-size 1 spreads " \
           "the model over 4" in said and refused.value.hint == "write `gpus: 4` (or `gpus: all`)", said
    fine = apply_sets(cat, cat.recipes["qwen3.6-35b-a3b-vllm"], ["serve.tensor-parallel-size=4", "resources.gpus=4"])
    assert fine.resources.gpus == 4


def test_weights_alone_over_the_budget_do_not_fit_though_the_kv_part_is_unknown() -> None:
    """vLLM sizes its KV cache itself (unknown here), but weights larger than its share of the GPU cannot start
    whatever that cache would be: `fit`, `show`, `list` and the budget say so, where they said "unknown"; spread
    over two GPUs the same model is unknown again (its per-GPU weights fit the share)."""
    from metralectl.app.library import _memory_reason
    from metralectl.core.budget import footprint_of_estimate
    from metralectl.present.show_view import as_text

    cat = catalog()
    meaning = cat.engines["vllm"].memory_meaning

    def on_h100(*sets: str):
        recipe = dataclasses.replace(apply_sets(cat, cat.recipes["nemotron-3-super-120b-a12b-vllm"],
                                                ["resources.memory-utilization=0.5", *sets]), hardware="hopper")
        return recipe, estimate(recipe, cat.model_of(recipe), cat.hardware["hopper"], "NVIDIA H100 80GB HBM3",
                                meaning, roles=cat.engines["vllm"].fit_roles)

    recipe, one = on_h100()
    assert one.kv_pool.gb is None and one.weights.gb == pytest.approx(67.5) and one.budget.gb == pytest.approx(40)
    assert one.fits is False and one.headroom_gb == pytest.approx(40 - 67.5)
    assert "does NOT fit (short by at least 27.5 GB)" in as_text(cat, recipe)
    assert _memory_reason(one) == "the weights alone 67.5 of 40.0 GB"
    assert footprint_of_estimate(recipe.name, one, meaning).gb == pytest.approx(67.5)  # not the 40 GB share
    _, two = on_h100("serve.tensor-parallel-size=2")
    assert two.fits is None and two.headroom_gb is None
    assert footprint_of_estimate(recipe.name, two, meaning).gb == pytest.approx(40)
