"""A launch's log writer: moves the engine's output from its pipe into the launch's log, rotating it losslessly.

Why the engine writes into a pipe and this process writes the file, rather than the engine writing the file itself
(as it first did): a file the engine holds open can only be bounded by copying it aside and truncating it
(logrotate's copytruncate), and what the engine writes between the copy and the truncation is lost. That was seen
under load, lines gone from the middle of a log, and an operator reading why an engine died must never miss a line.
Holding the file ourselves, rotation is a rename and a new file between two of our writes: nothing is lost.
(fallocate's FALLOC_FL_COLLAPSE_RANGE would cut a file's head in place, but only on ext4 and XFS and in whole
blocks: tmpfs, btrfs, NFS and ZFS, all common homes for METRALE_HOME, refuse it.) Docker does the same: a
container's stdout is a pipe that its shim reads, and its json-file log rotates by rename.

The bytes go from the pipe to the file with splice(2), in the kernel: a writer killed at any moment has moved a
chunk entirely or not at all (read() and write() would lose what was read and not yet written). Every rotated
piece holds exactly the bound (a line may thus be cut in two at a piece's end; the readers in logs.py join it).

The price of a pipe is that the log needs a reader, so the reader must not be easy to lose:
  - it is a process of its own, forked by the launch's supervisor (supervise.py): a killed supervisor leaves the
    log going and the engine running;
  - the supervisor also holds the pipe's read end, never reading it: while it lives, a killed writer costs nothing
    (the engine's writes wait in the pipe, 1 MiB where the system allows) and the supervisor starts another, which
    carries on where the last one stopped;
  - only with both gone do the engine's writes fail (EPIPE); the engine was started with SIGPIPE ignored (SIG_IGN
    survives exec), so it keeps running rather than being killed over a log, and `logs` then says the log stopped
    and why (state.log_note).
The writer ends when every writer of the pipe has closed it: the engine and whatever it started are gone.
"""

from __future__ import annotations

import errno
import os

from metralectl.ownedfs import Owned, OutsideOwned
from metralectl.seams.process import logs

_CHUNK = 1 << 16


class _Log:
    """The launch's current file and the number of rotations so far (from the pieces on disk, so a writer that
    replaces a killed one carries on the count and the current file's size)."""

    def __init__(self, rel: str, limit: int, store: Owned) -> None:
        self.rel, self.limit, self.store = rel, max(1, limit), store
        numbers = logs.pieces(store, rel)
        self.rotations = numbers[-1] if numbers else 0
        self.bound = self.limit  # the size the current file is rotated at
        self.fd: int | None = None
        self.spliced = True  # splice(2) until the filesystem refuses it
        self.lost, self.why = 0, ""

    def _current(self) -> tuple[int | None, int]:
        """The current file (opened, created if missing) and its size; (None, 0) when it cannot be opened."""
        if self.fd is None:
            try:
                self.fd = self.store.open_write(self.rel, os.O_RDWR | os.O_CREAT, 0o600)
            except (OSError, OutsideOwned) as exc:  # the directory gone, or a link planted in it
                self.why = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
                return None, 0
        return self.fd, os.fstat(self.fd).st_size  # the supervisor's own notes are appended to it too

    def move(self, pipe: int) -> bool:
        """Move the next chunk from the pipe to the log (it waits for one); False once no one writes to the pipe."""
        fd, size = self._current()
        if fd is not None and size >= self.bound:
            self.rotate(size)
            fd, size = self._current()
        want = max(1, min(_CHUNK, self.bound - size))
        if fd is not None and self.lost:
            size = self._owe(fd, size)
        if fd is not None and self.spliced:
            try:
                return os.splice(pipe, fd, want, offset_dst=size) > 0
            except OSError as exc:
                if exc.errno in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    self.spliced = False  # a filesystem without splice: read and write
                else:
                    return self._drop(pipe, want, exc)
        data = os.read(pipe, want)
        if not data:
            return False
        view = memoryview(data)
        try:
            if fd is None:
                raise OSError(errno.ENOENT, self.why or "the log file could not be opened")
            while view:
                written = os.pwrite(fd, view, size)
                view, size = view[written:], size + written
        except OSError as exc:
            self.lost += len(view)
            self.why = exc.strerror or str(exc)
        return True

    def _drop(self, pipe: int, want: int, exc: OSError) -> bool:
        """A chunk that cannot be written (a full disk, a removed directory) is read and counted, so that the engine
        never waits on its log; said in the log once a write succeeds again."""
        data = os.read(pipe, want)
        self.lost += len(data)
        self.why = exc.strerror or str(exc)
        return bool(data)

    def _owe(self, fd: int, size: int) -> int:
        if self._say(fd, size, f"{self.lost} bytes of the engine's output could not be written ({self.why})"):
            self.lost = 0
        return os.fstat(fd).st_size

    @staticmethod
    def _say(fd: int, size: int, text: str) -> bool:
        """A line of ours at the end of the file, on a line of its own (after a line the engine has not finished)."""
        try:
            cut = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
            os.pwrite(fd, f"{chr(10) if cut else ''}metralectl: {text}\n".encode(), size)
            return True
        except OSError:
            return False

    def say(self, text: str) -> None:
        fd, size = self._current()
        if fd is not None:
            self._say(fd, size, text)

    def rotate(self, size: int) -> None:
        """The current file becomes piece N (a rename: nothing in flight is lost), a new one is started, and the
        piece before N goes."""
        number = self.rotations + 1
        try:
            self.store.move(self.rel, logs.piece(self.rel, number))
        except (OSError, OutsideOwned):
            self.bound = size + self.limit  # the directory went away: keep writing where we are, try again later
            return
        self.rotations, self.bound = number, self.limit
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if number > 1:
            try:
                self.store.remove_file(logs.piece(self.rel, number - 1))
            except (OSError, OutsideOwned):
                pass

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def run(pipe: int, rel: str, limit: int, store: Owned, first: str | None = None) -> None:
    """Move the pipe into the launch's log until every writer has closed it; `first`: a line of ours, said before."""
    log = _Log(rel, limit, store)
    try:
        if first is not None:
            log.say(first)
        while log.move(pipe):
            pass
    finally:
        log.close()
