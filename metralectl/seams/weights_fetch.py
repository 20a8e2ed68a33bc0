"""The two steps of a pull that move bytes: download what is missing (resume.py, in parallel, with progress
and Ctrl-C), then verify what no manifest vouches for — and refuse the checkpoint when any file is not what
the listing says. Events go to `on_event` on the calling thread. Every change goes through the cache's
`Owned`: a bad copy's snapshot entry is removed as an entry, its blob only when it lies in the repository's
blobs/ (a link out of them is never followed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from metralectl.core.progress import Meter
from metralectl.errors import ExitCode, MetralError
from metralectl.ownedfs import Owned
from metralectl.seams import hfcache, hubhttp, resume
from metralectl.seams.hfcache import Listing, RepoFile
from metralectl.seams.transfer import Account, parallel, verify_files
from metralectl.seams.weights_errors import WeightsError, hub_error
from metralectl.seams.weights_guard import drop_dead_downloads


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


OnEvent = Callable[[PullEvent], None]
Failed = list[tuple[RepoFile, resume.Problem]]


def download(repo: str, listing: Listing, todo: list[RepoFile], cache: Owned, emit: OnEvent, workers: int,
              again: str, token_present: Callable[[], bool], headers: dict[str, str]) -> tuple[int, set[str], Failed]:
    """Fetch `todo` pinned to the commit with resume.py. Returns the bytes fetched, the paths already verified
    (resume.py hashes what it places) and the files the server sent wrong (not placed). `again`: the command
    that resumes an interrupted pull."""
    import queue

    if not todo:
        return 0, set(), []
    base = cache.root / hfcache.folder_name(repo)
    notes: queue.SimpleQueue[str] = queue.SimpleQueue()  # from workers; emitted from this thread
    resume.drop_superseded(repo, base, todo, notes.put)
    present = listing.total_bytes - sum(f.size for f in todo) + sum(resume.kept(base, f) for f in todo
                                                                    if resume.resumable(f))
    meter = Meter(listing.total_bytes, present)
    account = Account(meter)
    job = resume.Job(repo, listing.commit, base, cache, headers, account, notes.put)
    done_files = [len(listing.files) - len(todo)]
    placed: set[str] = set()
    failed: Failed = []

    def fetch(spec: RepoFile) -> None:
        account.begin(spec)
        try:
            here, problem = resume.fetch(job, spec)
        except BaseException:
            account.fail(spec)
            raise
        if problem is not None:
            account.fail(spec)
            failed.append((spec, problem))
        else:
            account.finish(spec)
            if here:
                placed.add(spec.path)
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
        # Workers still blocked in a read are abandoned (daemon threads); their `.incomplete` files would
        # outlive us, so remove them now (an open file's space is freed when we exit). Our parts stay.
        drop_dead_downloads(repo, cache.root, {f.etag for f in todo if f.etag and not resume.resumable(f)})
        for line in resume.kept_message(base, todo, again):
            emit(PullEvent(repo, "note", message=line))
        raise
    tick()
    if errors:
        spec, exc = errors[0]
        error = hub_error(exc, repo, listing.commit, token_present(), spec.path, hubhttp.endpoint_named())
        if isinstance(error, hubhttp.HubHTTPError):  # an answer hub_error has no remedy for: still said plainly
            error = WeightsError(f"{repo}/{spec.path}: the Hub answered {error}", "pull again; finished files are kept")
        raise error from None
    return meter.done - present + account.discarded, placed, failed


def verify(repo: str, listing: Listing, snapshot: Path, base: Path, cache: Owned, check_now: list[RepoFile],
            failed: Failed, emit: OnEvent, workers: int) -> None:
    """Hash what needs it; refuse the checkpoint (nothing marked complete) when any file, hashed here or
    refused while downloading, is not what the listing says."""
    meter = Meter(sum(f.size for f in check_now))
    done_files = [len(listing.files) - len(check_now)]

    def tick() -> None:
        r = meter.reading()
        emit(PullEvent(repo, "verify", r.done, meter.total or 0, r.rate_bps, r.eta_s, done_files[0],
                       len(listing.files)))

    problems = verify_files(snapshot, check_now, meter, workers, tick, done_files, cache)
    tick()
    for spec, _ in problems:  # a bad copy must not be found again by the next run (or by the engine)
        _discard(cache, snapshot, base, spec)
    every = sorted([*[(s, p.why, p.data) for s, p in failed], *[(s, why, False) for s, why in problems]],
                   key=lambda p: p[0].path)
    if not every:
        return
    first = "; ".join(f"{spec.path}: {why}" for spec, why, _ in every[:3])
    more = f" (and {len(every) - 3} more)" if len(every) > 3 else ""
    raise WeightsError(f"{repo}@{listing.commit[:12]} failed verification: {first}{more}; "
                       "the bad copies were removed, the checkpoint is not marked complete",
                       "pull again to fetch them afresh; if it repeats, the Hub, a proxy or the disk is "
                       "corrupting data",
                       exit_code=ExitCode.DATA if any(data for _, _, data in every) else ExitCode.FAILED)


def _discard(cache: Owned, snapshot: Path, base: Path, spec: RepoFile) -> None:
    """The snapshot's entry goes, and the blob it points to when that lies in this repository's blobs/ (a link
    out of them is never followed: what it points to is left alone)."""
    pointer = snapshot / spec.path
    target = cache.link_target(pointer)
    blobs = cache.parts(base / "blobs")
    try:
        if target is not None and len(target) == len(blobs) + 1 and target[:-1] == blobs:
            cache.remove_file("/".join(target))
        cache.remove_file(pointer)
    except (OSError, MetralError):
        pass
