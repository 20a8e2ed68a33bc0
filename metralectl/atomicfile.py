"""The one atomic file write: a reader sees the old file or the whole new one, never a torn one.

Foundation (anyone may import it): the catalog cache in core/ writes with it as well as the state in
seams/store.py, the HF cache manifests and the peers' files. It imports nothing beyond `os` and `stat`
because `list` may reach it on a cache miss.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def write_atomic(path: Path, data: bytes | str, *, mode: int | None = None) -> None:
    """Replace `path` with `data` (str is written as UTF-8), atomically and durably.

    A temp file in the same directory is written, flushed and fsynced, renamed over `path`, and the
    directory is fsynced (so the rename itself survives a power cut). On any failure, Ctrl-C
    included, the temp file is removed and `path` is left as it was.

    mode: the new file's permission bits, exactly (the temp file is 0600 until then, so a private
    file is never readable by others, not even for a moment). None keeps an existing file's mode,
    or for a new file gives what open() would (0666 less the umask).
    """
    path = Path(path)
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    if mode is None:
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except FileNotFoundError:
            pass  # a new file: the umask decides, as for open()
    payload = data.encode() if isinstance(data, str) else bytes(data)
    tmp = directory / f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    created = False
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o666 if mode is None else 0o600)
        created = True
        try:
            if mode is not None:
                os.fchmod(fd, mode)  # exact: the umask must not narrow (nor can it widen) what was asked
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        created = False  # the temp name is gone: it is `path` now
    finally:
        if created:
            try:
                tmp.unlink()
            except OSError:
                pass  # removing our own temp file failed too; the original error is the one to report
    fsync_dir(directory)


def fsync_dir(directory: Path) -> None:
    """Make a rename or link in `directory` durable (a file's fsync does not cover its directory entry)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise  # some filesystems cannot fsync a directory at all; that is not a failed write
    finally:
        os.close(fd)


def place(source: Path, path: Path) -> None:
    """Move a finished file (written and fsynced by its owner, in the same filesystem) to `path`, atomically and
    durably: a reader sees no file or the whole one. For files too large to rewrite (a downloaded blob)."""
    os.replace(source, path)
    fsync_dir(Path(path).parent)


def symlink_atomic(path: Path, target: str) -> None:
    """Make `path` a symlink to `target`, replacing what is there in one step (a reader never sees no link)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.link")
    os.symlink(target, tmp)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
