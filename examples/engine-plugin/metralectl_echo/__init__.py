"""The `echo` engine: its data (data/engine/echo.yaml, its pinned --help text, an image, a recipe) and its
class. Everything the data says needs no code; the class adds only what differs: how a running echo server
is recognised, what its fit estimate's KV part is, and where its data lives."""

from __future__ import annotations

from pathlib import Path

from typing import TYPE_CHECKING

from metralectl.core.engines.base import DataEngine, ServerAnswers

if TYPE_CHECKING:
    from metralectl.core.fit import Part
    from metralectl.core.model_info import ModelInfo
    from metralectl.core.recipe import Recipe


class Echo(DataEngine):
    name = "echo"
    owned_by = ("echo",)
    metric_prefix = "echo_"
    data_dir = Path(__file__).parent / "data"

    def version(self, answers: ServerAnswers) -> str | None:
        config = answers.serve_config
        value = config.get("echo_version") if isinstance(config, dict) else None
        return value if isinstance(value, str) else None

    def kv_pool(self, model: ModelInfo, recipe: Recipe) -> Part:
        from metralectl.core.fit import Part

        return Part("KV cache", 0.0, "the echo server keeps no KV cache")
