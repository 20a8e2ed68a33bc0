"""The mechanics under a download, free of huggingface_hub: worker threads that Ctrl-C can stop, byte accounting
per file, hashing files against a listing; and the part files `metralectl pull` keeps across runs.

Every file is read through the cache's `Owned` (ownedfs): a snapshot entry is followed to its blob only
while each link stays inside the cache, and only a regular file is read — an entry pointing at /dev/zero,
a FIFO or a file outside the cache is never opened (it would hang the verification or leak what it holds).

A large LFS file is downloaded (by download.py) into its repository folder, beside huggingface_hub's own:
  <hub>/models--ORG--NAME/.metralectl-partial/<sha256>.part   the bytes so far, appended in order
  <hub>/models--ORG--NAME/.metralectl-partial/<sha256>.json   which file it is: repo, path, size, sha256,
                                                                commit, and the server's validator (ETag)
Inside the repository folder, so the finished file is renamed (atomically, same filesystem) into blobs/,
`rm` of a safetensors checkpoint takes its partials with the folder, and huggingface_hub's cache scan
stays quiet (it warns about an unknown folder at the top of the hub, not about one inside a repository's).
The folder is 0700 and the files 0600 until the verified file is placed. A part, a sidecar or the folder
that is a symlink is never opened, written or followed (cache.owned_of); a sidecar is read capped, and its
names (repo, path, sha256, validator) pass their grammars or the sidecar is no partial (an orphan `prune`
may remove).
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from metralectl.core.progress import Meter
from metralectl.errors import MetralError
from metralectl.names import is_valid
from metralectl.ownedfs import OutsideOwned, Owned
from metralectl.seams.hf import cache as hfcache, listing as hflisting
from metralectl.seams.hf.listing import RepoFile


T = TypeVar("T")
TICK_S = 0.1
GRACE_S = 3.0  # after Ctrl-C, how long running transfers get to notice and clean up
HASH_CHUNK = 8 << 20


class Cancelled(Exception):
    """Raised inside a worker (from a progress callback) to abandon its transfer."""


def parallel(items: Sequence[T], fn: Callable[[T], None], workers: int, tick: Callable[[], None],
             cancel: threading.Event) -> list[tuple[T, BaseException]]:
    """Run fn over items on daemon threads; call tick() from this thread every TICK_S.

    The first failure cancels what has not started (and, through `cancel`, what is running);
    failures come back in order, real ones before the cancellations they caused. Daemon threads
    and the cancel flag make Ctrl-C stop a download within a chunk instead of at interpreter exit
    (a ThreadPoolExecutor joins its threads first).
    """
    todo: queue.Queue[T] = queue.Queue()
    for item in items:
        todo.put(item)
    done: queue.Queue[tuple[T, BaseException | None]] = queue.Queue()

    def worker() -> None:
        while not cancel.is_set():
            try:
                item = todo.get_nowait()
            except queue.Empty:
                return
            try:
                fn(item)
                done.put((item, None))
            except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
                done.put((item, exc))
                cancel.set()
                return

    threads = [threading.Thread(target=worker, daemon=True, name=f"metralectl-transfer-{i}")
               for i in range(max(1, min(workers, len(items))))]
    for t in threads:
        t.start()
    failures: list[tuple[T, BaseException]] = []
    try:
        while any(t.is_alive() for t in threads) or not done.empty():
            try:
                item, exc = done.get(timeout=TICK_S)
            except queue.Empty:
                tick()
                continue
            if exc is not None:
                failures.append((item, exc))
    except KeyboardInterrupt:
        cancel.set()
        deadline = time.monotonic() + GRACE_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        raise
    failures.sort(key=lambda f: isinstance(f[1], Cancelled))
    return failures


class Account:
    """Bytes per file, fed by the downloads' worker threads."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self.cancel = threading.Event()
        self._local = threading.local()
        self._bytes: dict[str, int] = {}
        self._lock = threading.Lock()
        self.discarded = 0  # bytes kept from an earlier run, then thrown away (counted as present, never fetched)

    def begin(self, spec: RepoFile, already: int = 0) -> None:
        """`already`: bytes of it kept from an earlier run, which the meter counted as present."""
        self._local.spec = spec
        with self._lock:
            self._bytes[spec.path] = already

    def restart(self, path: str) -> None:
        """The file's bytes so far were thrown away (the server sent it whole again)."""
        with self._lock:
            lost = self._bytes.get(path, 0)
            if path in self._bytes:
                self._bytes[path] = 0
            self.discarded += lost
        self.meter.add(-lost)

    def current(self) -> RepoFile | None:
        """The file this worker thread is downloading."""
        return getattr(self._local, "spec", None)

    def add(self, n: int, spec: RepoFile | None = None) -> None:
        if self.cancel.is_set():
            raise Cancelled()  # unwinds the download; it deletes its temporary file
        spec = spec or self.current()
        if spec is None:
            return
        with self._lock:
            if spec.path not in self._bytes:
                return  # a late report for a file already settled
            self._bytes[spec.path] += n
        self.meter.add(n)

    def fail(self, spec: RepoFile) -> None:
        with self._lock:
            lost = self._bytes.pop(spec.path, 0)
        self.meter.add(-lost)  # its temporary file is gone

    def finish(self, spec: RepoFile) -> None:
        with self._lock:
            counted = self._bytes.pop(spec.path, 0)
        self.meter.add(spec.size - counted)  # exact, whatever the bar saw (gzip, or no bar at all)


def file_problem(path: Path, spec: RepoFile, meter: Meter | None = None,
                 cancel: threading.Event | None = None, cache: Owned | None = None) -> str | None:
    """Why `path` is not the listed file (missing, size, checksum), or None when it is. `cache`: the owned
    directory it lies in (links followed only inside it); without one, its own folder."""
    cache = cache or Owned(path.parent, "the folder of " + path.name)
    try:
        fd = cache.open_read(path, follow_inside=True)
    except (OSError, MetralError) as exc:
        return _unreadable(cache, path, exc)
    with os.fdopen(fd, "rb") as fh:
        return stream_problem(fh, spec, meter, cancel)


def _unreadable(cache: Owned, path: Path, exc: BaseException) -> str:
    """Why open_read refused: missing (a link to a blob that is not there, too), a link out of the cache, or
    not a regular file."""
    rel: Path | str = path
    for _ in range(9):
        try:
            st = cache.lstat(rel)
        except (OSError, MetralError):
            break
        if st is None:
            return "missing"
        if not stat.S_ISLNK(st.st_mode):
            return "not a regular file: not read"
        target = cache.link_target(rel)
        if target is None:
            break
        rel = "/".join(target)
    return "a link that leaves the cache: not read" if not isinstance(exc, OSError) else (exc.strerror or str(exc))


def stream_problem(fh: Any, spec: RepoFile, meter: Meter | None = None,
                   cancel: threading.Event | None = None) -> str | None:
    """file_problem for an open file: its size (fstat) and content against the listing."""
    size = os.fstat(fh.fileno()).st_size
    if size != spec.size:
        return f"size {size} bytes, the Hub lists {spec.size}"
    if spec.sha256:
        digest, expected, kind = hashlib.sha256(), spec.sha256, "sha256"
    elif spec.git_oid:
        digest, expected, kind = hashlib.sha1(b"blob %d\0" % size), spec.git_oid, "git blob id"
    else:
        return None  # no checksum listed: size is all we can check (listings from the Hub always carry one)
    read = 0
    while chunk := fh.read(HASH_CHUNK):
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        digest.update(chunk)
        read += len(chunk)
        if meter is not None:
            meter.add(len(chunk))
    if read != spec.size:
        return f"size {read} bytes read, the Hub lists {spec.size}"  # it changed while being read
    actual = digest.hexdigest()
    return None if actual == expected else f"{kind} {actual[:16]}…, the Hub lists {expected[:16]}…"


def verify_files(snapshot: Path, files: Sequence[RepoFile], meter: Meter, workers: int, tick: Callable[[], None],
                 done_files: list[int], cache: Owned | None = None) -> list[tuple[RepoFile, str]]:
    """Check every file against its listing entry, in parallel; the problems found."""
    cancel = threading.Event()
    problems: list[tuple[RepoFile, str]] = []
    lock = threading.Lock()

    def check(spec: RepoFile) -> None:
        why = file_problem(snapshot / spec.path, spec, meter, cancel, cache)
        with lock:
            done_files[0] += 1
            if why is not None:
                problems.append((spec, why))

    failures = parallel(list(files), check, workers, tick, cancel)
    if failures:
        raise failures[0][1]
    return sorted(problems, key=lambda p: p[0].path)


MAX_VALIDATOR = 256  # an ETag sent back as If-Range: printable ASCII, no more


@dataclass(frozen=True)
class Partial:
    part: Path
    meta: Path
    repo: str
    path: str  # the file's path in the repository
    sha256: str
    size: int  # the whole file, as the Hub lists it
    have: int  # bytes on disk so far
    validator: str | None = None  # the ETag that served the bytes so far (sent as If-Range)

    @property
    def files(self) -> list[Path]:
        return [self.part, self.meta]


def partial_folder(base: Path) -> Path:
    """The partial-download folder of a repository folder (`models--ORG--NAME`)."""
    return base / hfcache.PARTIAL_DIR


def header_safe(value: object) -> str | None:
    """`value` when it can be sent as a header value as it is (printable ASCII, capped), else None."""
    if isinstance(value, str) and 0 < len(value) <= MAX_VALIDATOR and value.isascii() and value.isprintable():
        return value
    return None


def read_partial(part: Path) -> Partial | None:
    """The partial a `.part` file is, from its sidecar; None when either is missing, unreadable, not a regular
    file (a link is not followed), or names something that fails its grammar."""
    base = part.parent.parent
    cache = hfcache.owned_of(base)
    sha = part.name[: -len(".part")] if part.name.endswith(".part") else ""
    if not is_valid("sha256", sha):
        return None
    meta = part.with_suffix(".json")
    data = hfcache.read_json(meta, cache)
    st = hfcache.lstat(cache, part)
    if not isinstance(data, dict) or st is None or not stat.S_ISREG(st.st_mode):
        return None
    try:
        spec = hflisting.repo_file(data["path"], data["size"], data["sha256"], None, "a partial download's sidecar")
        repo = data["repo"]
        if spec.sha256 != sha or not is_valid("repo", repo):
            return None
    except (KeyError, MetralError):
        return None
    return Partial(part, meta, repo, spec.path, sha, spec.size, st.st_size, header_safe(data.get("validator")))


def write_partial_meta(partial: Partial, commit: str) -> None:
    data = {"repo": partial.repo, "path": partial.path, "sha256": partial.sha256, "size": partial.size,
            "commit": commit, "validator": header_safe(partial.validator)}
    cache = hfcache.owned_of(partial.part.parent.parent)
    cache.put(partial.meta, json.dumps(data), mode=0o600)


def partial_entries(base: Path) -> list[tuple[str, bool]]:
    """(name, is a regular file) of everything in the partial folder (empty when missing or a link)."""
    cache = hfcache.owned_of(base)
    out = []
    for name in hfcache.listdir(cache, partial_folder(base)):
        st = hfcache.lstat(cache, partial_folder(base) / name)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            out.append((name, stat.S_ISREG(st.st_mode)))
    return out


def orphan_partials(base: Path) -> list[Path]:
    """Entries of the partial folder that belong to no readable partial (a sidecar without its part, a link
    someone left: removing one removes the entry, never what a link points to)."""
    known = {p for item in partials_listed(base) for p in item.files}
    return sorted(p for p in (partial_folder(base) / name for name, _ in partial_entries(base)) if p not in known)


def partials_listed(base: Path) -> list[Partial]:
    """Every readable partial download of a repository folder."""
    parts = sorted(partial_folder(base) / name for name, regular in partial_entries(base) if regular and name.endswith(".part"))
    return [p for p in (read_partial(part) for part in parts) if p is not None]


def any_partial_in(base: Path) -> bool:
    """Whether a repository folder holds partial downloads (one directory listing: cheap enough for `list`)."""
    return hfcache.parts_waiting(base)


def discard_partial(partial: Partial) -> None:
    cache = hfcache.owned_of(partial.part.parent.parent)
    for path in partial.files:
        try:
            cache.remove_file(path)
        except (OSError, OutsideOwned):
            pass
