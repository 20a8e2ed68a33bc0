"""State on disk: atomic writes (metralectl.atomicfile), the one-lifecycle-at-a-time lock, run logs and records."""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from metralectl import paths
from metralectl.atomicfile import write_atomic as write_atomic  # the one atomic write; callers use store's name
from metralectl.errors import ExitCode, MetralError


class Busy(MetralError):
    """Another launch or swap holds the machine's lifecycle lock."""

    exit_code = ExitCode.BUSY


def state_dir() -> Path:
    path = paths.metrale_home() / "state"
    path.mkdir(parents=True, exist_ok=True)
    return path


def logs_dir() -> Path:
    path = paths.metrale_home() / "logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_json(path: Path, value: Any, *, mode: int | None = None) -> None:
    """`value` as indented JSON, written atomically (mode: as for write_atomic)."""
    write_atomic(path, json.dumps(value, indent=2, sort_keys=True, default=str) + "\n", mode=mode)


def read_json(path: Path) -> object:
    """The file's JSON value (callers check its shape), or None when it is missing or not JSON. A file that is
    no regular file or holds more than filecap.DOCUMENT_LIMIT is FileRefused (exit 65), not read."""
    from metralectl.filecap import DOCUMENT_LIMIT, read_text

    try:
        return json.loads(read_text(path, DOCUMENT_LIMIT, "state file"))
    except (OSError, ValueError, RecursionError):
        return None


def append_jsonl(path: Path, value: Any) -> None:
    """One record per line, written with a single O_APPEND write (no torn lines between writers)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(value, sort_keys=True, default=str) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line  # a writer killed mid-line left a torn tail: start on a fresh line
        os.write(fd, line)
    finally:
        os.close(fd)


def read_jsonl(path: Path) -> list[Any]:
    """Every record of a JSONL file (a torn line skipped); FileRefused past filecap.RECORD_LIMIT."""
    from metralectl.filecap import RECORD_LIMIT, read_text

    out = []
    try:
        for line in read_text(path, RECORD_LIMIT, "record file", errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a crash is skipped, the rest is kept
    except OSError:
        pass
    return out


def lock_path() -> Path:
    """One lifecycle at a time per machine: the lock lives outside any one user's home."""
    directory = Path(os.environ.get("METRALECTL_LOCK_DIR") or tempfile.gettempdir())
    return directory / "metralectl-lifecycle.lock"


UNIT_HOLDER = "bench unit "  # how a peer's benchmark unit names itself as the lock's holder
AGENT_JOB = " (agent)"  # how the agent's job (one its page started) marks itself: "run qwen (agent)"


def busy_because(holder: str) -> Busy:
    if holder.startswith(UNIT_HOLDER):
        key = holder[len(UNIT_HOLDER):].split(" ", 1)[0]
        return Busy(f"busy: {holder} is in progress on this machine",
                    f"wait for it to finish, or stop it: `metralectl peer units --cancel {key}`")
    if AGENT_JOB + " (pid " in holder:
        return Busy(f"busy: {holder} is in progress on this machine",
                    "wait for the agent's job to finish, or cancel it on the agent's page (`metralectl agent status` "
                    "shows where)")
    return Busy(f"busy: {holder} is in progress on this machine",
                "wait for it to finish (`metralectl ps` shows what is serving)")


@contextmanager
def lifecycle_lock(what: str, path: Path | None = None) -> Iterator[None]:
    """Hold the machine's lifecycle lock (`path`: another machine's, in tests), or raise Busy at once."""
    path = path or lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            os.fchmod(fd, 0o666)  # other users' metralectl must be able to take it too
        except OSError:
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise busy_because(os.pread(fd, 200, 0).decode(errors="replace").strip() or "another metralectl") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{what} (pid {os.getpid()})".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def lock_holder(path: Path | None = None) -> str | None:
    """Who holds the lifecycle lock now ("run qwen (pid 12)"), or None when nobody does."""
    path = path or lock_path()
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 200, 0).decode(errors="replace").strip() or "another metralectl"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def lock_held() -> bool:
    """Whether some process holds the lifecycle lock now (a journal without a holder is stale)."""
    return lock_holder() is not None
