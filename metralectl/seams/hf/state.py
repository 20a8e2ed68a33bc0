"""What the local HF cache holds of what a checkpoint's engine needs, and whether the engine can be started on
it — filesystem only (`list` and `run`'s preflight ask here; no network, no huggingface_hub).

A safetensors checkpoint (Metrale) needs its whole snapshot (cache.cache_state); a GGUF checkpoint
(llama.cpp) only its quant's files (gguf.quant_state). Every caller holding a checkpoint asks here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from metralectl import paths
from metralectl.errors import ExitCode
from metralectl.seams.hf import cache as hfcache, gguf as hfgguf
from metralectl.seams.hf.hub import WeightsError


def checkpoint_state(checkpoint: Any, hub: Path | None = None) -> hfcache.CacheState:
    """`checkpoint` has repo, revision, quant and format (core.recipe.CheckpointRef; format defaults to
    safetensors)."""
    if getattr(checkpoint, "format", "safetensors") == "gguf":
        return hfgguf.quant_state(checkpoint.repo, checkpoint.revision, checkpoint.quant, hub)
    return hfcache.cache_state(checkpoint.repo, checkpoint.revision, hub)


class Checkpoint(Protocol):
    """What a pull needs of a checkpoint (core.recipe.CheckpointRef has it; `format` is read with a default)."""

    @property
    def repo(self) -> str: ...

    @property
    def revision(self) -> str | None: ...

    @property
    def quant(self) -> str: ...


def checkpoint_of(target: Any) -> Checkpoint:
    """A Recipe's checkpoint, or the target itself (a CheckpointRef: anything with .repo and .revision)."""
    checkpoint: Checkpoint = getattr(target, "checkpoint", target)
    return checkpoint


def gguf_quant(ck: Any) -> str | None:
    """The quant whose files are all a GGUF checkpoint needs; None for a whole-snapshot checkpoint."""
    return str(ck.quant) if getattr(ck, "format", "safetensors") == "gguf" else None


def state(target: Any, hub: Path | None = None) -> hfcache.CacheState:
    return checkpoint_state(checkpoint_of(target), hub)


class ServingConflict(WeightsError):
    """The files are there, but llama-server's `-hf REPO:QUANT` would not load them (or not only them)."""

    exit_code = ExitCode.FAILED


def serving_preflight(recipe: Any, found: hfcache.CacheState | None = None, hub: Path | None = None) -> None:
    """For a GGUF checkpoint present in the cache: raise ServingConflict when llama-server would read another
    snapshot or could pick another file for the quant. Nothing to check for a whole-snapshot checkpoint."""
    ck = recipe.checkpoint
    quant = gguf_quant(ck)
    if quant is None:
        return
    found = found or checkpoint_state(ck, hub)
    problem = hfgguf.serving_problem(ck.repo, quant, found) if found.status in ("complete", "present") else None
    if problem is not None:
        raise ServingConflict(*problem)


def weights_preflight(recipe: Any, hub: Path | None = None) -> None:
    """For `run`/`swap` before launch: raise unless what the engine needs of the checkpoint is complete
    (verified), and, for llama.cpp, unless `-hf REPO:QUANT` would load exactly those files."""
    ck = recipe.checkpoint
    quant = gguf_quant(ck)
    found = checkpoint_state(ck, hub)
    serving_preflight(recipe, found, hub)
    if found.status == "complete":
        return
    where = paths.display(hfcache.repo_dir(ck.repo, hub))
    pinned = f" at {ck.revision[:12]}" if ck.revision else ""
    what = f"{ck.repo}:{quant}" if quant is not None else ck.repo
    raise WeightsError(
        f"weights incomplete: {what}{pinned} is {found.status} in {where} ({found.detail}); "
        f"run `metralectl pull {recipe.name}`",
        f"`metralectl pull {recipe.name}` downloads what is missing and verifies every file"
        f"{' of the quant' if quant is not None else ''}; "
        "the engine would otherwise start on a half-downloaded checkpoint or fetch it itself, unverified")
