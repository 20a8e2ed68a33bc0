"""TensorRT-LLM (`trtllm-serve`): data in engine/trtllm.yaml; nothing in code differs from the data's defaults yet."""

from __future__ import annotations

from metralectl.core.engines.base import DataEngine


class Trtllm(DataEngine):
    name = "trtllm"
    owned_by = ("tensorrt_llm",)   # /v1/models `owned_by` (openai_protocol.py ModelCard)
    metric_prefix = None           # no Prometheus series mapped (engine/trtllm.yaml `metrics:`)


ENGINE = Trtllm
