"""SGLang: data in engine/sglang.yaml; nothing in code differs from the data's defaults yet."""

from __future__ import annotations

from metralectl.core.engines.base import DataEngine


class Sglang(DataEngine):
    name = "sglang"
    owned_by = ("sglang",)
    metric_prefix = "sglang:"


ENGINE = Sglang
