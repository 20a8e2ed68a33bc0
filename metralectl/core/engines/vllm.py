"""vLLM: data in engine/vllm.yaml (flags from its own parser); it sizes its KV pool itself (the generic fit)."""

from __future__ import annotations

from metralectl.core.engines.base import DataEngine


class Vllm(DataEngine):
    name = "vllm"
    owned_by = ("vllm",)
    metric_prefix = "vllm:"


ENGINE = Vllm
