"""On-disk cache of the checked catalog, so `list` does not re-parse every YAML file each time.

Keyed by the path, size, mtime, ctime and inode of every data file (shipped and user) plus the metralectl and
Python versions; the whole key is stored with the catalog and compared on reading (the file name
only spreads keys, so no hashlib: loading OpenSSL for it cost `list` more than the check); written
atomically; any unreadable or stale entry is simply rebuilt.
"""

from __future__ import annotations

import os
import sys
import zlib
from pathlib import Path
from typing import Any

from metralectl import __version__, paths
from metralectl.atomicfile import write_atomic
_DIRS = ("engine", "kernels", "images", "recipes")


def _stats(directory: Path, out: list[str]) -> None:
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        out.append(f"{directory}:absent")
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=True):
            _stats(Path(entry.path), out)
        elif entry.name.endswith((".yaml", ".yml", ".json", ".txt")):  # .json/.txt: pinned option dumps
            st = entry.stat()
            # ctime too: an edit that keeps the size and restores the mtime (`touch -r`, `cp -p`, an editor
            # that preserves it) still moves the ctime, which no user call can set back
            out.append(f"{entry.path}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}")


def fingerprint(root: Path, user_dir: Path | None) -> str:
    parts = [__version__, sys.version, str(root), str(user_dir)]
    for name in _DIRS:
        _stats(root / name, parts)
    if user_dir is not None:
        _stats(user_dir, parts)
        _stats(user_dir.parent / "images", parts)
        synced = user_dir.parent / "synced" / "current"
        try:
            parts.append(f"synced->{os.readlink(synced)}")  # a sync swaps this link: a new set, a new key
        except OSError:
            parts.append("synced:absent")
        _stats(synced, parts)
    # An engine plugin's data lives in its package: installing or removing one changes a site-packages directory
    # (its .dist-info comes or goes), so their times are in the key; no plugin is loaded to know it.
    import site  # imported at every start already (unless -S)

    for entry in site.getsitepackages():
        try:
            parts.append(f"{entry}:{os.stat(entry).st_mtime_ns}")
        except OSError:
            parts.append(f"{entry}:absent")
    return "\n".join(parts)


def _path(key: str) -> Path:
    return paths.cache_dir() / f"catalog-{zlib.crc32(key.encode()):08x}.pickle"


def read(key: str) -> object:  # whatever was pickled: the caller checks it is a catalog
    import pickle  # here, not above: `list` reads this module's fingerprint, not its file

    try:
        with open(_path(key), "rb") as handle:
            stored_key, value = pickle.load(handle)
    except Exception:  # noqa: BLE001 - a missing, torn or foreign cache file only means "rebuild"
        return None
    return value if stored_key == key else None


def write(key: str, value: Any) -> None:
    import pickle

    target = _path(key)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        for old in target.parent.glob("catalog-*.pickle"):
            old.unlink(missing_ok=True)
        write_atomic(target, pickle.dumps((key, value), protocol=pickle.HIGHEST_PROTOCOL))
    except OSError:
        pass  # a read-only or full cache dir costs speed, never correctness
