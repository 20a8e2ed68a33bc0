"""A file read with a cap: a regular file only, at most `limit` bytes whatever its st_size says.

A file metralectl is handed (a user recipe, a campaign plan, bench.yaml, a run record given to `verify`) or
keeps (a state file: the swap journal, agent.json, a deployment, a run's record) may have been replaced by
something that will not fit in memory (a sparse file of a terabyte), or by a FIFO, which would block the read
forever, or a device that never ends. Each is FileRefused (exit 65: the data is wrong), naming the file and
the fix, never a MemoryError (exit 70) or a hang. Opened with O_NONBLOCK so a FIFO is seen without waiting
for a writer; a symlink is followed (the user's own dotfiles may be links). docs/security.md lists the caps.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from metralectl.errors import ExitCode, MetralError
from metralectl.safetext import clean

DOCUMENT_LIMIT = 8 << 20  # a YAML or JSON document a user writes or metralectl keeps (recipes, plans, state)
RECORD_LIMIT = 256 << 20  # a run's record: its JSONL of requests, run.json, the timings


class FileRefused(MetralError):
    """A file that is not a regular file, or larger than its cap: not read."""

    exit_code = ExitCode.DATA


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"


def read_bytes(path: Path | str, limit: int, what: str = "file") -> bytes:
    """The file's bytes; FileRefused when it is not a regular file or holds more than `limit` bytes. OSError
    (a missing file, no permission) passes as it is, for the caller to word."""
    shown = clean(str(path))
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else \
                "a device or socket"
            raise FileRefused(f"the {what} {shown} is {kind}, not a regular file; not read",
                              "replace it with the file it should be (or remove it, if metralectl keeps it)")
        if st.st_size > limit:
            raise FileRefused(f"the {what} {shown} is {st.st_size} bytes, more than the {_size(limit)} metralectl "
                              "reads of it; not read", "check what wrote it; remove it if metralectl keeps it")
        os.set_blocking(fd, True)
        chunks, left = [], limit + 1
        while left > 0:  # a file that grows while it is read still stops at the cap
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise FileRefused(f"the {what} {shown} grew past the {_size(limit)} metralectl reads of it; not read")
    return data


def read_text(path: Path | str, limit: int, what: str = "file", errors: str = "strict") -> str:
    """read_bytes() decoded as UTF-8 (a decoding error is ValueError, as Path.read_text raises)."""
    return read_bytes(path, limit, what).decode("utf-8", errors)
