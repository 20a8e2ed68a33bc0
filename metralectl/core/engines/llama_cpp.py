"""llama.cpp's `llama-server`: data in engine/llama-cpp.yaml; here its identification and its KV cache size."""

from __future__ import annotations

from typing import TYPE_CHECKING

from metralectl.core.engines.base import DataEngine, ServerAnswers

if TYPE_CHECKING:
    from metralectl.core.fit import Part
    from metralectl.core.model_info import ModelInfo
    from metralectl.core.recipe import Recipe


class LlamaCpp(DataEngine):
    name = "llama-cpp"
    owned_by = ("llamacpp",)
    metric_prefix = "llamacpp:"

    def signatures(self, answers: ServerAnswers) -> list[str]:
        props = answers.props
        if isinstance(props, dict) and isinstance(props.get("default_generation_settings"), dict):
            return ["GET /props: default_generation_settings"]
        return []

    def version(self, answers: ServerAnswers) -> str | None:
        value = answers.props.get("build_info") if isinstance(answers.props, dict) else None
        return value if isinstance(value, str) else None

    def kv_pool(self, model: ModelInfo, recipe: Recipe) -> Part:
        """ctx-size tokens (shared by the slots) × attention layers × KV heads × head dim, K and V in their
        cache types (f16 unless set): llama.cpp takes no memory fraction, its cache is what it is told."""
        from metralectl.core.fit import GB, GGML_KV_BYTES, Part
        from metralectl.wording import count

        serve = recipe.serve
        layers, heads, dim = model.attention_layers, model.kv_heads, model.head_dim
        missing = [n for n, v in (("attention layers", layers), ("KV heads", heads), ("head dim", dim)) if not v]
        if missing:
            return Part("KV cache", None, f"unknown: {', '.join(missing)} of {model.display_name} not in the data")
        ctx = serve.get("ctx-size")
        if not isinstance(ctx, int) or ctx <= 0:
            return Part("KV cache", None, "unknown: ctx-size 0 (the model's training context, read at load)")
        k_type, v_type = str(serve.get("cache-type-k", "f16")), str(serve.get("cache-type-v", "f16"))
        assert layers and heads and dim
        total = ctx * layers * heads * dim * (GGML_KV_BYTES[k_type] + GGML_KV_BYTES[v_type])
        basis = (f"{ctx} ctx × {count(layers, 'attn layer')} × {count(heads, 'kv-head')} × {dim} head-dim "
                 f"× (K {k_type} + V {v_type})")
        return Part("KV cache", total / GB, basis)


ENGINE = LlamaCpp
