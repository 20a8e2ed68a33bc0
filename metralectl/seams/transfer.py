"""The mechanics under weights.pull, free of huggingface_hub: worker threads that Ctrl-C can stop,
byte accounting through huggingface_hub's progress-bar protocol, and hashing files against a listing.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

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
    """Bytes per file, fed by huggingface_hub's progress bars (its `tqdm_class` hook) from worker threads."""

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
            raise Cancelled()  # unwinds huggingface_hub's download; it deletes its temporary file
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

    def bar_class(self) -> type:
        account = self

        class _Bar:
            """Just enough of tqdm for huggingface_hub's http_get and xet_get."""

            def __init__(self, *args: Any, total: int | None = None, initial: int = 0, **kwargs: Any) -> None:
                # Made in the worker thread; remember its file, since xet reports from its own threads.
                self.spec = account.current()
                self.n, self.total = initial, total
                if initial:
                    account.add(initial, self.spec)  # an older huggingface_hub resuming a `.incomplete`

            def update(self, n: float | None = 1) -> None:
                self.n += int(n or 0)
                account.add(int(n or 0), self.spec)

            def update_transfer(self, n: float | None = 1) -> None:
                """xet: network bytes; we count bytes written, via update()."""

            def __enter__(self) -> _Bar:
                return self

            def __exit__(self, *exc: Any) -> None:
                return None

            def close(self) -> None: ...
            def refresh(self, *a: Any, **k: Any) -> None: ...
            def clear(self, *a: Any, **k: Any) -> None: ...
            def set_postfix_str(self, *a: Any, **k: Any) -> None: ...
            def set_transfer_postfix_str(self, *a: Any, **k: Any) -> None: ...
            def set_description(self, *a: Any, **k: Any) -> None: ...
            def set_description_str(self, *a: Any, **k: Any) -> None: ...

        return _Bar


def file_problem(path: Path, spec: RepoFile, meter: Meter | None = None,
                 cancel: threading.Event | None = None) -> str | None:
    """Why `path` is not the listed file (missing, size, checksum), or None when it is."""
    try:
        size = path.stat().st_size
    except OSError:
        return "missing"
    if size != spec.size:
        return f"size {size} bytes, the Hub lists {spec.size}"
    if spec.sha256:
        digest, expected, kind = hashlib.sha256(), spec.sha256, "sha256"
    elif spec.git_oid:
        digest, expected, kind = hashlib.sha1(b"blob %d\0" % size), spec.git_oid, "git blob id"
    else:
        return None  # the Hub gave no checksum: size is all we can check
    with open(path, "rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            digest.update(chunk)
            if meter is not None:
                meter.add(len(chunk))
    actual = digest.hexdigest()
    return None if actual == expected else f"{kind} {actual[:16]}…, the Hub lists {expected[:16]}…"


def verify_files(snapshot: Path, files: Sequence[RepoFile], meter: Meter, workers: int, tick: Callable[[], None],
                 done_files: list[int]) -> list[tuple[RepoFile, str]]:
    """Check every file against its listing entry, in parallel; the problems found."""
    cancel = threading.Event()
    problems: list[tuple[RepoFile, str]] = []
    lock = threading.Lock()

    def check(spec: RepoFile) -> None:
        why = file_problem(snapshot / spec.path, spec, meter, cancel)
        with lock:
            done_files[0] += 1
            if why is not None:
                problems.append((spec, why))

    failures = parallel(list(files), check, workers, tick, cancel)
    if failures:
        raise failures[0][1]
    return sorted(problems, key=lambda p: p[0].path)
