"""Checkpoint weights: the Hugging Face seam. The only module that imports huggingface_hub, and only
inside the functions that talk to the Hub (`list` and `run` preflight stay filesystem-only).

`pull` = list the repo at a commit (sizes, sha256) -> choose what the engine needs (the whole snapshot;
for a GGUF checkpoint only its quant's files, gguf.py) -> refuse early (ownership, disk) -> download the
missing files (large LFS files with resume.py's resumable downloader, the rest with huggingface_hub's)
-> hash every file against the listing (resume.py hashes what it places) -> only then write the manifest
that makes `weights_state.checkpoint_state` say "complete". Progress and notes are events handed to
`on_event`, always from the calling thread; nothing here prints.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from metralectl.seams import gguf, gguf_cache, hfcache, resume, weights_state

from metralectl import paths
from metralectl.atomicfile import write_atomic
from metralectl.errors import ExitCode
from metralectl.seams.hfcache import Listing, RepoFile
from metralectl.core.progress import Meter, human_bytes
from metralectl.seams.transfer import Account, parallel, verify_files
from metralectl.seams.weights_errors import WeightsError, hub_error
from metralectl.seams.weights_guard import FreeSpace, check_ownership, drop_dead_downloads, preflight_disk, pull_lock

DOWNLOAD_WORKERS = 8  # as snapshot_download: parallel files hide per-connection CDN limits


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


OnEvent = Callable[[PullEvent], None]


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
    return weights_state.checkpoint_state(_checkpoint(target), hub)


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
    found = found or weights_state.checkpoint_state(ck, hub)
    problem = gguf_cache.serving_problem(ck.repo, quant, found) if found.status in ("complete", "present") else None
    if problem is not None:
        raise ServingConflict(*problem)


def weights_preflight(recipe: Any, hub: Path | None = None) -> None:
    """For `run`/`swap` before launch: raise unless what the engine needs of the checkpoint is complete
    (verified), and, for llama.cpp, unless `-hf REPO:QUANT` would load exactly those files."""
    ck = recipe.checkpoint
    quant = gguf_quant(ck)
    found = weights_state.checkpoint_state(ck, hub)
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
    verified = gguf_cache.read_verified(found.snapshot)
    assert verified is not None
    return Listing(ck.repo, found.snapshot.name, tuple(verified.files[p] for p in found.paths))


def _wanted(target: Any, ck: Any, listing: Listing, emit: OnEvent) -> tuple[Listing, gguf.Model | None]:
    """The files to fetch and verify: the listing, or the quant's model file(s) in it (all split parts)."""
    quant = gguf_quant(ck)
    if quant is None:
        return listing, None
    try:
        model = gguf.select(ck.repo, listing.commit, listing.files, quant)
    except WeightsError as exc:
        origin = getattr(getattr(target, "origin", None), "path", None)
        if origin is not None and "checkpoint.quant" in (exc.hint or ""):  # name the recipe file to edit
            exc.hint = (f"set `checkpoint.quant:` in {origin} to one of those "
                        f"(or try one: `--set checkpoint.quant=QUANT`)")
        raise
    weights = [f for f in listing.files if f.path.endswith(".gguf")]
    emit(PullEvent(ck.repo, "note", message=(
        f"{quant}: {len(model.parts)} file{'s' if len(model.parts) != 1 else ''}, {human_bytes(model.total_bytes)} "
        f"({model.first}); the repository holds {len(weights)} .gguf files, "
        f"{human_bytes(sum(f.size for f in weights))}")))
    return Listing(listing.repo, listing.commit, model.parts), model


def pull(target: Any, on_event: OnEvent | None = None, *, hub: Path | None = None,
         free_space: FreeSpace = hfcache.free_bytes, workers: int = DOWNLOAD_WORKERS) -> PullResult:
    """Make the checkpoint of `target` (a Recipe or CheckpointRef) complete and verified in the cache."""
    ck = _checkpoint(target)
    hub = hub or paths.hf_hub_cache()
    emit: OnEvent = on_event or (lambda _e: None)
    check_ownership(ck.repo, hub)
    quant = gguf_quant(ck)
    local = weights_state.checkpoint_state(ck, hub)
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
        trusted = gguf_cache.trusted(snapshot, wanted.files)
        already = len(trusted) == len(wanted.files) and gguf_cache.recorded(snapshot, ck.quant, wanted.files)
    else:
        previous = hfcache.read_manifest(snapshot) if snapshot.is_dir() else None
        trusted = {f.path for f in previous.files if hfcache.file_ok(snapshot, f)} if previous else set()
        already = previous is not None and previous.files == listing.files and len(trusted) == len(listing.files)
    if already:
        notes = _write_ref(base, ck.revision, listing.commit, quant)
        emit(PullEvent(ck.repo, "done", wanted.total_bytes, wanted.total_bytes, files_done=len(wanted.files),
                       files_total=len(wanted.files), message="already complete"))
        return _result(ck, wanted, snapshot, 0, True, notes=notes)

    lock = pull_lock(ck.repo, hub)
    try:
        count, freed = drop_dead_downloads(ck.repo, hub)
        if count:
            plural = "s" if count != 1 else ""
            emit(PullEvent(ck.repo, "note", message=f"removed {count} unfinished download{plural} "
                                                    f"({human_bytes(freed)}) left by an interrupted run"))
        snapshot.mkdir(parents=True, exist_ok=True)
        hfcache.write_json_atomic(snapshot / hfcache.EXPECTED_LISTING, listing.to_json())
        hfcache.repair_links(base, listing.commit, wanted)  # what huggingface_hub would not fetch again
        # Small files first: an access problem shows before any large transfer starts.
        todo = sorted(hfcache.missing(base, listing.commit, wanted), key=lambda f: f.size)
        preflight_disk(f"{ck.repo}:{quant}" if quant else ck.repo, hub, todo, free_space)
        name = getattr(target, "name", None)
        again = f"`metralectl pull {name}`" if name else "pulling it again"
        downloaded, placed = _download(ck.repo, wanted, todo, hub, emit, workers, again)
        # hash only what no manifest vouches for and resume.py did not just hash
        check = [f for f in wanted.files if f.path not in trusted and f.path not in placed]
        _verify(ck.repo, wanted, snapshot, base, check, emit, min(workers, os.cpu_count() or 2))
        if model is not None:  # add this quant to what the manifest vouches for (other quants kept)
            gguf_cache.record(snapshot, listing, ck.quant, model, _stamp(ck.revision))
        else:
            _write_manifest(snapshot, listing, ck.revision)
        notes = _write_ref(base, ck.revision, listing.commit, quant)
    finally:
        lock.close()
    for note in notes:
        emit(PullEvent(ck.repo, "note", message=note))
    emit(PullEvent(ck.repo, "done", wanted.total_bytes, wanted.total_bytes, files_done=len(wanted.files),
                   files_total=len(wanted.files), message=f"verified {len(wanted.files)} files"))
    return _result(ck, wanted, snapshot, downloaded, False, notes=notes)


def _download(repo: str, listing: Listing, todo: list[RepoFile], hub: Path, emit: OnEvent, workers: int,
              again: str) -> tuple[int, set[str]]:
    """Fetch `todo` pinned to the commit: large LFS files with our resumable downloader (resume.py), the rest
    with huggingface_hub.hf_hub_download. Returns the bytes fetched and the paths already verified (resume.py
    hashes what it places). `again`: the command that resumes an interrupted pull."""
    import inspect
    import queue

    from huggingface_hub import hf_hub_download, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    if not todo:
        return 0, set()
    base = hfcache.repo_dir(repo, hub)
    notes: queue.SimpleQueue[str] = queue.SimpleQueue()  # from workers; emitted from this thread
    resume.drop_superseded(repo, base, todo, notes.put)
    present = listing.total_bytes - sum(f.size for f in todo) + sum(resume.kept(base, f) for f in todo
                                                                    if resume.resumable(f))
    meter = Meter(listing.total_bytes, present)
    account = Account(meter)
    # huggingface_hub >= 1.0 takes a progress-bar class per file; older ones: we count whole files.
    takes_bar = "tqdm_class" in inspect.signature(hf_hub_download).parameters
    extra: dict[str, Any] = {"tqdm_class": account.bar_class()} if takes_bar else {}
    headers = {**build_hf_headers(), "Accept-Encoding": "identity"}  # the token, as hf_hub_download sends it
    done_files = [len(listing.files) - len(todo)]
    placed: set[str] = set()

    def fetch(spec: RepoFile) -> None:
        account.begin(spec)
        try:
            if resume.resumable(spec):
                url = hf_hub_url(repo, spec.path, revision=listing.commit, endpoint=endpoint())
                if resume.fetch(repo, listing.commit, spec, base, url, headers, account, notes.put):
                    placed.add(spec.path)
            else:
                hf_hub_download(repo, spec.path, revision=listing.commit, cache_dir=str(hub), endpoint=endpoint(),
                                **extra)
        except BaseException:
            account.fail(spec)
            raise
        account.finish(spec)
        done_files[0] += 1

    def tick() -> None:
        while not notes.empty():
            emit(PullEvent(repo, "note", message=notes.get()))
        r = meter.reading()
        emit(PullEvent(repo, "download", r.done, listing.total_bytes, r.rate_bps, r.eta_s, done_files[0],
                       len(listing.files)))

    try:
        errors = parallel(todo, fetch, workers, tick, account.cancel)
    except KeyboardInterrupt:
        # Workers still blocked in a read are abandoned (daemon threads); huggingface_hub's temporary files
        # would outlive us, so remove them now (an open file's space is freed when we exit). Our parts stay.
        drop_dead_downloads(repo, hub, {f.etag for f in todo if f.etag and not resume.resumable(f)})
        for line in resume.kept_message(base, todo, again):
            emit(PullEvent(repo, "note", message=line))
        raise
    tick()
    if errors:
        spec, exc = errors[0]
        error = hub_error(exc, repo, listing.commit, token_present(), spec.path, endpoint())
        if isinstance(error, resume.HubHTTPError):  # an answer hub_error has no remedy for: still said plainly
            error = WeightsError(f"{repo}/{spec.path}: the Hub answered {error}", "pull again; finished files are kept")
        raise error from None
    return meter.done - present + account.discarded, placed


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


def _stamp(revision: str | None) -> dict[str, Any]:
    import datetime

    from metralectl import __version__
    try:
        from huggingface_hub import __version__ as hf_version
    except ImportError:
        hf_version = "?"
    return {"revision": revision, "verified_by": f"metralectl {__version__}", "huggingface_hub": hf_version,
            "verified_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _write_manifest(snapshot: Path, listing: Listing, revision: str | None) -> None:
    hfcache.write_json_atomic(snapshot / hfcache.VERIFIED_MANIFEST, {**listing.to_json(), **_stamp(revision)})


def _write_ref(base: Path, revision: str | None, commit: str, quant: str | None = None) -> tuple[str, ...]:
    """An unpinned recipe follows `main`: point refs/main at the commit just verified (not before).
    llama-server's `-hf` takes no revision and reads only the snapshot refs/ names, so a pinned GGUF pull
    names its commit in refs/main when no ref names any; when another does, it says so (a note)."""
    if not revision:
        write_atomic(base / "refs" / "main", commit)
        return ()
    if quant is None:
        return ()
    served = gguf_cache.served_commit(base)
    if served is None:
        write_atomic(base / "refs" / "main", commit)
        return ()
    if served == commit:
        return ()
    return (f"llama-server reads the snapshot refs/main names ({served[:12]}), not this pinned commit "
            f"({commit[:12]}); `metralectl run` refuses until refs/main names it",)
