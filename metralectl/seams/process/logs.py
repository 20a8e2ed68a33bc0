"""An engine's output as a host process: one log per launch, under <METRALE_HOME>/logs/processes/<name>/.

The engine's stdout and stderr are one pipe; the launch's log writer (logwriter.py says why a pipe and a writer of
ours, not the engine writing the file itself) moves it into `<launch>.log`. Once that file holds the launch's bound,
the writer renames it `<launch>.log.<N>` (N counts the rotations: a reader that fell behind can tell which pieces
it missed), starts a new `<launch>.log` and removes the piece before: nothing is lost, and a launch keeps twice its
bound at most. A piece ends at the bound, not at a line's end: the readers here join a line cut in two. A launch's
log is kept after it exits or fails, as a kept container's is; a name keeps its last KEEP_LAUNCHES launches' logs
(by launch id, which sorts as the launches were made), older ones go when a new one starts.

Reading: `tail` (the last lines, across the previous piece) and `follow` (lines as they are written, piece after
piece, until the launch has ended or the caller stops), as Docker's logs calls give them. The files are read as
regular files inside the directory we own (ownedfs: no symlink followed).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator

from metralectl import paths
from metralectl.ownedfs import Owned, OutsideOwned
from metralectl import wording

LOG_LIMIT = 64 << 20  # bytes per file before it is rotated (so at most about twice this per launch)
KEEP_LAUNCHES = 5  # launches' logs kept per name
_CHUNK = 1 << 16
_TRIES = 100  # looks at a log that rotates while it is being opened, before taking the last answer


def logs_dir() -> Owned:
    return Owned(paths.metrale_home() / "logs" / "processes", "the host-process runtime's logs")


def launch_log(name: str, launch: str) -> str:
    return f"{name}/{launch}.log"


def piece(rel: str, number: int) -> str:
    """The file of the `number`-th rotated piece of a launch's log."""
    return f"{rel}.{number}"


def pieces(owned: Owned, rel: str) -> list[int]:
    """The numbers of a launch's rotated pieces on disk, oldest first."""
    folder, _, base = rel.rpartition("/")
    prefix = base + "."
    try:
        entries = owned.listdir(folder)
    except (NotADirectoryError, OutsideOwned):
        return []
    return sorted(int(e[len(prefix):]) for e in entries if e.startswith(prefix) and e[len(prefix):].isdigit())


def prepare(name: str, launch: str, keep: int = KEEP_LAUNCHES, store: Owned | None = None) -> str:
    """Create the new launch's (empty) log file, and drop the logs of the oldest other launches of `name`, so that
    `keep` are left with this one; its path under the logs directory."""
    owned = store or logs_dir()
    owned.make_root(0o700)
    owned.make_dirs(name, 0o700)
    rel = launch_log(name, launch)
    os.close(owned.open_write(rel, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    entries = owned.listdir(name)
    others = sorted({entry.split(".log", 1)[0] for entry in entries if ".log" in entry} - {launch})
    dropped = set(others[:max(0, len(others) - (max(1, keep) - 1))])  # never this launch's own, whatever the clock
    for entry in entries:
        if entry.split(".log", 1)[0] in dropped:
            owned.remove_file(f"{name}/{entry}")
    return rel


def append_fd(rel: str, store: Owned | None = None) -> int:
    """A descriptor that appends to a launch's current log file (created if missing), and reads it."""
    return (store or logs_dir()).open_write(rel, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)


def _open(owned: Owned, rel: str) -> int | None:
    try:
        return owned.open_read(rel)
    except (FileNotFoundError, NotADirectoryError, OutsideOwned):
        return None


def _open_current(owned: Owned, rel: str) -> tuple[int | None, int]:
    """The current file (None when missing) and its piece number: one more than the newest rotated piece, checked
    the same before and after the open (the writer renames the current file before it makes the next one)."""
    top = 0
    for _ in range(_TRIES):
        before = pieces(owned, rel)
        fd = _open(owned, rel)
        after = pieces(owned, rel)
        top = after[-1] if after else 0
        if (before[-1] if before else 0) == top:
            return fd, top + 1
        if fd is not None:
            os.close(fd)
    return _open(owned, rel), top + 1


def _read_from(fd: int, at: int, end: int | None = None) -> bytes:
    out = []
    while end is None or at < end:
        chunk = os.pread(fd, _CHUNK * 16 if end is None else min(_CHUNK * 16, end - at), at)
        if not chunk:
            break
        out.append(chunk)
        at += len(chunk)
    return b"".join(out)


def _last_bytes(fd: int, count: int, end: int | None = None) -> tuple[bytes, bool]:
    """The end of a file (of its first `end` bytes) that holds its last `count` lines, read backwards in chunks, and
    whether that is the whole of it (else its first line is cut)."""
    size = os.fstat(fd).st_size if end is None else end
    data, at = b"", size
    while at > 0 and data.count(b"\n") <= count:
        step = min(_CHUNK, at)
        at -= step
        data = os.pread(fd, step, at) + data
    return data, at == 0


def _split(data: bytes, whole: bool) -> list[str]:
    lines = _decode(data).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines if whole else lines[1:]  # the first one is cut


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "replace").replace("\r\n", "\n")


def _tail_from(owned: Owned, rel: str, fd: int | None, number: int, count: int,
               end: int | None = None) -> tuple[bytes, bool]:
    """The end of the log up to the piece `fd` holds (its first `end` bytes) that holds its last `count` lines, the
    piece before included when this one holds fewer (or begins with the rest of its last line); and whether that is
    all the log keeps."""
    data, whole = _last_bytes(fd, count, end) if fd is not None else (b"", True)
    if not whole or number <= 1 or count <= 0:
        return data, whole
    older = _open(owned, piece(rel, number - 1))
    if older is None:
        return data, True
    try:
        before, whole = _last_bytes(older, max(0, count - data.count(b"\n")))  # with the line this one may end
    finally:
        os.close(older)
    return before + data, whole


def tail(rel: str, count: int, store: Owned | None = None) -> list[str]:
    """The last `count` lines of a launch's log, the previous piece included when the current file holds fewer."""
    owned = store or logs_dir()
    if count <= 0:
        return []
    fd, number = _open_current(owned, rel)
    try:
        return _split(*_tail_from(owned, rel, fd, number, count))[-count:]
    finally:
        if fd is not None:
            os.close(fd)


class _Reader:
    """A launch's log read piece after piece: the piece's descriptor and number, and how far it has been read. A
    descriptor keeps its piece readable after a rename or a removal, so a piece is always read to its end."""

    def __init__(self, owned: Owned, rel: str) -> None:
        self.owned, self.rel = owned, rel
        self.fd: int | None = None
        self.number, self.pos = 0, 0
        self.complete = False  # a rotated piece: nothing more is written to it
        self.after = 0  # while no piece is open: the last one read (the next to read comes after it)
        self.skipped = 0  # pieces rotated away unread since the caller last looked (a reader that fell behind)

    def _take(self, fd: int | None, number: int, complete: bool) -> None:
        self.close()
        self.fd, self.number, self.pos, self.complete = fd, number, 0, complete

    def open_current(self) -> None:
        """Start at the current file (where the log is now: nothing before it counts as missed)."""
        self._take(*_open_current(self.owned, self.rel), complete=False)
        self.after = self.number - 1

    def open_oldest(self) -> None:
        for _ in range(_TRIES):
            numbers = pieces(self.owned, self.rel)
            if not numbers:
                break
            fd = _open(self.owned, piece(self.rel, numbers[0]))
            if fd is not None:
                self._take(fd, numbers[0], complete=True)
                return
        self.open_current()

    def read(self) -> bytes:
        """What the piece holds past what was read; `complete` tells, after, whether that was all it will hold."""
        if self.fd is None:
            self._advance(self.after)  # the current file was missing (a rotation under way, or no log yet)
            if self.fd is None:
                return b""
        assert self.fd is not None
        if not self.complete:  # decided before the read: once renamed, the writer writes to it no more
            now, held = self.owned.lstat(self.rel), os.fstat(self.fd)
            self.complete = now is None or (now.st_ino, now.st_dev) != (held.st_ino, held.st_dev)
        data = _read_from(self.fd, self.pos)
        self.pos += len(data)
        return data

    def next_piece(self) -> None:
        """From a piece read to its end to the one after it."""
        self._advance(self.number)

    def _advance(self, after: int) -> None:
        """To the first piece after piece `after` still there: a rotated one, else the current file (which may be
        missing a moment: then `after` is kept for the next try). Those in between, rotated away unread, are
        counted in `skipped`."""
        for _ in range(_TRIES):
            later = [n for n in pieces(self.owned, self.rel) if n > after]
            if not later:
                break
            fd = _open(self.owned, piece(self.rel, later[0]))
            if fd is not None:
                self._take(fd, later[0], complete=True)
                self.skipped += later[0] - after - 1
                return
        self._take(*_open_current(self.owned, self.rel), complete=False)
        if self.fd is None:
            self.after = after
        else:
            self.skipped += max(0, self.number - after - 1)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def follow(rel: str, *, tail_lines: int | str, alive: Callable[[], bool], stop: threading.Event | None = None,
           since: int | None = None, store: Owned | None = None, poll_s: float = 0.1,
           quiet: Callable[[], str | None] | None = None) -> Iterator[str]:
    """Lines as they are written; ends once `alive()` says the launch has ended (after its last line) or `stop` is set.

    tail_lines "all" starts at the launch's first line kept (the oldest piece first), a number at that many last
    lines. `since` (epoch seconds, as for Docker): lines carry no time here, so a `since` after the file's last
    change starts at its end, and an earlier one at the tail asked for. `quiet()`, asked while nothing comes, may
    give one line to say why (the log has stopped): said once."""
    reader = _Reader(store or logs_dir(), rel)
    try:
        yield from _follow(reader, tail_lines, alive, stop, since, poll_s, quiet)
    finally:
        reader.close()


def _follow(reader: _Reader, tail_lines: int | str, alive: Callable[[], bool], stop: threading.Event | None,
            since: int | None, poll_s: float, quiet: Callable[[], str | None] | None) -> Iterator[str]:
    reader.open_current()
    held = os.fstat(reader.fd) if reader.fd is not None else None
    buffer = b""
    if since is not None and held is not None and since > held.st_mtime:
        reader.pos = held.st_size  # nothing written since then
    elif tail_lines == "all":
        reader.open_oldest()
    else:
        count, end = int(tail_lines), held.st_size if held is not None else 0
        data, whole = _tail_from(reader.owned, reader.rel, reader.fd, reader.number, count, end)
        cut = data.rfind(b"\n") + 1
        data, buffer = data[:cut], data[cut:]  # a line being written is followed, not tailed
        if count > 0:
            yield from _split(data, whole)[-count:]
        reader.pos = end
    ticker = stop or threading.Event()
    ending, said = False, False
    while True:
        if stop is not None and stop.is_set():
            return
        fresh = reader.read()
        if reader.skipped:  # said before the next piece's lines; the line the skipped pieces ended goes alone
            if buffer:
                yield _decode(buffer).rstrip("\r")
                buffer = b""
            gone = wording.count(reader.skipped, "rotated piece")
            yield (f"metralectl: {gone} of this log {'was' if reader.skipped == 1 else 'were'} gone before it "
                   "could be read (this reader fell behind the engine's output)")
            reader.skipped = 0
        buffer += fresh
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            yield _decode(line).rstrip("\r")
        if reader.complete:
            reader.next_piece()
            continue
        if fresh:
            continue
        if ending:  # what was written just before the end is read: done
            if buffer:
                yield _decode(buffer).rstrip("\r")
            return
        if not alive():
            ending = True
            continue
        if quiet is not None and not said:
            note = quiet()
            if note:
                said = True
                yield note
        ticker.wait(poll_s)
