"""Before a pull writes anything: whose cache it is, one pull per repository, dead downloads, and disk.

Filesystem only (no huggingface_hub); weights.pull calls these under its own names. The lock files and
the dead downloads are opened and removed through the cache's `Owned` (never through a link).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from metralectl import paths
from metralectl.errors import MetralError
from metralectl.ownedfs import Owned
from metralectl.core.progress import human_bytes
from metralectl.seams import hfcache
from metralectl.seams.hfcache import RepoFile
from metralectl.seams.weights_errors import WeightsError
from metralectl import wording

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


class PullLock:
    """The held lock of one repository's pull (a descriptor; closing it releases the lock)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def pull_lock(repo: str, hub: Path) -> PullLock:
    """One metralectl pull per repository at a time (a second would race the first's verification)."""
    import fcntl

    cache = hfcache.owned(hub)
    cache.make_root()
    rel = Path(".locks") / hfcache.folder_name(repo) / "metralectl-pull.lock"
    fd = cache.open_write(rel, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666, create_parents=True)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise WeightsError(f"another `metralectl pull` of {repo} is running", "wait for it to finish") from None
    return PullLock(fd)


def lock_free(cache: Owned, rel: Path) -> bool:
    """Whether nobody holds the flock of `rel` (a missing lock file: nobody); never opened through a link."""
    import fcntl

    try:
        fd = cache.open_write(rel, os.O_WRONLY | os.O_APPEND)
    except FileNotFoundError:
        return True
    except (OSError, MetralError):
        return False  # not a file we can lock: treated as held, so nothing is removed on its account
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released on close
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def drop_dead_downloads(repo: str, hub: Path, etags: set[str] | None = None) -> tuple[int, int]:
    """Delete `.incomplete` blobs left by a dead download; returns (files, bytes) freed.

    huggingface_hub >= 1.0 (and `metralectl pull` for its small files) names each attempt
    `<etag>.<random>.incomplete` and never resumes one from an earlier process, so they are only lost
    space. `<etag>.incomplete` (older versions resume those) is kept. One whose download lock is held is a
    live download: kept too, unless `etags` names it (our own abandoned downloads, after Ctrl-C).
    """
    cache = hfcache.owned(hub)
    base = hfcache.repo_dir(repo, hub)
    count = freed = 0
    for path in hfcache.incomplete_blobs(base):
        etag = hfcache.attempt_etag(path)
        if etag is None:
            continue
        st = hfcache.lstat(cache, path)
        if st is None or not stat.S_ISREG(st.st_mode):
            continue
        if etags is not None and etag not in etags:
            continue
        if etags is None and not lock_free(cache, Path(".locks") / base.name / f"{etag}.lock"):
            continue
        try:
            cache.remove_file(path)
        except (OSError, MetralError):
            continue
        count, freed = count + 1, freed + st.st_size
    return count, freed


def preflight_disk(repo: str, hub: Path, todo: list[RepoFile], free_space: FreeSpace) -> None:
    need = sum(f.size for f in todo)
    reserve = min(1 << 30, need // RESERVE_FRACTION)
    free = free_space(hub)
    if need + reserve > free:
        where = paths.display(hfcache.nearest_existing(hub))
        raise WeightsError(
            f"not enough disk space for {repo}: {human_bytes(need)} still to download ({wording.count(len(todo), 'file')}) "
            f"+ {human_bytes(reserve)} reserve, but only {human_bytes(free)} free at {where} "
            f"(short by {human_bytes(need + reserve - free)})",
            "free some space (`metralectl prune`, `metralectl rm RECIPE`; `hf cache ls` / `hf cache rm` for "
            "the rest) or point "
            "HF_HUB_CACHE at a larger disk (metralectl mounts it into the engine's container)")
