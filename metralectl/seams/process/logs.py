"""An engine's output as a host process: one file per launch, under <METRALE_HOME>/logs/processes/<name>/.

The engine writes its stdout and stderr straight into `<launch>.log` (O_APPEND), so it keeps logging whatever
becomes of its supervisor. The supervisor bounds the file: past `limit` bytes it copies it to `<launch>.log.1`
(replacing the older piece) and truncates it (logrotate's copytruncate: the lines written between the copy and
the truncation, a moment's worth, are lost). A launch's log is kept after it exits or fails, as a kept
container's is; a name keeps its last KEEP_LAUNCHES launches' logs, older ones go when a new one starts.

Reading: `tail` (the last lines, across the rotated piece) and `follow` (lines as they are written, until the
engine's group is gone or the caller stops), as Docker's logs calls give them. The files are read as regular
files inside the directory we own (ownedfs: no symlink followed).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator

from metralectl import paths
from metralectl.ownedfs import Owned, OutsideOwned

LOG_LIMIT = 64 << 20  # bytes per file before it is rotated (so at most about twice this per launch)
KEEP_LAUNCHES = 5  # launches' logs kept per name
_CHUNK = 1 << 16


def logs_dir() -> Owned:
    return Owned(paths.metrale_home() / "logs" / "processes", "the host-process runtime's logs")


def launch_log(name: str, launch: str) -> str:
    return f"{name}/{launch}.log"


def prepare(name: str, launch: str, keep: int = KEEP_LAUNCHES, store: Owned | None = None) -> str:
    """Create the new launch's (empty) log file, and drop the oldest launches' beyond `keep`; its path under
    the logs directory."""
    owned = store or logs_dir()
    owned.make_root(0o700)
    owned.make_dirs(name, 0o700)
    rel = launch_log(name, launch)
    os.close(owned.open_write(rel, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    launches = sorted({entry.split(".log", 1)[0] for entry in owned.listdir(name) if ".log" in entry})
    for old in launches[:max(0, len(launches) - max(1, keep))]:
        for suffix in (".log", ".log.1"):
            owned.remove_file(f"{name}/{old}{suffix}")
    return rel


def open_for_engine(rel: str, store: Owned | None = None) -> int:
    """The descriptor the engine's stdout and stderr write to."""
    return (store or logs_dir()).open_write(rel, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def rotate_if_large(rel: str, limit: int, store: Owned | None = None) -> bool:
    """Copy the file to `<rel>.1` and truncate it once it holds more than `limit` bytes; whether it did."""
    owned = store or logs_dir()
    st = owned.lstat(rel)
    if st is None or st.st_size <= limit:
        return False
    tmp = f"{rel}.1.{os.getpid()}.tmp"
    source = owned.open_read(rel)
    try:
        target = owned.open_write(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            while chunk := os.read(source, _CHUNK * 16):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(target, view):]
        finally:
            os.close(target)
    finally:
        os.close(source)
    owned.move(tmp, f"{rel}.1")
    fd = owned.open_write(rel, os.O_WRONLY)
    try:
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)
    return True


def _open(owned: Owned, rel: str) -> int | None:
    try:
        return owned.open_read(rel)
    except (FileNotFoundError, NotADirectoryError, OutsideOwned):
        return None


def _last_lines(owned: Owned, rel: str, count: int, end: int | None = None) -> list[str]:
    """The last `count` lines of a file (of its first `end` bytes), read backwards in chunks."""
    fd = _open(owned, rel)
    if fd is None or count <= 0:
        if fd is not None:
            os.close(fd)
        return []
    try:
        size = os.fstat(fd).st_size if end is None else end
        data, at = b"", size
        while at > 0 and data.count(b"\n") <= count:
            step = min(_CHUNK, at)
            at -= step
            data = os.pread(fd, step, at) + data
    finally:
        os.close(fd)
    lines = _decode(data).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if at > 0:
        lines = lines[1:]  # the first one is cut
    return lines[-count:]


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "replace").replace("\r\n", "\n")


def tail(rel: str, count: int, store: Owned | None = None, end: int | None = None) -> list[str]:
    """The last `count` lines of a launch's log (of its first `end` bytes), the rotated piece included when the
    file holds fewer."""
    owned = store or logs_dir()
    lines = _last_lines(owned, rel, count, end)
    if len(lines) < count:
        lines = _last_lines(owned, rel + ".1", count - len(lines)) + lines
    return lines


def _read_from(owned: Owned, rel: str, at: int) -> bytes:
    fd = _open(owned, rel)
    if fd is None:
        return b""
    try:
        out = []
        while chunk := os.pread(fd, _CHUNK * 16, at):
            out.append(chunk)
            at += len(chunk)
        return b"".join(out)
    finally:
        os.close(fd)


def follow(rel: str, *, tail_lines: int | str, alive: Callable[[], bool], stop: threading.Event | None = None,
           since: int | None = None, store: Owned | None = None, poll_s: float = 0.1) -> Iterator[str]:
    """Lines as they are written; ends once `alive()` says the engine is gone (after its last line) or `stop` is set.

    tail_lines "all" starts at the launch's first line kept (the rotated piece first), a number at that many
    last lines. `since` (epoch seconds, as for Docker): lines carry no time here, so a `since` after the file's
    last change starts at its end, and an earlier one at the tail asked for."""
    owned = store or logs_dir()
    st = owned.lstat(rel)
    pos = st.st_size if st is not None else 0
    if since is not None and st is not None and since > st.st_mtime:
        pass  # nothing written since then
    elif tail_lines == "all":
        yield from _lines(_read_from(owned, rel + ".1", 0))
        head = _read_from(owned, rel, 0)[:pos]
        yield from _lines(head[:head.rfind(b"\n") + 1])
        pos = head.rfind(b"\n") + 1
    else:
        pos = _line_end(owned, rel, pos)
        yield from tail(rel, int(tail_lines), owned, pos)
    buffer = b""
    ticker = stop or threading.Event()
    while True:
        size = owned.lstat(rel)
        if size is not None and size.st_size < pos:  # rotated: the rest of what we read is in the piece
            buffer += _read_from(owned, rel + ".1", pos)
            pos = 0
        fresh = _read_from(owned, rel, pos)
        pos += len(fresh)
        buffer += fresh
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            yield _decode(line).rstrip("\r")
        if stop is not None and stop.is_set():
            return
        if not fresh and not alive():
            last = _read_from(owned, rel, pos)  # written just before it exited
            buffer += last
            for line in buffer.split(b"\n"):
                if line:
                    yield _decode(line).rstrip("\r")
            return
        if not fresh:
            ticker.wait(poll_s)


def _line_end(owned: Owned, rel: str, pos: int) -> int:
    """Where the last complete line before `pos` ends (a line being written is followed, not tailed)."""
    start = max(0, pos - _CHUNK)
    data = _read_from(owned, rel, start)[:pos - start]
    cut = data.rfind(b"\n")
    return start + cut + 1 if cut >= 0 else (pos if start else 0)


def _lines(data: bytes) -> Iterator[str]:
    if data:
        yield from _decode(data[:-1] if data.endswith(b"\n") else data).split("\n")
