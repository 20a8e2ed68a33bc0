"""The steps of a pull between the listing and the manifest (weights.pull calls them in order): before it writes
anything, whose cache it is, one pull per repository, dead downloads, and disk; then download what is missing
(download.py, in parallel, with progress and Ctrl-C), then verify what no manifest vouches for, refusing the
checkpoint when any file is not what the listing says.

Ownership is the "I once ran sudo metralectl" trap (SPEC §5): a root-owned file in a user's cache (a past
`sudo` download) makes the next unprivileged download or cleanup fail half-way with a bare PermissionError;
finding it first lets `pull` say why. The scan never follows a link: a repository folder that is a symlink is
looked at, not walked through. The lock files, the dead downloads and a bad copy go through the cache's
`Owned` (never through a link): a bad copy's snapshot entry is removed as an entry, its blob only when it lies
in the repository's blobs/. Events go to `on_event` on the calling thread.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from metralectl import paths, wording
from metralectl.core.progress import Meter, human_bytes
from metralectl.errors import ExitCode, MetralError
from metralectl.ownedfs import Owned
from metralectl.seams.hf import cache as hfcache, download as hfdownload, hub as hfhub
from metralectl.seams.hf.hub import WeightsError, hub_error
from metralectl.seams.hf.listing import Listing, RepoFile
from metralectl.seams.hf.staging import Account, parallel, verify_files


@dataclass(frozen=True)
class Ownership:
    uid: int  # whose cache this should be
    offenders: tuple[Path, ...]  # a sample (at most `limit`)
    count: int
    fix_path: Path | None

    @property
    def ok(self) -> bool:
        return self.count == 0

    @property
    def fix(self) -> str:
        return f"sudo chown -R $USER: {shlex.quote(str(self.fix_path))}" if self.fix_path else ""

    def describe(self) -> str:
        owners = sorted({_owner_name(p) for p in self.offenders})
        sample = ", ".join(paths.display(p) for p in self.offenders[:3])
        more = f" and {self.count - 3} more" if self.count > 3 else ""
        return (f"{wording.count(self.count, 'path')} in your Hugging Face cache "
                f"{wording.noun(self.count, 'belongs', 'belong')} to {', '.join(owners)}, not to you: {sample}{more}")


def _owner_name(path: Path) -> str:
    try:
        uid = path.lstat().st_uid
    except OSError:
        return "?"
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return f"uid {uid}"


def nearest_existing(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def ownership(repo: str | None, hub: Path | None = None, uid: int | None = None, limit: int = 20) -> Ownership:
    """Paths of the cache (the hub dir, HF_HOME, the repo's tree, its locks) not owned by `uid`."""
    uid = os.geteuid() if uid is None else uid
    hub = hub or paths.hf_hub_cache()
    home = paths.hf_home()
    tops = [p for p in (home, hub) if p.exists() and (p == hub or hub.is_relative_to(home))]
    trees: list[Path] = []
    if repo is not None:
        folder = hfcache.folder_name(repo)
        trees = [hub / folder, hub / ".locks" / folder]
    found: list[Path] = []
    count = 0

    def check(path: Path) -> None:
        nonlocal count
        try:
            if path.lstat().st_uid != uid:
                count += 1
                if len(found) < limit:
                    found.append(path)
        except OSError:
            pass

    for top in dict.fromkeys(tops):
        check(top)
    for tree in trees:
        if tree.is_symlink():  # looked at, never walked through (os.walk would follow a link at the top)
            check(tree)
            continue
        for root, dirs, files in os.walk(tree):
            check(Path(root))
            for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
                check(Path(root) / name)
    return Ownership(uid, tuple(found), count, _fix_path(found, [home, hub, *trees[:1]]) if found else None)


def _fix_path(found: Iterable[Path], candidates: list[Path]) -> Path:
    """The smallest of HF_HOME / the hub / the repo folder that holds every offender."""
    found = list(found)
    best = candidates[0]
    for candidate in candidates:
        if all(p == candidate or p.is_relative_to(candidate) for p in found):
            best = candidate
    if not all(p.is_relative_to(best) for p in found):
        best = Path(os.path.commonpath([str(p) for p in found]))
    return best


def free_bytes(path: Path) -> int:
    """Free space for an unprivileged writer on the filesystem that holds `path` (or would)."""
    return shutil.disk_usage(nearest_existing(path)).free


RESERVE_FRACTION = 50  # keep 2 % (at most 1 GiB) free beyond the download itself
FreeSpace = Callable[[Path], int]


def check_ownership(repo: str, hub: Path) -> None:
    """Refuse before writing: root writing into a user's cache, or a user's cache holding root's files."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        top = nearest_existing(hub)
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
    found = ownership(repo, hub)
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
        where = paths.display(nearest_existing(hub))
        raise WeightsError(
            f"not enough disk space for {repo}: {human_bytes(need)} still to download ({wording.count(len(todo), 'file')}) "
            f"+ {human_bytes(reserve)} reserve, but only {human_bytes(free)} free at {where} "
            f"(short by {human_bytes(need + reserve - free)})",
            "free some space (`metralectl prune`, `metralectl rm RECIPE`; `hf cache ls` / `hf cache rm` for "
            "the rest) or point "
            "HF_HUB_CACHE at a larger disk (metralectl mounts it into the engine's container)")


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
Failed = list[tuple[RepoFile, hfdownload.Problem]]


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
    hfdownload.drop_superseded(repo, base, todo, notes.put)
    present = listing.total_bytes - sum(f.size for f in todo) + sum(hfdownload.kept(base, f) for f in todo
                                                                    if hfdownload.resumable(f))
    meter = Meter(listing.total_bytes, present)
    account = Account(meter)
    job = hfdownload.Job(repo, listing.commit, base, cache, headers, account, notes.put)
    done_files = [len(listing.files) - len(todo)]
    placed: set[str] = set()
    failed: Failed = []

    def fetch(spec: RepoFile) -> None:
        account.begin(spec)
        try:
            here, problem = hfdownload.fetch(job, spec)
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
        drop_dead_downloads(repo, cache.root, {f.etag for f in todo if f.etag and not hfdownload.resumable(f)})
        for line in hfdownload.kept_message(base, todo, again):
            emit(PullEvent(repo, "note", message=line))
        raise
    tick()
    if errors:
        spec, exc = errors[0]
        error = hub_error(exc, repo, listing.commit, token_present(), spec.path, hfhub.endpoint_named())
        if isinstance(error, hfhub.HubHTTPError):  # an answer hub_error has no remedy for: still said plainly
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
