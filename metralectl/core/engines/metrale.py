"""Metrale (`met serve`): data in engine/metrale.yaml; here what its server does differently in code."""

from __future__ import annotations

from metralectl.core.engines.base import DataEngine, ServerAnswers


class Metrale(DataEngine):
    name = "metrale"
    owned_by = ("metrale",)
    metric_prefix = "metrale_"
    rank_arguments_after = "gpu-memory-utilization"  # its rendezvous words follow the memory fraction
    publishes_recipe_sets = True  # Metrale/metrale-recipes releases: `recipes sync`, `recipes import`
    owns_unnamed_images = True  # the first engine: image files from before engines were named are its own

    def signatures(self, answers: ServerAnswers) -> list[str]:
        config = answers.serve_config
        if isinstance(config, dict) and {"binary_sha256", "args_sha256"} <= config.keys():
            return ["GET /serve-config: binary_sha256, args_sha256"]
        return []

    def supporting(self, answers: ServerAnswers) -> list[str]:
        hardware = answers.hardware
        return ["GET /hardware: hardware_class"] if isinstance(hardware, dict) and "hardware_class" in hardware else []

    def version(self, answers: ServerAnswers) -> str | None:
        for answer in (answers.hardware, answers.serve_config):
            if isinstance(answer, dict) and answer.get("engine_version"):
                value = answer["engine_version"]
                return value if isinstance(value, str) else None
        return None

    def rank_arguments(self, rank: int, world_size: int, master_addr: str) -> list[str]:
        return ["--rank", str(rank), "--world-size", str(world_size), "--master-addr", master_addr]


ENGINE = Metrale
