"""Before a pull writes anything: whose cache it is, one pull per repository, dead downloads, and disk.

Filesystem only (no huggingface_hub); weights.pull calls these under its own names.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from metralectl import paths
from metralectl.core.progress import human_bytes
from metralectl.seams import hfcache
from metralectl.seams.hfcache import RepoFile
from metralectl.seams.weights_errors import WeightsError

RESERVE_FRACTION = 50  # keep 2 % (at most 1 GiB) free beyond the download itself
FreeSpace = Callable[[Path], int]


def check_ownership(repo: str, hub: Path) -> None:
    """Refuse before writing: root writing into a user's cache, or a user's cache holding root's files."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        top = hfcache.nearest_existing(hub)
        owner = top.stat().st_uid
        if owner != 0:
            import pwd

            try:
                name = pwd.getpwuid(owner).pw_name
            except KeyError:
                name = f"uid {owner}"
            raise WeightsError(
                f"refusing to download as root into {paths.display(hub)}, which belongs to {name}: the files "
                f"would be root-owned and the next `metralectl pull` as {name} would fail half-way",
                "run metralectl as your own user, without sudo (the engine's container reads the cache either way)")
        return
    found = hfcache.ownership(repo, hub)
    if not found.ok:
        raise WeightsError(f"{found.describe()} — left by a download run as root (e.g. `sudo metralectl`)",
                           f"{found.fix}   then pull again")


def pull_lock(repo: str, hub: Path) -> TextIO:
    """One metralectl pull per repository at a time (a second would race the first's verification)."""
    import fcntl

    folder = hub / ".locks" / hfcache.repo_dir(repo, hub).name
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / "metralectl-pull.lock", "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise WeightsError(f"another `metralectl pull` of {repo} is running", "wait for it to finish") from None
    return handle


def drop_dead_downloads(repo: str, hub: Path, etags: set[str] | None = None) -> tuple[int, int]:
    """Delete `.incomplete` blobs left by a dead download; returns (files, bytes) freed.

    huggingface_hub >= 1.0 names each attempt `<etag>.<random>.incomplete` and never resumes one
    from an earlier process, so they are only lost space. `<etag>.incomplete` (older versions
    resume those) is kept. One whose huggingface_hub lock is held is a live download: kept too,
    unless `etags` names it (our own abandoned downloads, after Ctrl-C).
    """
    import fcntl

    count = freed = 0
    locks = hub / ".locks" / hfcache.repo_dir(repo, hub).name
    for path in hfcache.incomplete_blobs(hfcache.repo_dir(repo, hub)):
        parts = path.name.split(".")
        if len(parts) != 3:
            continue
        try:
            size = path.stat().st_size
            if etags is not None:
                if parts[0] not in etags:
                    continue
            else:
                with open(locks / f"{parts[0]}.lock", "a") as fh:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink()
        except OSError:
            continue
        count, freed = count + 1, freed + size
    return count, freed


def preflight_disk(repo: str, hub: Path, todo: list[RepoFile], free_space: FreeSpace) -> None:
    need = sum(f.size for f in todo)
    reserve = min(1 << 30, need // RESERVE_FRACTION)
    free = free_space(hub)
    if need + reserve > free:
        where = paths.display(hfcache.nearest_existing(hub))
        raise WeightsError(
            f"not enough disk space for {repo}: {human_bytes(need)} still to download ({len(todo)} files) "
            f"+ {human_bytes(reserve)} reserve, but only {human_bytes(free)} free at {where} "
            f"(short by {human_bytes(need + reserve - free)})",
            "free some space (`metralectl prune`, `metralectl rm RECIPE`; `hf cache ls` / `hf cache rm` for "
            "the rest) or point "
            "HF_HUB_CACHE at a larger disk (metralectl mounts it into the engine's container)")
