"""Checkpoint weights: the Hugging Face seam. The only module that imports huggingface_hub, and only
inside the functions that talk to the Hub (`list` and `run` preflight stay filesystem-only).

`pull` = list the repo at a commit (sizes, sha256; every name checked: listing.repo_file/make_listing)
-> choose what the engine needs (the whole snapshot; for a GGUF checkpoint only its quant's files,
gguf.py) -> refuse early (ownership, disk) -> download the missing files with metralectl's own
downloader (download.py: names from the listing only, never from a server's headers; large files
resumable) -> hash every file against the listing (download.py hashes what it places) -> only then write
the manifest that makes `state.checkpoint_state` say "complete". Every change in the cache goes
through its `ownedfs.Owned` (cache.owned): nothing is written, renamed, linked or removed through a
symlink, or outside the hub folder. Progress and notes are events handed to `on_event`, always from the
calling thread; nothing here prints.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from metralectl import paths, wording
from metralectl.errors import ExitCode
from metralectl.core.progress import human_bytes
from metralectl.names import check
from metralectl.ownedfs import Owned
from metralectl.safetext import clean
from metralectl.seams.hf import (cache as hfcache, download as hfdownload, gguf as hfgguf, hub as hfhub,
                                 listing as hflisting, state as hfstate, steps as hfsteps)
from metralectl.seams.hf.hub import WeightsError, hub_error
from metralectl.seams.hf.listing import Listing, ListingRefused
from metralectl.seams.hf.steps import (FreeSpace, OnEvent, PullEvent, check_ownership, download,
                                       drop_dead_downloads, preflight_disk, pull_lock, verify)


DOWNLOAD_WORKERS = 8  # as snapshot_download: parallel files hide per-connection CDN limits


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
    quant: str | None = None  # a GGUF checkpoint's quant: `files`, `total_bytes` and `paths` are its files only
    paths: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out = {"repo": self.repo, "revision": self.revision, "commit": self.commit, "status": "complete",
               "format": "gguf" if self.quant is not None else "safetensors",
               "snapshot": str(self.snapshot), "files": self.files, "total_bytes": self.total_bytes,
               "downloaded_bytes": self.downloaded_bytes, "already_complete": self.already_complete,
               "checked_hub": self.checked_hub, "notes": list(self.notes)}
        if self.quant is not None:
            out.update(quant=self.quant, paths=list(self.paths))
        return out


class Checkpoint(Protocol):
    """What a pull needs of a checkpoint (core.recipe.CheckpointRef has it; `format` is read with a default)."""

    @property
    def repo(self) -> str: ...

    @property
    def revision(self) -> str | None: ...

    @property
    def quant(self) -> str: ...


def _checkpoint(target: Any) -> Checkpoint:
    """A Recipe's checkpoint, or the target itself (a CheckpointRef: anything with .repo and .revision)."""
    checkpoint: Checkpoint = getattr(target, "checkpoint", target)
    return checkpoint


def gguf_quant(ck: Any) -> str | None:
    """The quant whose files are all a GGUF checkpoint needs; None for a whole-snapshot checkpoint."""
    return str(ck.quant) if getattr(ck, "format", "safetensors") == "gguf" else None


def state(target: Any, hub: Path | None = None) -> hfcache.CacheState:
    return hfstate.checkpoint_state(_checkpoint(target), hub)


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
    found = found or hfstate.checkpoint_state(ck, hub)
    problem = hfgguf.serving_problem(ck.repo, quant, found) if found.status in ("complete", "present") else None
    if problem is not None:
        raise ServingConflict(*problem)


def weights_preflight(recipe: Any, hub: Path | None = None) -> None:
    """For `run`/`swap` before launch: raise unless what the engine needs of the checkpoint is complete
    (verified), and, for llama.cpp, unless `-hf REPO:QUANT` would load exactly those files."""
    ck = recipe.checkpoint
    quant = gguf_quant(ck)
    found = hfstate.checkpoint_state(ck, hub)
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


def endpoint() -> str | None:
    """HF_ENDPOINT read now, not when a module was imported (tests and mirrors set it late)."""
    return hfhub.endpoint_named()


def token_present() -> bool:
    return bool(os.environ.get("HF_TOKEN") or _token())


def hub_headers() -> dict[str, str]:
    """The headers every request to the Hub carries: our user agent and the token as huggingface_hub finds it
    (HF_TOKEN, the saved token; none under HF_HUB_DISABLE_IMPLICIT_TOKEN), checked sendable. Not
    huggingface_hub's build_hf_headers: in 2.4 it fetches {HF_ENDPOINT}/api/agent-harnesses and caches the
    answer in HF_HOME — a mirror's text, written outside the hub cache, for a user-agent string."""
    from metralectl import __version__

    sent = {"User-Agent": f"metralectl/{__version__}"}
    implicit_off = os.environ.get("HF_HUB_DISABLE_IMPLICIT_TOKEN", "").strip().upper() in ("1", "ON", "YES", "TRUE")
    token = None if implicit_off else _token()
    if token:
        sent["Authorization"] = f"Bearer {token}"
    return hfhub.checked_headers(sent)


def _token() -> str | None:
    try:
        from huggingface_hub import get_token

        return get_token()
    except Exception:  # noqa: BLE001 - an unreadable token file is the same as none
        return None


def hub_listing(repo: str, revision: str | None) -> Listing:
    """The repo's files at `revision` (default branch when None): path, size, sha256/git oid, and the commit,
    every name checked before any use (hostile: UnsafeName / ListingRefused, exit 65, nothing written)."""
    check("repo", repo, "the recipe's checkpoint.repo")
    rev = revision or "main"
    try:
        data = hfhub.get_json(repo, rev, hub_headers())
    except Exception as exc:  # noqa: BLE001 - translated (or re-raised) by hub_error
        raise hub_error(exc, repo, rev, token_present(), endpoint=endpoint()) from None
    return parse_listing(repo, rev, data, f"the Hub at {hfhub.endpoint()}")


def parse_listing(repo: str, rev: str, data: object, source: str) -> Listing:
    """A model-info answer as a Listing; refused (exit 65) unless every part of it is what a Hub sends."""
    siblings = data.get("siblings") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(siblings, list) or "sha" not in data:
        raise ListingRefused(f"{source} answered for {repo}@{rev} with something a Hub does not send: without a "
                             "commit or a file list; nothing was written",
                             f"check HF_ENDPOINT ({hfhub.endpoint()}) points at a Hugging Face Hub")
    if len(siblings) > hflisting.MAX_FILES:
        raise ListingRefused(f"{source} listed {len(siblings)} files for {repo}: more than {hflisting.MAX_FILES}; "
                             "nothing was written", "check HF_ENDPOINT points at a Hugging Face Hub")
    files = []
    for entry in siblings:
        lfs = entry.get("lfs") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not isinstance(lfs, (dict, type(None))):
            raise ListingRefused(f"{source} listed a file of {repo} that is not one ({type(entry).__name__}); "
                                 "nothing was written", "check HF_ENDPOINT points at a Hugging Face Hub")
        size = lfs.get("size") if lfs is not None else entry.get("size")
        files.append(hflisting.repo_file(entry.get("rfilename"), size, lfs.get("sha256") if lfs is not None else None,
                                       entry.get("blobId"), source))
    return hflisting.make_listing(repo, data["sha"], files, source)


def _result(ck: Any, listing: Listing, snapshot: Path, downloaded: int, already: bool,
            checked_hub: bool = True, notes: tuple[str, ...] = ()) -> PullResult:
    """`listing`: what the checkpoint needs (a GGUF quant's files, or the whole snapshot)."""
    quant = gguf_quant(ck)
    return PullResult(ck.repo, ck.revision, listing.commit, snapshot, len(listing.files), listing.total_bytes,
                      downloaded, already, checked_hub, notes, quant,
                      tuple(f.path for f in listing.files) if quant is not None else ())


def _local(ck: Any, found: hfcache.CacheState) -> Listing:
    """What a complete checkpoint's manifest vouches for, as a listing of the needed files."""
    assert found.snapshot is not None
    if gguf_quant(ck) is None:
        manifest = hfcache.read_manifest(found.snapshot)
        assert manifest is not None
        return manifest
    verified = hfgguf.read_verified(found.snapshot)
    assert verified is not None
    return Listing(ck.repo, found.snapshot.name, tuple(verified.files[p] for p in found.paths))


def _wanted(target: Any, ck: Any, listing: Listing, emit: OnEvent) -> tuple[Listing, hfgguf.Model | None]:
    """The files to fetch and verify: the listing, or the quant's model file(s) in it (all split parts)."""
    quant = gguf_quant(ck)
    if quant is None:
        return listing, None
    try:
        model = hfgguf.select(ck.repo, listing.commit, listing.files, quant)
    except WeightsError as exc:
        origin = getattr(getattr(target, "origin", None), "path", None)
        if origin is not None and "checkpoint.quant" in (exc.hint or ""):  # name the recipe file to edit
            exc.hint = (f"set `checkpoint.quant:` in {origin} to one of those "
                        f"(or try one: `--set checkpoint.quant=QUANT`)")
        raise
    weights = [f for f in listing.files if f.path.endswith(".gguf")]
    emit(PullEvent(ck.repo, "note", message=(
        f"{quant}: {wording.count(len(model.parts), 'file')}, {human_bytes(model.total_bytes)} "
        f"({model.first}); the repository holds {wording.count(len(weights), '.gguf file')}, "
        f"{human_bytes(sum(f.size for f in weights))}")))
    return Listing(listing.repo, listing.commit, model.parts), model


def pull(target: Any, on_event: OnEvent | None = None, *, hub: Path | None = None,
         free_space: FreeSpace = hfsteps.free_bytes, workers: int = DOWNLOAD_WORKERS) -> PullResult:
    """Make the checkpoint of `target` (a Recipe or CheckpointRef) complete and verified in the cache."""
    ck = _checkpoint(target)
    check("repo", ck.repo, "the recipe's checkpoint.repo")
    hub = hub or paths.hf_hub_cache()
    cache = hfcache.owned(hub)
    emit: OnEvent = on_event or (lambda _e: None)
    check_ownership(ck.repo, hub)
    quant = gguf_quant(ck)
    local = hfstate.checkpoint_state(ck, hub)
    base = hfcache.repo_dir(ck.repo, hub)
    if ck.revision and local.status == "complete" and local.snapshot is not None:
        return _result(ck, _local(ck, local), local.snapshot, 0, True, checked_hub=False)  # a commit never changes
    emit(PullEvent(ck.repo, "resolve", message=f"listing {ck.repo}@{ck.revision or 'main'}"))
    try:
        listing = hub_listing(ck.repo, ck.revision)
    except WeightsError as exc:
        if exc.network and local.status == "complete" and local.snapshot is not None:
            note = f"the Hub is unreachable; keeping the verified local copy at {local.snapshot.name[:12]}"
            emit(PullEvent(ck.repo, "note", message=note))
            return _result(ck, _local(ck, local), local.snapshot, 0, True, checked_hub=False, notes=(note,))
        raise
    wanted, model = _wanted(target, ck, listing, emit)
    snapshot = base / "snapshots" / listing.commit
    if model is not None:
        trusted = hfgguf.trusted(snapshot, wanted.files)
        already = len(trusted) == len(wanted.files) and hfgguf.recorded(snapshot, ck.quant, wanted.files)
    else:
        previous = hfcache.read_manifest(snapshot) if hfcache.is_dir(cache, snapshot) else None
        trusted = {f.path for f in previous.files if hfcache.file_ok(snapshot, f, cache)} if previous else set()
        already = previous is not None and previous.files == listing.files and len(trusted) == len(listing.files)
    if already:
        notes = _write_ref(cache, base, ck.revision, listing.commit, quant)
        emit(PullEvent(ck.repo, "done", wanted.total_bytes, wanted.total_bytes, files_done=len(wanted.files),
                       files_total=len(wanted.files), message="already complete"))
        return _result(ck, wanted, snapshot, 0, True, notes=notes)

    lock = pull_lock(ck.repo, hub)
    try:
        count, freed = drop_dead_downloads(ck.repo, hub)
        if count:
            emit(PullEvent(ck.repo, "note", message=f"removed {wording.count(count, 'unfinished download')} "
                                                    f"({human_bytes(freed)}) left by an interrupted run"))
        cache.make_dirs(snapshot)  # refused (exit 65) when the repository folder or snapshots/ is a link
        hfcache.put_json(cache, snapshot / hfcache.EXPECTED_LISTING, listing.to_json())
        _repair(cache, base, listing.commit, wanted,  # what would not be fetched again by itself
                lambda text: emit(PullEvent(ck.repo, "note", message=text)))
        # Small files first: an access problem shows before any large transfer starts.
        todo = sorted(hfcache.missing(base, listing.commit, wanted), key=lambda f: f.size)
        preflight_disk(f"{ck.repo}:{quant}" if quant else ck.repo, hub, todo, free_space)
        name = getattr(target, "name", None)
        again = f"`metralectl pull {name}`" if name else "pulling it again"
        downloaded, placed, failed = download(ck.repo, wanted, todo, cache, emit, workers, again, token_present,
                                              hub_headers())
        # hash only what no manifest vouches for and resume.py did not just hash (or refuse)
        check_now = [f for f in wanted.files if f.path not in trusted | placed | {s.path for s, _ in failed}]
        verify(ck.repo, wanted, snapshot, base, cache, check_now, failed, emit, min(workers, os.cpu_count() or 2))
        if model is not None:  # add this quant to what the manifest vouches for (other quants kept)
            hfgguf.record(snapshot, listing, ck.quant, model, _stamp(ck.revision))
        else:
            hfcache.put_json(cache, snapshot / hfcache.VERIFIED_MANIFEST, {**listing.to_json(), **_stamp(ck.revision)})
        notes = _write_ref(cache, base, ck.revision, listing.commit, quant)
    except OSError as exc:  # the cache itself refused (a folder where a file belongs, permissions, a full disk)
        raise _cache_error(ck.repo, listing.commit, exc) from None
    finally:
        lock.close()
    for note in notes:
        emit(PullEvent(ck.repo, "note", message=note))
    emit(PullEvent(ck.repo, "done", wanted.total_bytes, wanted.total_bytes, files_done=len(wanted.files),
                   files_total=len(wanted.files), message=f"verified {wording.count(len(wanted.files), 'file')}"))
    return _result(ck, wanted, snapshot, downloaded, False, notes=notes)


def _repair(cache: Owned, base: Path, commit: str, listing: Listing, note: Callable[[str], None]) -> None:
    """Before a download: a finished blob without its snapshot link (a download killed between the blob's rename
    and its link, or a link removed by hand) counts as present in `missing`, so nothing would fetch it: link
    it. A finished blob of the wrong size is damaged (downloads in progress are `.incomplete` files): remove it
    and the snapshot's entry (the entry itself: a link's target is never touched), so it is fetched afresh."""
    snapshot = base / "snapshots" / commit
    for spec in listing.files:
        if not spec.etag or hfcache.file_ok(snapshot, spec, cache):
            continue
        st = hfcache.lstat(cache, base / "blobs" / spec.etag)
        if st is None:
            continue
        if st.st_size == spec.size and stat.S_ISREG(st.st_mode):
            hfdownload.link_snapshot(cache, base, commit, spec, note)
        elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
            cache.remove_file(base / "blobs" / spec.etag)
            cache.remove_file(snapshot / spec.path)


def _cache_error(repo: str, commit: str, exc: OSError) -> BaseException:
    error = hub_error(exc, repo, commit, token_present(), endpoint=endpoint())
    if isinstance(error, WeightsError):
        return error
    where = clean(paths.display(Path(exc.filename)), 200) if isinstance(exc.filename, str) else "the Hugging Face cache"
    return WeightsError(f"{repo}: {where} could not be changed ({clean(exc.strerror or str(exc), 200)}); the "
                        "checkpoint is not marked complete", "fix or remove that path and pull again")


def _stamp(revision: str | None) -> dict[str, Any]:
    import datetime

    from metralectl import __version__
    return {"revision": revision, "verified_by": f"metralectl {__version__}",
            "verified_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _write_ref(cache: Owned, base: Path, revision: str | None, commit: str, quant: str | None = None) -> tuple[str, ...]:
    """An unpinned recipe follows `main`: point refs/main at the commit just verified (not before).
    llama-server's `-hf` takes no revision and reads only the snapshot refs/ names, so a pinned GGUF pull
    names its commit in refs/main when no ref names any; when another does, it says so (a note).
    refs/main is replaced as an entry: a link there is never written through."""
    ref = base / "refs" / "main"
    said = ((f"{paths.display(ref)} was a symbolic link: replaced, not followed (what it pointed to was left "
             "alone)",) if hfcache.is_link(cache, ref) else ())
    if not revision:
        cache.put(ref, commit)
        return said
    if quant is None:
        return ()
    served = hfgguf.served_commit(base)
    if served is None:
        cache.put(ref, commit)
        return said
    if served == commit:
        return ()
    return (f"llama-server reads the snapshot refs/main names ({served[:12]}), not this pinned commit "
            f"({commit[:12]}); `metralectl run` refuses until refs/main names it",)
