"""What the local HF cache holds of what a checkpoint's engine needs — filesystem only (`list` calls it).

A safetensors checkpoint (Metrale) needs its whole snapshot (hfcache.cache_state); a GGUF checkpoint
(llama.cpp) only its quant's files (gguf_cache.quant_state). Every caller holding a checkpoint asks here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metralectl.seams import gguf_cache, hfcache


def checkpoint_state(checkpoint: Any, hub: Path | None = None) -> hfcache.CacheState:
    """`checkpoint` has repo, revision, quant and format (core.recipe.CheckpointRef; format defaults to
    safetensors)."""
    if getattr(checkpoint, "format", "safetensors") == "gguf":
        return gguf_cache.quant_state(checkpoint.repo, checkpoint.revision, checkpoint.quant, hub)
    return hfcache.cache_state(checkpoint.repo, checkpoint.revision, hub)
