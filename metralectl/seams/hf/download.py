"""Every file of a pull, downloaded by metralectl itself: huggingface_hub's downloader names blobs by the
server's ETag header and snapshots by its X-Repo-Commit header, unchecked, so a hostile mirror could make
it write outside the cache; and it deletes its temporary file on Ctrl-C, so a multi-GB file would start
again from zero. Here names come only from the validated listing (weights.hub_listing: names' grammars),
every change goes through the cache's `Owned`, and nothing is placed before its size and hash match.

One file (`fetch`):
  1. a finished blob of the listed size is only linked (the caller verifies it);
  2. large LFS files (>= RESUMABLE_MIN_BYTES, with a sha256) go to a part kept across runs (staging.py):
     reused when its sidecar names the same content, else started afresh; the rest go to
     blobs/<etag>.<random>.incomplete (huggingface_hub's name, so its lock and clean-ups apply), deleted
     on any failure;
  3. GET {endpoint}/{repo}/resolve/{commit}/{path}, from the bytes on disk (`Range`, `If-Range` with the
     ETag that served them), redirects by hand (hub.py: no token to another host, no https->http);
  4. 206 from exactly those bytes of exactly the listed total, or 200 of exactly the listed size (a
     resumed part then starts over, said); anything else, more bytes than listed, or a compressed body is
     a lie: nothing is placed (exit 65);
  5. flushed as it arrives, fsync'd every FSYNC_EVERY bytes and on the way out; a dropped connection is
     retried from the bytes on disk (RETRIES times without progress);
  6. hashed whole (sha256, or the git blob id) against the listing; a match is renamed into blobs/<etag>
     and linked from snapshots/<commit>/<path> (a relative link that must stay inside blobs/),
     huggingface_hub's layout. A mismatch deletes the download.
"""

from __future__ import annotations

import fcntl
import os
import posixpath
import secrets
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from metralectl import paths
from metralectl.core.progress import human_bytes
from metralectl.ownedfs import Owned
from metralectl.safetext import clean
from metralectl.seams.hf import cache as hfcache, hub as hfhub, staging as hfstaging
from metralectl.seams.hf.hub import WeightsError
from metralectl.seams.hf.listing import RepoFile
from metralectl.seams.hf.staging import Account, Cancelled, Partial, stream_problem

if TYPE_CHECKING:
    import httpx  # imported where it is used: `list` reaches this module and must not load httpx


RESUMABLE_MIN_BYTES = 16 << 20
FSYNC_EVERY = 64 << 20
RETRIES = 5  # attempts in a row that bring no new byte
Note = Callable[[str], None]


def resumable(spec: RepoFile) -> bool:
    return spec.sha256 is not None and spec.size >= RESUMABLE_MIN_BYTES


@dataclass
class Job:
    """One pull's downloads: where (the cache, the repository folder), what (repo at commit), how."""

    repo: str
    commit: str
    base: Path
    cache: Owned
    headers: dict[str, str]
    account: Account
    note: Note


@dataclass
class Target:
    """Where one file's bytes go while downloading."""

    rel: Path
    validator: str | None = None
    partial: Partial | None = None  # a resumable part (else a `.incomplete` blob, deleted on failure)
    restarted: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Problem:
    why: str
    data: bool  # the server contradicted its listing (exit 65), rather than a checksum that differs


class Mismatch(Exception):
    """The server's answer contradicts the listing (size, range, encoding): nothing of it is placed."""

    def __init__(self, why: str, served: int | None = None) -> None:
        super().__init__(why)
        self.why, self.served = why, served


def kept(base: Path, spec: RepoFile) -> int:
    """Bytes of `spec` already on disk in a reusable part (0 when none)."""
    assert spec.sha256 is not None
    found = hfstaging.read_partial(hfstaging.partial_folder(base) / f"{spec.sha256}.part")
    if found is None or (found.sha256, found.size) != (spec.sha256, spec.size):
        return 0
    return min(found.have, spec.size)


def drop_superseded(repo: str, base: Path, wanted: list[RepoFile], note: Note) -> None:
    """Parts of a wanted path downloaded for another version of it (the file changed on the Hub): deleted."""
    by_path = {f.path: f for f in wanted if f.sha256}
    contents = {f.sha256 for f in wanted}
    for old in hfstaging.partials_listed(base):
        new = by_path.get(old.path)
        if old.repo == repo and new is not None and old.sha256 not in contents:
            hfstaging.discard_partial(old)
            note(f"discarded {human_bytes(old.have)} of {old.path} downloaded earlier: the file changed on the "
                 f"Hub (sha256 {old.sha256[:12]}… then, {str(new.sha256)[:12]}… now); downloading it afresh")


def fetch(job: Job, spec: RepoFile) -> tuple[bool, Problem | None]:
    """Download, verify and place one file: (placed and verified here, the problem that kept it out). A large
    file's failures raise (its part is kept or deleted as the docstring says); a small file's problem is
    returned, so the others go on. (False, None): the blob was already there, only linked."""
    assert spec.etag is not None
    with _content_lock(spec.etag):
        if hfcache.blob_ok(job.cache, job.base, spec):
            link_snapshot(job.cache, job.base, job.commit, spec, job.note)
            return False, None
        if resumable(spec):
            return _fetch_part(job, spec), None
        return _fetch_small(job, spec)


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _content_lock(etag: str) -> threading.Lock:
    """One worker per content: two paths of the same file share its download and its blob."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(etag, threading.Lock())


def _fetch_part(job: Job, spec: RepoFile) -> bool:
    found = _open_part(job, spec)
    job.account.begin(spec, already=found.have)
    if found.have:
        job.note(f"resuming {spec.path} at {human_bytes(found.have)} of {human_bytes(spec.size)}")
    target = Target(found.part, found.validator, found)
    try:
        _fill(job, spec, target)
    except Mismatch as exc:
        hfstaging.discard_partial(found)
        raise hfhub.fail_data(f"{spec.path}: {exc.why}; the partial download was deleted and nothing was placed "
                                "in the cache") from None
    problem = _check(job, spec, target)
    if problem is not None:
        hfstaging.discard_partial(found)
        raise WeightsError(
            f"{spec.path}: the downloaded file's {' is '.join(problem.why.split(' ', 1))}; the partial download was "
            "deleted and nothing was placed in the cache",
            "pull again to fetch it afresh; if it repeats, the disk, a proxy or the CDN is corrupting data")
    _place(job, spec, target)
    job.cache.remove_file(found.meta)
    job.cache.remove_dir(hfstaging.partial_folder(job.base))  # the last partial of the repository: no empty folder left
    return True


def _fetch_small(job: Job, spec: RepoFile) -> tuple[bool, Problem | None]:
    """A file downloaded whole into its own `.incomplete` blob, under huggingface_hub's per-blob lock."""
    assert spec.etag is not None
    rel = job.base / "blobs" / f"{spec.etag}.{secrets.token_hex(8)}.incomplete"
    lock = _blob_lock(job, spec.etag)
    placed = False
    try:
        os.close(job.cache.open_write(rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, create_parents=True))
        job.account.begin(spec)
        target = Target(rel)
        try:
            _fill(job, spec, target)
        except Mismatch as exc:
            return False, Problem(exc.why if exc.served is None else f"size {exc.served} bytes, the Hub lists "
                                  f"{spec.size} (the server's answer)", True)
        problem = _check(job, spec, target)
        if problem is not None:
            return False, problem
        _place(job, spec, target)
        placed = True
        return True, None
    finally:
        if not placed:
            job.cache.remove_file(rel)
        os.close(lock)


def _blob_lock(job: Job, etag: str) -> int:
    """huggingface_hub's lock for one blob (.locks/models--ORG--NAME/<etag>.lock), held while it downloads, so
    neither its clean-up nor `prune` takes the `.incomplete` file from under it; waits while another holds it."""
    fd = job.cache.open_write(job.cache.root / ".locks" / job.base.name / f"{etag}.lock",
                              os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666, create_parents=True)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if job.account.cancel.wait(0.1):
                os.close(fd)
                raise Cancelled() from None


def _open_part(job: Job, spec: RepoFile) -> Partial:
    """The part to continue (same content: sha256 and size), or a fresh empty one with its sidecar. Whatever
    else holds the part's names (a link, a stale part) is removed as an entry: a link's target is left alone."""
    assert spec.sha256 is not None
    folder = hfstaging.partial_folder(job.base)
    job.cache.make_dirs(folder, mode=0o700)
    part = folder / f"{spec.sha256}.part"
    found = hfstaging.read_partial(part)
    if found is not None and (found.sha256, found.size) == (spec.sha256, spec.size) and found.have <= spec.size:
        return found
    for entry in (part, part.with_suffix(".json")):
        st = hfcache.lstat(job.cache, entry)
        if st is not None and stat.S_ISLNK(st.st_mode):
            job.note(f"removed {paths.display(entry)}: a symbolic link where a partial download belongs (not "
                     "followed; what it points to was left alone)")
        job.cache.remove_file(entry)
    os.close(job.cache.open_write(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    fresh = Partial(part, part.with_suffix(".json"), job.repo, spec.path, spec.sha256, spec.size, 0)
    hfstaging.write_partial_meta(fresh, job.commit)
    return fresh


def _size(job: Job, target: Target) -> int:
    st = job.cache.lstat(target.rel)
    if st is None or not stat.S_ISREG(st.st_mode):
        raise WeightsError(f"{paths.display(target.rel)} vanished or was replaced while downloading",
                           "is another program writing the cache? pull again")
    return st.st_size


def _fill(job: Job, spec: RepoFile, target: Target) -> None:
    """GET the rest until the target holds spec.size bytes; RETRIES attempts in a row without a new byte fail."""
    import httpx

    idle = 0
    last: BaseException | None = None
    with hfhub.client() as http:
        while (have := _size(job, target)) < spec.size:
            if idle >= RETRIES:
                if last is not None:
                    raise last
                raise WeightsError(f"{spec.path}: {RETRIES} attempts in a row brought no new byte "
                                   f"({human_bytes(have)} of {human_bytes(spec.size)} kept)",
                                   "pull again later; if it repeats, a proxy or the CDN is failing this file")
            try:
                _transfer(http, job, spec, target, have)
                last = None
            except httpx.TransportError as exc:  # a dropped or stalled connection: go on from the bytes on disk
                last = exc
            idle = 0 if _size(job, target) > have else idle + 1


def _transfer(http: httpx.Client, job: Job, spec: RepoFile, target: Target, have: int) -> None:
    """One GET from `have`, appended to the target; Mismatch when the answer is not those bytes."""
    sent = dict(job.headers)
    if have:
        sent["Range"] = f"bytes={have}-"
        if target.validator and not target.validator.startswith("W/"):
            sent["If-Range"] = target.validator
    url = hfhub.file_url(job.repo, job.commit, spec.path)
    response = hfhub.open_get(http, url, sent, head_first=not resumable(spec))
    try:
        if response.status_code == 206:
            have = _ranged(response, spec, have)
        elif response.status_code == 200:
            length = response.headers.get("Content-Length")
            if length is not None and (not length.isascii() or not length.isdigit() or int(length) != spec.size):
                raise Mismatch(f"the server's object is {clean(length, 30)} bytes, the Hub lists {spec.size}",
                               int(length) if length.isascii() and length.isdigit() else None)
            if have:
                job.note(f"{spec.path}: the server sent the whole file instead of the rest (it ignores ranges, or the "
                         f"file changed): starting over, {human_bytes(have)} discarded")
                os.close(job.cache.open_write(target.rel, os.O_WRONLY | os.O_TRUNC))
                job.account.restart(spec.path)
                have = 0
        else:
            raise hfhub.http_error(response, spec.path)
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise Mismatch(f"the server compressed the file (Content-Encoding {clean(encoding, 40)!r}) though asked "
                           "not to")
        etag = hfstaging.header_safe(response.headers.get("ETag"))
        if etag != target.validator:
            target.validator = etag
            if target.partial is not None:
                p = target.partial
                hfstaging.write_partial_meta(Partial(p.part, p.meta, p.repo, p.path, p.sha256, p.size, have, etag), job.commit)
        _append(job, spec, target, have, response)
    finally:
        response.close()


def _ranged(response: httpx.Response, spec: RepoFile, have: int) -> int:
    raw = response.headers.get("Content-Range", "")
    found = hfhub.content_range(raw)
    if found is not None and found[2] != spec.size:
        raise Mismatch(f"the server's object is {found[2]} bytes, the Hub lists {spec.size}", found[2])
    if found is None or found[0] != have or found[1] != spec.size - 1:
        raise Mismatch(f"asked for bytes {have}- of {spec.size}, the server answered Content-Range "
                       f"{clean(raw, 60)!r}: not those bytes")
    return have


def _append(job: Job, spec: RepoFile, target: Target, have: int, response: httpx.Response) -> None:
    """The body, appended as it arrives (a Ctrl-C keeps all but the bytes in flight), never past spec.size."""
    fd = job.cache.open_write(target.rel, os.O_WRONLY)
    with os.fdopen(fd, "wb") as fh:
        fh.seek(have)
        written = unsynced = 0
        try:
            for chunk in response.iter_raw():
                if have + written + len(chunk) > spec.size:
                    raise Mismatch(f"the server sent more than the {spec.size} bytes the Hub lists")
                fh.write(chunk)
                fh.flush()  # in the kernel now: a Ctrl-C or kill loses nothing written
                written += len(chunk)
                unsynced += len(chunk)
                if unsynced >= FSYNC_EVERY:
                    os.fsync(fh.fileno())
                    unsynced = 0
                job.account.add(len(chunk), spec)  # raises Cancelled after Ctrl-C
        finally:
            fh.flush()
            os.fsync(fh.fileno())


def _check(job: Job, spec: RepoFile, target: Target) -> Problem | None:
    with os.fdopen(job.cache.open_read(target.rel), "rb") as fh:
        why = stream_problem(fh, spec, cancel=job.account.cancel)
    return Problem(why, False) if why is not None else None


def _place(job: Job, spec: RepoFile, target: Target) -> None:
    """Rename the verified download into blobs/<etag> (atomic, same folder tree) and link the snapshot to it."""
    assert spec.etag is not None
    job.cache.chmod(target.rel, 0o666 & ~_umask())  # as huggingface_hub leaves its blobs
    job.cache.move(target.rel, job.base / "blobs" / spec.etag)
    link_snapshot(job.cache, job.base, job.commit, spec, job.note)


def link_snapshot(cache: Owned, base: Path, commit: str, spec: RepoFile, note: Note) -> None:
    """snapshots/<commit>/PATH -> ../../blobs/<etag>, relative, replacing the entry in one step (a link that was
    there is replaced as a link: what it pointed to is never touched). The link may only lead into blobs/."""
    assert spec.etag is not None
    pointer = f"snapshots/{commit}/{spec.path}"
    target = posixpath.relpath(f"blobs/{spec.etag}", posixpath.dirname(pointer))
    st = hfcache.lstat(cache, base / pointer)
    if st is not None and stat.S_ISLNK(st.st_mode) and not _inside_blobs(cache, base, base / pointer):
        note(f"{pointer} pointed outside the repository's blobs: not followed; it now links to the verified "
             "file, and what it pointed to was left alone")
    cache.link(base / pointer, target, within=base / "blobs")


def _inside_blobs(cache: Owned, base: Path, pointer: Path) -> bool:
    target = cache.link_target(pointer)
    blobs = cache.parts(base / "blobs")
    return target is not None and target[: len(blobs)] == blobs


def _umask() -> int:
    """The process umask without changing it (os.umask would race other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def kept_message(base: Path, todo: list[RepoFile], again: str) -> list[str]:
    """After Ctrl-C: what is kept of each resumable file, and how to go on."""
    cache = hfcache.owned_of(base)
    out = []
    for spec in todo:
        if not resumable(spec):
            continue
        have = kept(base, spec)
        there = hfcache.lstat(cache, hfstaging.partial_folder(base) / f"{spec.sha256}.part") is not None
        if 0 < have < spec.size or (have == spec.size and there):
            out.append(f"kept {human_bytes(have)} of {human_bytes(spec.size)} of {spec.path}; {again} resumes it")
    return out


def _content_range(value: str) -> tuple[int, int]:
    """`bytes START-END/TOTAL` -> (START, TOTAL); (-1, -1) when it is not exactly that."""
    found = hfhub.content_range(value)
    return (found[0], found[2]) if found is not None else (-1, -1)
