"""The mechanics under weights.pull, free of huggingface_hub: worker threads that Ctrl-C can stop,
byte accounting per file, and hashing files against a listing.

Every file is read through the cache's `Owned` (ownedfs): a snapshot entry is followed to its blob only
while each link stays inside the cache, and only a regular file is read — an entry pointing at /dev/zero,
a FIFO or a file outside the cache is never opened (it would hang the verification or leak what it holds).
"""

from __future__ import annotations

import hashlib
import os
import queue
import stat
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from metralectl.errors import MetralError
from metralectl.ownedfs import Owned
from metralectl.seams.hfcache import RepoFile
from metralectl.core.progress import Meter

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
