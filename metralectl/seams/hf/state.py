"""What the local HF cache holds of what a checkpoint's engine needs — filesystem only (`list` calls it, for every
recipe: the cache's readers are imported only when a repository has a folder in the hub).

A safetensors checkpoint (Metrale) needs its whole snapshot (cache.cache_state); a GGUF checkpoint
(llama.cpp) only its quant's files (gguf.quant_state). Every caller holding a checkpoint asks here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metralectl import paths

if TYPE_CHECKING:
    from metralectl.seams.hf.cache import CacheState


def checkpoint_state(checkpoint: Any, hub: Path | None = None) -> CacheState:
    """`checkpoint` has repo, revision, quant and format (core.recipe.CheckpointRef; format defaults to
    safetensors)."""
    from metralectl.seams.hf import cache as hfcache, gguf as hfgguf

    if getattr(checkpoint, "format", "safetensors") == "gguf":
        return hfgguf.quant_state(checkpoint.repo, checkpoint.revision, checkpoint.quant, hub)
    return hfcache.cache_state(checkpoint.repo, checkpoint.revision, hub)


def status(checkpoint: Any, hub: Path | None = None) -> str:
    """checkpoint_state(checkpoint, hub).status. A repository without a folder in the hub (most recipes on most
    boxes) is "absent" for one lstat, without loading the cache's readers: `list` asks for every recipe, and
    their import is a sixth of its start."""
    try:
        os.lstat((hub or paths.hf_hub_cache()) / paths.hf_repo_folder(checkpoint.repo))
    except (FileNotFoundError, NotADirectoryError):
        return "absent"
    return checkpoint_state(checkpoint, hub).status
