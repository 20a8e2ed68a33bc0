"""Whose files the Hugging Face cache holds: the "I once ran sudo metralectl" trap (SPEC §5) — read only.

A root-owned file or directory in a user's cache (a past `sudo` download) makes the next unprivileged
download or cleanup fail half-way with a bare PermissionError; finding it first lets `pull` say why.
The scan never follows a link: a repository folder that is a symlink is looked at, not walked through.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from metralectl import paths, wording


@dataclass(frozen=True)
class Ownership:
    uid: int  # whose cache this should be
    offenders: tuple[Path, ...]  # a sample (at most `limit`)
    count: int
    fix_path: Path | None

    @property
    def ok(self) -> bool:
        return self.count == 0

    @property
    def fix(self) -> str:
        return f"sudo chown -R $USER: {shlex.quote(str(self.fix_path))}" if self.fix_path else ""

    def describe(self) -> str:
        owners = sorted({_owner_name(p) for p in self.offenders})
        sample = ", ".join(paths.display(p) for p in self.offenders[:3])
        more = f" and {self.count - 3} more" if self.count > 3 else ""
        return (f"{wording.count(self.count, 'path')} in your Hugging Face cache "
                f"{wording.noun(self.count, 'belongs', 'belong')} to {', '.join(owners)}, not to you: {sample}{more}")


def _owner_name(path: Path) -> str:
    try:
        uid = path.lstat().st_uid
    except OSError:
        return "?"
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return f"uid {uid}"


def nearest_existing(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def ownership(repo: str | None, hub: Path | None = None, uid: int | None = None, limit: int = 20) -> Ownership:
    """Paths of the cache (the hub dir, HF_HOME, the repo's tree, its locks) not owned by `uid`."""
    uid = os.geteuid() if uid is None else uid
    hub = hub or paths.hf_hub_cache()
    home = paths.hf_home()
    tops = [p for p in (home, hub) if p.exists() and (p == hub or hub.is_relative_to(home))]
    trees: list[Path] = []
    if repo is not None:
        folder = "models--" + repo.replace("/", "--")  # hfcache.folder_name (not imported: hfcache imports this)
        trees = [hub / folder, hub / ".locks" / folder]
    found: list[Path] = []
    count = 0

    def check(path: Path) -> None:
        nonlocal count
        try:
            if path.lstat().st_uid != uid:
                count += 1
                if len(found) < limit:
                    found.append(path)
        except OSError:
            pass

    for top in dict.fromkeys(tops):
        check(top)
    for tree in trees:
        if tree.is_symlink():  # looked at, never walked through (os.walk would follow a link at the top)
            check(tree)
            continue
        for root, dirs, files in os.walk(tree):
            check(Path(root))
            for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
                check(Path(root) / name)
    return Ownership(uid, tuple(found), count, _fix_path(found, [home, hub, *trees[:1]]) if found else None)


def _fix_path(found: Iterable[Path], candidates: list[Path]) -> Path:
    """The smallest of HF_HOME / the hub / the repo folder that holds every offender."""
    found = list(found)
    best = candidates[0]
    for candidate in candidates:
        if all(p == candidate or p.is_relative_to(candidate) for p in found):
            best = candidate
    if not all(p.is_relative_to(best) for p in found):
        best = Path(os.path.commonpath([str(p) for p in found]))
    return best


def free_bytes(path: Path) -> int:
    """Free space for an unprivileged writer on the filesystem that holds `path` (or would)."""
    return shutil.disk_usage(nearest_existing(path)).free
