"""Which processes of this host have given files open or mapped — read from /proc, nothing changed.

`rm` and `prune` ask it before removing weights: a process that maps a blob (an engine in a container
mmaps its weights; the container's processes are this host's) or holds it open uses it, whatever any
catalog says. Files are compared by (device, inode), so a path seen inside a container's mount
namespace matches the cache's file on the host. Processes this user may not inspect are not seen (as
root, all are); our own process is never counted.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

Key = tuple[int, int]  # (st_dev, st_ino)


def _name(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as fh:
            return fh.read(64).strip()
    except OSError:
        return "?"


def _mapped(pid: str, wanted: set[Key]) -> set[Key]:
    found: set[Key] = set()
    try:
        with open(f"/proc/{pid}/maps", encoding="ascii", errors="replace") as fh:
            for line in fh:
                fields = line.split(maxsplit=5)
                if len(fields) < 6 or fields[4] == "0":
                    continue
                major, _, minor = fields[3].partition(":")
                try:
                    key = (os.makedev(int(major, 16), int(minor, 16)), int(fields[4]))
                except ValueError:
                    continue
                if key in wanted:
                    found.add(key)
    except OSError:
        pass
    return found


def _opened(pid: str, wanted: set[Key]) -> set[Key]:
    found: set[Key] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")  # procfs' own link: stat() names the open file, opens nothing
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in wanted:
            found.add((st.st_dev, st.st_ino))
    return found


def users(keys: Iterable[Key]) -> dict[Key, list[tuple[int, str]]]:
    """(device, inode) -> the processes (pid, name) that have it open or mapped."""
    wanted = set(keys)
    out: dict[Key, list[tuple[int, str]]] = {}
    if not wanted:
        return out
    me = str(os.getpid())
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit() and p != me]
    except OSError:
        return out
    for pid in pids:
        hits = _mapped(pid, wanted) | _opened(pid, wanted)
        if hits:
            name = _name(pid)
            for key in hits:
                out.setdefault(key, []).append((int(pid), name))
    return out
