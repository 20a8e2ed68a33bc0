"""vLLM: data in engine/vllm.yaml (flags from its own parser); it sizes its KV pool itself (the generic fit), except
its CPU build told a cache size (VLLM_CPU_KVCACHE_SPACE, GiB): then it takes that, whatever memory-utilization says."""

from __future__ import annotations

from typing import TYPE_CHECKING

from metralectl.core.engines.base import DataEngine

if TYPE_CHECKING:
    from metralectl.core.fit import Part
    from metralectl.core.model_info import ModelInfo
    from metralectl.core.recipe import Recipe

CPU_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"
# What vLLM's CPU build holds beside its weights and its cache: the API server, the engine core and the worker, each
# a Python with torch. Measured (VmRSS) with vLLM 0.32.0 CPU serving a 7 MB model: 0.62 + 0.60 + 0.71 GB.
CPU_PROCESSES_GB = 1.95


class Vllm(DataEngine):
    name = "vllm"
    owned_by = ("vllm",)
    metric_prefix = "vllm:"

    def kv_pool(self, model: ModelInfo, recipe: Recipe) -> Part | None:
        """With VLLM_CPU_KVCACHE_SPACE=N (N > 0) its CPU build allocates N GiB of cache (vllm/platforms/cpu.py) and
        no memory fraction: the part is that plus its processes' own memory, fixed (core/budget takes it as is)."""
        from metralectl.core.fit import GB, Part

        raw = recipe.env.get(CPU_KV_ENV, "")
        try:
            gib = int(str(raw).strip())
        except ValueError:
            return None  # vLLM itself refuses a value that is no integer; the generic figure stands
        if gib <= 0:
            return None
        return Part("KV cache + processes", (gib * 2**30) / GB + CPU_PROCESSES_GB,
                    f"{CPU_KV_ENV}={gib} GiB (vLLM's CPU build) + {CPU_PROCESSES_GB:g} GB its processes", fixed=True)


ENGINE = Vllm
