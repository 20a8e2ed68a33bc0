"""TensorRT-LLM (`trtllm-serve`): data in engine/trtllm.yaml; here what its KV cache is to the fit estimate."""

from __future__ import annotations

from typing import TYPE_CHECKING

from metralectl.core.engines.base import DataEngine

if TYPE_CHECKING:
    from metralectl.core.fit import Part
    from metralectl.core.model_info import ModelInfo
    from metralectl.core.recipe import Recipe


class Trtllm(DataEngine):
    name = "trtllm"
    owned_by = ("tensorrt_llm",)  # /v1/models `owned_by` (openai_protocol.py ModelCard)
    metric_prefix = None  # no Prometheus series mapped (engine/trtllm.yaml `metrics:`)

    def kv_pool(self, model: ModelInfo, recipe: Recipe) -> Part:
        """TensorRT-LLM does not size its KV cache from max_seq_len × max_batch_size: it takes
        --kv_cache_free_gpu_memory_fraction of the memory still free once the weights and buffers are in, so the pool
        is whatever that leaves (the budget line says it), not a number the recipe decides."""
        from metralectl.core.fit import Part

        kv = recipe.engine_config.get("kv_cache_config")
        dtype = kv.get("dtype", "auto") if isinstance(kv, dict) else "auto"
        return Part("KV pool", None, f"unknown: TensorRT-LLM takes {recipe.resources.memory_utilization:g} of the memory "
                                     f"free after the weights for it at start (KV dtype {dtype})")


ENGINE = Trtllm
