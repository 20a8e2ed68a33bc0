"""Memory estimate of a recipe: weights + KV pool + reserve, against memory x utilization. Pure.

Every figure says where it came from; a figure the data does not give is None ("unknown"),
never a guess.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from metralectl.core.engine_profile import FitRoles, MemoryMeaning, unreachable
from metralectl.core.hardware import HardwareClass
from metralectl.core.model_info import ModelInfo
from metralectl.core.recipe import Recipe
from metralectl.wording import count

GB = 1e9
KV_BLOCK_TOKENS = 16
# Bytes per KV element (SPEC §3). turboN stores N bits per element, so turbo2 is 2/8.
KV_BYTES = {"bf16": 2.0, "fp8": 1.0, "nvfp4": 0.5, "turbo2": 0.25, "turbo3": 3 / 8, "turbo4": 0.5, "turbo8": 1.0}
# Bits per weight of a checkpoint, scales included: NVFP4 = 4-bit values + one FP8 scale per 16. GGUF block
# quants by their block layout (Q8_0: 32 int8 + an f16 scale = 8.5 bits); the K-quant mixes (Q4_K_M: Q4_K with
# some tensors in Q6_K) and the dynamic ones (UD-*) vary per model: no single figure, so unknown.
WEIGHT_BITS = {"nvfp4": 4.5, "mxfp4": 4.25, "fp8": 8.0, "bf16": 16.0, "fp16": 16.0, "fp32": 32.0,
               "Q8_0": 8.5, "Q4_0": 4.5, "Q4_1": 5.0, "Q5_0": 5.5, "Q5_1": 6.0, "Q6_K": 6.5625, "IQ4_NL": 4.5,
               "IQ4_XS": 4.25, "MXFP4": 4.25, "F16": 16.0, "BF16": 16.0, "F32": 32.0}
# llama.cpp's KV cache types (--cache-type-k/-v), bytes per element: block quants with their scales.
GGML_KV_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
                 "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}


@dataclass(frozen=True)
class Part:
    label: str
    gb: float | None
    basis: str  # how it was computed, or why it is unknown
    fixed: bool = False  # the engine takes this much whatever its memory fraction says (vLLM's CPU cache space)


@dataclass(frozen=True)
class MemoryEstimate:
    weights: Part
    kv_pool: Part
    reserve: Part
    budget: Part  # what the engine may use on the target (memory × utilization, as the engine reads it)
    hardware: str
    memory_meaning: MemoryMeaning = "fraction-of-total"  # what resources.memory-utilization means to the recipe's engine

    @property
    def total_gb(self) -> float | None:
        parts = (self.weights.gb, self.kv_pool.gb, self.reserve.gb)
        return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)

    @property
    def known_gb(self) -> float:
        """The parts that are known: with one unknown, a lower bound of the total."""
        return sum(p.gb for p in (self.weights, self.kv_pool, self.reserve) if p.gb is not None)

    @property
    def fits(self) -> bool | None:
        """None where a part is unknown, unless the known ones alone exceed the budget (weights larger than the
        GPU, whatever the engine's KV cache would be): that does not fit."""
        total, budget = self.total_gb, self.budget.gb
        if budget is None:
            return None
        if total is None:
            return False if self.known_gb > budget else None
        return total <= budget

    @property
    def headroom_gb(self) -> float | None:
        """budget - total; where a part is unknown but the rest exceeds the budget, budget - those (at least short
        by that much)."""
        total, budget = self.total_gb, self.budget.gb
        if budget is None:
            return None
        if total is None:
            return budget - self.known_gb if self.known_gb > budget else None
        return budget - total


def kv_element_bytes(dtype: str) -> tuple[float, float] | None:
    """(K bytes, V bytes) per element for a KV dtype, incl. asymmetric `<k>k_<v>v` pairings."""
    if dtype in KV_BYTES:
        return KV_BYTES[dtype], KV_BYTES[dtype]
    if dtype.endswith("v") and "k_" in dtype:
        k, v = dtype[:-1].split("k_", 1)
        if k in KV_BYTES and v in KV_BYTES:
            return KV_BYTES[k], KV_BYTES[v]
    return None


def high_precision_layers(setting: int | str, dtype: str, attention_layers: int) -> int:
    """How many attention layers keep BF16 KV (the engine's --kv-high-precision-layers rule)."""
    if setting in ("max", "all"):
        return attention_layers
    n = 2 if setting == "auto" else int(setting)
    if n == 0 and (dtype.startswith("turbo") or "k_" in dtype):
        # 0 defers to the per-dtype automatic value for turbo and asymmetric dtypes.
        if dtype in ("turbo2", "bf16k_turbo3v"):
            return min(attention_layers, max(4, math.ceil(4 * attention_layers / 5)))
        return min(attention_layers, max(2, math.ceil(attention_layers / 3)))
    return min(attention_layers, 2 * n)  # the first N and the last N


def weights_part(model: ModelInfo, repo: str, quant: str) -> Part:
    ckpt = model.checkpoint(repo)
    if ckpt and ckpt.size_gb:
        return Part("weights", ckpt.size_gb, "checkpoint size")
    if model.params_b and quant in WEIGHT_BITS:
        bits = WEIGHT_BITS[quant]
        return Part("weights", model.params_b * bits / 8, f"≈ {model.params_b:g}B params × {bits:g} bits ({quant})")
    return Part("weights", None, "unknown: checkpoint size and parameter count not in the data")


def kv_part(model: ModelInfo, recipe: Recipe, roles: FitRoles | None = None) -> Part:
    """The KV pool: the engine class's own sizing, else context length × sequences blocks in the KV dtype, read from
    the flags its data names for those roles (`fit-roles:`); unknown for an engine whose data names none."""
    from metralectl.core.engines.registry import engine_for  # lazy: the engine plugins load on the first estimate

    own = engine_for(recipe.engine).kv_pool(model, recipe)  # an engine that sizes its cache its own way
    if own is not None:
        return own
    serve = recipe.serve
    roles = roles or FitRoles()
    if not roles.sized or roles.context_length is None or roles.sequences is None:
        return Part("KV pool", None, f"unknown: {recipe.engine} sizes its KV cache itself (its data names no flags "
                                     "for the context length and sequences the estimate would size it from)")
    seq_flag, batch_flag = roles.context_length, roles.sequences
    dtype = str(serve.get(roles.kv_dtype, "")) if roles.kv_dtype else ""
    seq, batch = serve.get(seq_flag), serve.get(batch_flag)
    layers, heads, dim = model.attention_layers, model.kv_heads, model.head_dim
    sizes = kv_element_bytes(dtype)
    missing = [n for n, v in (("attention layers", layers), ("KV heads", heads), ("head dim", dim)) if not v]
    if missing:
        return Part("KV pool", None, f"unknown: {', '.join(missing)} of {model.display_name} not in the data")
    if batch == "auto":
        return Part("KV pool", None, f"unknown: {batch_flag} auto (the engine sizes the batch at boot)")
    if not isinstance(seq, int) or not isinstance(batch, int):
        unset = " and ".join(n for n, v in ((seq_flag, seq), (batch_flag, batch)) if not isinstance(v, int))
        return Part("KV pool", None, f"unknown: the estimate sizes the pool from {seq_flag} × {batch_flag}, "
                                     f"and this recipe does not set {unset}")
    if sizes is None:
        return Part("KV pool", None, f"unknown: KV dtype {dtype!r} has no known element size")
    assert layers and heads and dim
    tokens = math.ceil(seq / KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS * batch
    hp = high_precision_layers(serve.get("kv-high-precision-layers", 0), dtype, layers)
    per_layer = heads * dim
    total = tokens * per_layer * (hp * 2 * KV_BYTES["bf16"] + (layers - hp) * (sizes[0] + sizes[1]))
    hp_note = f", {count(hp, 'layer')} at bf16" if hp else ""
    basis = (f"{seq} seq × {batch} batch × {count(layers, 'attn layer')} × {count(heads, 'kv-head')} × {dim} head-dim × 2 (K,V) "
             f"× {dtype}{hp_note}")
    return Part("KV pool", total / GB, basis)


HOST_RAM_KEPT_FRACTION = 0.10  # of a host-RAM class's MemTotal, left to everything but the engine...
HOST_RAM_KEPT_MIN_GB = 2.0  # ...and never less than this (a small box's OS needs its share all the same)


def os_headroom_gb(host_ram_gb: float) -> float:
    """What a host-RAM class's budget leaves to the OS and other programs: 10 % of the RAM, at least 2 GB."""
    return max(HOST_RAM_KEPT_MIN_GB, host_ram_gb * HOST_RAM_KEPT_FRACTION)


def _budget(hardware: HardwareClass, memory: float | None, util: float, meaning: MemoryMeaning, weights: Part) -> Part:
    """What the engine may use, read the way its memory-utilization is meant (engine_profile.MEMORY_MEANINGS)."""
    if memory is None:
        if hardware.host_memory:
            return Part("budget", None, "unknown: this machine's RAM could not be read (/proc/meminfo)")
        return Part("budget", None, f"unknown: memory of {hardware.display_name} not in the data")
    kind = "unified" if hardware.unified_memory else "GPU"
    source = f"{memory:g} GB {kind}"  # the memory the engine's share is taken of, as the basis names it
    if hardware.host_memory:
        # The host's RAM is not the engine's alone: the OS, the desktop and Docker live in it too. Judging against
        # all of MemTotal would call a model that pushes the box into swap a fit.
        kept = os_headroom_gb(memory)
        source = f"{memory:g} GB host RAM − {kept:.1f} GB kept for the OS and other programs"
        memory = max(memory - kept, 0.0)
    if meaning == "none":
        return Part("budget", memory, f"{source} (the engine takes no memory fraction)")
    if meaning == "fraction-of-free-after-weights":
        if weights.gb is None:
            return Part("budget", None, "unknown: the engine's fraction is of the memory left after the weights, "
                                        "and the weights' size is unknown")
        return Part("budget", weights.gb + (memory - weights.gb) * util,
                    f"weights + ({source} − weights) × {util:g} (of free memory after the weights)")
    if meaning == "static-weights-and-kv":
        what = "weights and KV only"
    elif meaning == "fraction-of-total":
        what = "of total"
    else:
        unreachable(meaning)
    return Part("budget", memory * util, f"{f'({source})' if hardware.host_memory else source} × {util:g} utilization "
                                         f"({what})")


def parallel_sizes(serve: Mapping[str, object], roles: FitRoles) -> tuple[int, int]:
    """The tensor and pipeline parallel sizes one engine spreads the model over, from the serve settings' flags its
    data names for those roles (`fit-roles:`); 1 where it names none or the recipe leaves them at their default."""
    def size(flag: str | None) -> int:
        value = serve.get(flag) if flag else None
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 1 else 1

    return size(roles.tensor_parallel), size(roles.pipeline_parallel)


def parallel_words(roles: FitRoles, tp: int, pp: int) -> str:
    """How the serve settings spread the model, in their own flags: "tensor-parallel-size 4 × pipeline-parallel-size 1"."""
    return f"{roles.tensor_parallel} {tp} × {roles.pipeline_parallel} {pp}"


def estimate(recipe: Recipe, model: ModelInfo, hardware: HardwareClass, gpu_name: str | None = None,
             memory_meaning: MemoryMeaning = "fraction-of-total", host_ram_gb: float | None = None,
             roles: FitRoles | None = None) -> MemoryEstimate:
    """`host_ram_gb`: this machine's RAM, the budget of a class whose memory is the host's (memory.host-ram)."""
    reserve_mb = recipe.serve.get("oom-guard-mb", 0)
    memory = hardware.memory_gb(gpu_name, host_ram_gb)
    ranks = recipe.resources.world_size
    weights = weights_part(model, recipe.checkpoint.repo, recipe.checkpoint.quant)
    budget = _budget(hardware, memory, recipe.resources.memory_utilization, memory_meaning, weights)
    if ranks > 1 and weights.gb is not None:
        # EP splits the experts across ranks; the rest is replicated. Without the expert share in the
        # data, the even split is the optimistic bound and is labelled as such.
        weights = Part("weights", weights.gb / ranks, f"{weights.basis}, ÷ {ranks} ranks (≈, experts split)")
    tp, pp = parallel_sizes(recipe.serve, roles or FitRoles())
    kv = kv_part(model, recipe, roles)
    if tp * pp > 1:  # one engine over several GPUs: the estimate, like the budget, is what one GPU holds
        if weights.gb is not None:
            weights = Part("weights", weights.gb / (tp * pp), f"{weights.basis}, ÷ {tp * pp} GPUs "
                                                              f"(tensor {tp} × pipeline {pp} parallel)")
        # KV heads split over the tensor ranks (copied where there are fewer heads than ranks), layers over the stages
        kv_split = min(tp, model.kv_heads or tp) * pp
        if kv.gb is not None and not kv.fixed and kv_split > 1:
            kv = Part(kv.label, kv.gb / kv_split, f"{kv.basis}, ÷ {kv_split} GPUs")
    return MemoryEstimate(
        weights=weights,
        kv_pool=kv,
        reserve=Part("reserve", reserve_mb * 1e6 / GB, f"oom-guard-mb {reserve_mb}"),
        budget=budget,
        hardware=hardware.id,
        memory_meaning=memory_meaning,
    )
