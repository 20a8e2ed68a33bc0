"""Checkpoint weights: the Hugging Face seam. The only module that imports huggingface_hub, and only
inside the functions that talk to the Hub (`list` and `run` preflight stay filesystem-only).

`pull` = list the repo at a commit (sizes, sha256) -> refuse early (ownership, disk) -> download the
missing files with huggingface_hub's own downloader -> hash every file against the listing -> only
then write the manifest that makes `hfcache.cache_state` say "complete". Progress and notes are
events handed to `on_event`, always from the calling thread; nothing here prints.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

from metralectl.seams import hfcache

from metralectl import paths
from metralectl.atomicfile import write_atomic
from metralectl.seams.hfcache import Listing, RepoFile
from metralectl.core.progress import Meter, human_bytes
from metralectl.seams.transfer import Account, parallel, verify_files
from metralectl.seams.weights_errors import WeightsError, hub_error

DOWNLOAD_WORKERS = 8  # as snapshot_download: parallel files hide per-connection CDN limits
RESERVE_FRACTION = 50  # keep 2 % (at most 1 GiB) free beyond the download itself


@dataclass(frozen=True)
class PullEvent:
    repo: str
    phase: str  # "resolve" | "download" | "verify" | "done" | "note"
    done: int = 0
    total: int = 0
    rate_bps: float | None = None
    eta_s: float | None = None
    files_done: int = 0
    files_total: int = 0
    message: str = ""


@dataclass(frozen=True)
class PullResult:
    repo: str
    revision: str | None  # what the recipe pinned (None: the default branch)
    commit: str  # what it resolved to, recorded in the manifest (and refs/main when unpinned)
    snapshot: Path
    files: int
    total_bytes: int
    downloaded_bytes: int
    already_complete: bool
    checked_hub: bool = True
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {"repo": self.repo, "revision": self.revision, "commit": self.commit, "status": "complete",
                "snapshot": str(self.snapshot), "files": self.files, "total_bytes": self.total_bytes,
                "downloaded_bytes": self.downloaded_bytes, "already_complete": self.already_complete,
                "checked_hub": self.checked_hub, "notes": list(self.notes)}


OnEvent = Callable[[PullEvent], None]
FreeSpace = Callable[[Path], int]


class Checkpoint(Protocol):
    """What a pull needs of a checkpoint (core.recipe.CheckpointRef has it)."""

    @property
    def repo(self) -> str: ...

    @property
    def revision(self) -> str | None: ...


def _checkpoint(target: Any) -> Checkpoint:
    """A Recipe's checkpoint, or the target itself (a CheckpointRef: anything with .repo and .revision)."""
    checkpoint: Checkpoint = getattr(target, "checkpoint", target)
    return checkpoint


def state(target: Any, hub: Path | None = None) -> hfcache.CacheState:
    ck = _checkpoint(target)
    return hfcache.cache_state(ck.repo, ck.revision, hub)


def weights_preflight(recipe: Any, hub: Path | None = None) -> None:
    """For `run`/`swap` before launch: raise unless the recipe's checkpoint is complete (verified)."""
    ck = recipe.checkpoint
    found = hfcache.cache_state(ck.repo, ck.revision, hub)
    if found.status == "complete":
        return
    where = paths.display(hfcache.repo_dir(ck.repo, hub))
    pinned = f" at {ck.revision[:12]}" if ck.revision else ""
    raise WeightsError(
        f"weights incomplete: {ck.repo}{pinned} is {found.status} in {where} ({found.detail}); "
        f"run `metralectl pull {recipe.name}`",
        f"`metralectl pull {recipe.name}` downloads what is missing and verifies every file; "
        "the engine would otherwise start on a half-downloaded checkpoint or fetch it itself, unverified")


def endpoint() -> str | None:
    """HF_ENDPOINT read now, not when huggingface_hub was imported (tests and mirrors set it late)."""
    return os.environ.get("HF_ENDPOINT") or None


def token_present() -> bool:
    if os.environ.get("HF_TOKEN"):
        return True
    try:
        from huggingface_hub import get_token

        return bool(get_token())
    except Exception:  # noqa: BLE001 - an unreadable token file is the same as none for our message
        return False


def hub_listing(repo: str, revision: str | None) -> Listing:
    """The repo's files at `revision` (default branch when None): path, size, sha256/git oid, and the commit."""
    from huggingface_hub import HfApi

    rev = revision or "main"
    try:
        info = HfApi(endpoint=endpoint()).model_info(repo, revision=rev, files_metadata=True)
    except Exception as exc:  # noqa: BLE001 - translated (or re-raised) by hub_error
        raise hub_error(exc, repo, rev, token_present(), endpoint=endpoint()) from None
    if not info.sha or info.siblings is None:
        raise WeightsError(f"the Hub answered for {repo}@{rev} without a commit or a file list",
                           f"check HF_ENDPOINT ({endpoint() or 'https://huggingface.co'}) points at a Hugging Face Hub")
    files = []
    for s in info.siblings:
        lfs = s.lfs
        size = lfs.size if lfs is not None else s.size
        if size is None:
            raise WeightsError(f"the Hub listed {repo}/{s.rfilename} without a size; cannot verify it")
        files.append(RepoFile(s.rfilename, int(size), lfs.sha256 if lfs is not None else None, s.blob_id))
    return Listing(repo, info.sha, tuple(sorted(files, key=lambda f: f.path)))


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


def _pull_lock(repo: str, hub: Path) -> TextIO:
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


def _drop_dead_downloads(repo: str, hub: Path, etags: set[str] | None = None) -> tuple[int, int]:
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


def _preflight_disk(repo: str, hub: Path, todo: list[RepoFile], free_space: FreeSpace) -> None:
    need = sum(f.size for f in todo)
    reserve = min(1 << 30, need // RESERVE_FRACTION)
    free = free_space(hub)
    if need + reserve > free:
        where = paths.display(hfcache.nearest_existing(hub))
        raise WeightsError(
            f"not enough disk space for {repo}: {human_bytes(need)} still to download ({len(todo)} files) "
            f"+ {human_bytes(reserve)} reserve, but only {human_bytes(free)} free at {where} "
            f"(short by {human_bytes(need + reserve - free)})",
            "free some space (`hf cache ls` / `hf cache rm` list and remove cached models) or point "
            "HF_HUB_CACHE at a larger disk (metralectl mounts it into the engine's container)")


def _result(ck: Any, listing: Listing, snapshot: Path, downloaded: int, already: bool,
            checked_hub: bool = True, notes: tuple[str, ...] = ()) -> PullResult:
    return PullResult(ck.repo, ck.revision, listing.commit, snapshot, len(listing.files), listing.total_bytes,
                      downloaded, already, checked_hub, notes)


def pull(target: Any, on_event: OnEvent | None = None, *, hub: Path | None = None,
         free_space: FreeSpace = hfcache.free_bytes, workers: int = DOWNLOAD_WORKERS) -> PullResult:
    """Make the checkpoint of `target` (a Recipe or CheckpointRef) complete and verified in the cache."""
    ck = _checkpoint(target)
    hub = hub or paths.hf_hub_cache()
    emit: OnEvent = on_event or (lambda _e: None)
    check_ownership(ck.repo, hub)
    local = hfcache.cache_state(ck.repo, ck.revision, hub)
    base = hfcache.repo_dir(ck.repo, hub)
    if ck.revision and local.status == "complete" and local.snapshot is not None:
        manifest = hfcache.read_manifest(local.snapshot)
        assert manifest is not None
        return _result(ck, manifest, local.snapshot, 0, True, checked_hub=False)  # a commit never changes
    emit(PullEvent(ck.repo, "resolve", message=f"listing {ck.repo}@{ck.revision or 'main'}"))
    try:
        listing = hub_listing(ck.repo, ck.revision)
    except WeightsError as exc:
        if exc.network and local.status == "complete" and local.snapshot is not None:
            manifest = hfcache.read_manifest(local.snapshot)
            assert manifest is not None
            note = f"the Hub is unreachable; keeping the verified local copy at {manifest.commit[:12]}"
            emit(PullEvent(ck.repo, "note", message=note))
            return _result(ck, manifest, local.snapshot, 0, True, checked_hub=False, notes=(note,))
        raise
    snapshot = base / "snapshots" / listing.commit
    previous = hfcache.read_manifest(snapshot) if snapshot.is_dir() else None
    trusted = {f.path for f in previous.files if hfcache.file_ok(snapshot, f)} if previous else set()
    if previous is not None and previous.files == listing.files and len(trusted) == len(listing.files):
        _write_ref(base, ck.revision, listing.commit)
        emit(PullEvent(ck.repo, "done", listing.total_bytes, listing.total_bytes, files_done=len(listing.files),
                       files_total=len(listing.files), message="already complete"))
        return _result(ck, listing, snapshot, 0, True)

    lock = _pull_lock(ck.repo, hub)
    try:
        count, freed = _drop_dead_downloads(ck.repo, hub)
        if count:
            plural = "s" if count != 1 else ""
            emit(PullEvent(ck.repo, "note", message=f"removed {count} unfinished download{plural} "
                                                    f"({human_bytes(freed)}) left by an interrupted run"))
        snapshot.mkdir(parents=True, exist_ok=True)
        hfcache.write_json_atomic(snapshot / hfcache.EXPECTED_LISTING, listing.to_json())
        # Small files first: an access problem shows before any large transfer starts.
        todo = sorted(hfcache.missing(base, listing.commit, listing), key=lambda f: f.size)
        _preflight_disk(ck.repo, hub, todo, free_space)
        downloaded = _download(ck.repo, listing, todo, hub, emit, workers)
        check = [f for f in listing.files if f.path not in trusted]  # hash only what no manifest vouches for
        _verify(ck.repo, listing, snapshot, base, check, emit, min(workers, os.cpu_count() or 2))
        _write_manifest(snapshot, listing, ck.revision)
        _write_ref(base, ck.revision, listing.commit)
    finally:
        lock.close()
    emit(PullEvent(ck.repo, "done", listing.total_bytes, listing.total_bytes, files_done=len(listing.files),
                   files_total=len(listing.files), message=f"verified {len(listing.files)} files"))
    return _result(ck, listing, snapshot, downloaded, False)


def _download(repo: str, listing: Listing, todo: list[RepoFile], hub: Path, emit: OnEvent, workers: int) -> int:
    """Fetch `todo` with huggingface_hub.hf_hub_download (pinned to the commit); returns bytes fetched."""
    import inspect

    from huggingface_hub import hf_hub_download

    if not todo:
        return 0
    present = listing.total_bytes - sum(f.size for f in todo)
    meter = Meter(listing.total_bytes, present)
    account = Account(meter)
    # huggingface_hub >= 1.0 takes a progress-bar class per file; older ones: we count whole files.
    takes_bar = "tqdm_class" in inspect.signature(hf_hub_download).parameters
    extra: dict[str, Any] = {"tqdm_class": account.bar_class()} if takes_bar else {}
    done_files = [len(listing.files) - len(todo)]

    def fetch(spec: RepoFile) -> None:
        account.begin(spec)
        try:
            hf_hub_download(repo, spec.path, revision=listing.commit, cache_dir=str(hub), endpoint=endpoint(),
                            **extra)
        except BaseException:
            account.fail(spec)
            raise
        account.finish(spec)
        done_files[0] += 1

    def tick() -> None:
        r = meter.reading()
        emit(PullEvent(repo, "download", r.done, listing.total_bytes, r.rate_bps, r.eta_s, done_files[0],
                       len(listing.files)))

    try:
        errors = parallel(todo, fetch, workers, tick, account.cancel)
    except KeyboardInterrupt:
        # Workers still blocked in a read are abandoned (daemon threads); their temporary files
        # would outlive us, so remove them now (an open file's space is freed when we exit).
        _drop_dead_downloads(repo, hub, {f.etag for f in todo if f.etag})
        raise
    tick()
    if errors:
        spec, exc = errors[0]
        raise hub_error(exc, repo, listing.commit, token_present(), spec.path, endpoint()) from None
    return meter.done - present


def _verify(repo: str, listing: Listing, snapshot: Path, base: Path, check: list[RepoFile], emit: OnEvent,
            workers: int) -> None:
    meter = Meter(sum(f.size for f in check))
    done_files = [len(listing.files) - len(check)]

    def tick() -> None:
        r = meter.reading()
        emit(PullEvent(repo, "verify", r.done, meter.total or 0, r.rate_bps, r.eta_s, done_files[0],
                       len(listing.files)))

    problems = verify_files(snapshot, check, meter, workers, tick, done_files)
    tick()
    if not problems:
        return
    for spec, _ in problems:  # a bad copy must not be found again by the next run (or by the engine)
        _discard(snapshot, base, spec)
    first = "; ".join(f"{spec.path}: {why}" for spec, why in problems[:3])
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    raise WeightsError(f"{repo}@{listing.commit[:12]} failed verification: {first}{more}; "
                       "the bad copies were removed, the checkpoint is not marked complete",
                       "pull again to fetch them afresh; if it repeats, the Hub, a proxy or the disk is "
                       "corrupting data")


def _discard(snapshot: Path, base: Path, spec: RepoFile) -> None:
    pointer = snapshot / spec.path
    try:
        target = pointer.resolve()
        if target.is_relative_to(base / "blobs"):
            target.unlink(missing_ok=True)
        pointer.unlink(missing_ok=True)
    except OSError:
        pass


def _write_manifest(snapshot: Path, listing: Listing, revision: str | None) -> None:
    import datetime

    from metralectl import __version__
    try:
        from huggingface_hub import __version__ as hf_version
    except ImportError:
        hf_version = "?"
    data = {**listing.to_json(), "revision": revision, "verified_by": f"metralectl {__version__}",
            "huggingface_hub": hf_version,
            "verified_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    hfcache.write_json_atomic(snapshot / hfcache.VERIFIED_MANIFEST, data)


def _write_ref(base: Path, revision: str | None, commit: str) -> None:
    """An unpinned recipe follows `main`: point refs/main at the commit just verified (not before)."""
    if revision:
        return
    write_atomic(base / "refs" / "main", commit)
