"""What `rm` and `prune` remove from the HF cache, and the removal itself — filesystem only.

Only repository folders (`models--ORG--NAME`) are ever touched: a recipe's repository (its whole folder
for a safetensors checkpoint; for a GGUF one only its quant's files, with the snapshot's verified
manifest kept in step), a repository metralectl pulled that no recipe names any more (its snapshots
carry metralectl's manifest), and dead downloads in those folders: huggingface_hub's `.incomplete` blobs and
metralectl's own resumable partials (`.metralectl-partial/`, seams/partials.py). A folder holding
another user's files is refused, never half-removed. Everything is planned first (what goes, and the
bytes it frees) so `--dry-run` shows exactly what a real run would do.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from metralectl.seams import gguf, gguf_cache, hfcache, partials
from metralectl.seams.hfcache import EXPECTED_LISTING, VERIFIED_MANIFEST, RepoFile

DEAD_DOWNLOAD_IDLE_S = 120.0  # an `.incomplete` blob nobody wrote to for this long, whose lock is free


@dataclass
class Removal:
    """One thing to remove, what it frees, and why it may not go."""

    kind: str  # weights | quant | download | image
    name: str  # REPO, REPO:QUANT, the download's file, or the image ref
    bytes: int
    paths: list[Path] = field(default_factory=list)  # weights: what is deleted (folders whole)
    recipes: tuple[str, ...] = ()  # the recipes that name it
    blocked: str | None = None  # why it is refused (a running container uses it, another user's files…)
    repo: str = ""
    quant: str | None = None
    done: bool = False
    error: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "name": self.name, "bytes": self.bytes, "recipes": list(self.recipes),
                "blocked": self.blocked, "removed": self.done, "error": self.error}


def _size(path: Path) -> int:
    """Bytes of the files under `path` (symlinks counted as links, not followed)."""
    try:
        st = path.lstat()
    except OSError:
        return 0
    if not path.is_dir() or path.is_symlink():
        return st.st_size if not path.is_symlink() else 0
    total = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                entry = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if not os.path.islink(os.path.join(root, name)):
                total += entry.st_size
    return total


def _foreign(path: Path, uid: int) -> Path | None:
    """The first file or folder under `path` another user owns (None: all ours)."""
    for root, dirs, names in os.walk(path):
        for name in [*dirs, *names]:
            full = Path(root) / name
            try:
                if full.lstat().st_uid != uid:
                    return full
            except OSError:
                continue
    return None


def _check_owner(item: Removal, base: Path) -> None:
    uid = os.getuid()
    other = _foreign(base, uid) if base.is_dir() else None
    try:
        top_foreign = base.lstat().st_uid != uid
    except OSError:
        top_foreign = False
    if other is not None or top_foreign:
        item.blocked = (f"{other or base} belongs to another user (uid {(other or base).lstat().st_uid}): "
                        "not removed by metralectl")


def plan_repo(repo: str, hub: Path, recipes: tuple[str, ...] = ()) -> Removal | None:
    """The whole repository folder (a safetensors checkpoint); None when the cache holds nothing of it."""
    base = hfcache.repo_dir(repo, hub)
    if not base.is_dir():
        return None
    item = Removal("weights", repo, _size(base), [base], recipes, repo=repo)
    _check_owner(item, base)
    return item


def _links(base: Path) -> dict[Path, Path]:
    """Every file of every snapshot -> the blob it points to (or itself, a plain file)."""
    out: dict[Path, Path] = {}
    for root, _dirs, names in os.walk(base / "snapshots"):
        for name in names:
            link = Path(root) / name
            out[link] = Path(os.path.normpath(link.parent / os.readlink(link))) if link.is_symlink() else link
    return out


def quant_paths(snapshot: Path, quant: str) -> set[str]:
    """The quant's model files in a snapshot: as its manifest's subset records them, and as the files on disk
    name themselves (sidecars such as mmproj are shared by every quant: never included)."""
    key = gguf_cache.subset_key(quant)
    found = {f.path for m in gguf.models(gguf_cache.local_files(snapshot)) if m.label.upper() == key for f in m.parts}
    verified = gguf_cache.read_verified(snapshot)
    if verified is not None and verified.subsets is not None:
        found |= set(verified.subsets.get(key, ()))
    return found


def plan_quant(repo: str, quant: str, hub: Path, recipes: tuple[str, ...] = ()) -> Removal | None:
    """A GGUF quant's files in every snapshot, and the blobs no other file of the repository points to."""
    base = hfcache.repo_dir(repo, hub)
    try:
        snapshots = [d for d in (base / "snapshots").iterdir() if d.is_dir()]
    except OSError:
        return None
    links = _links(base)
    going = [s / p for s in snapshots for p in quant_paths(s, quant) if (s / p).is_symlink() or (s / p).exists()]
    if not going:
        return None
    kept_targets = {target for link, target in links.items() if link not in going}
    blobs = {links[p] for p in going if p in links and links[p] not in kept_targets and links[p] != p}
    freed = sum(_size(b) for b in blobs) + sum(_size(p) for p in going if not p.is_symlink())
    item = Removal("quant", f"{repo}:{quant}", freed, [*going, *sorted(blobs)], recipes, repo=repo, quant=quant)
    for path in item.paths:
        try:
            if path.lstat().st_uid != os.getuid():
                item.blocked = f"{path} belongs to another user: not removed by metralectl"
                break
        except OSError:
            continue
    return item


def _lock_free(lock: Path) -> bool:
    try:
        with open(lock, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released on close
        return True
    except OSError:
        return False


def dead_downloads(repo_folder: Path, hub: Path, recipes: tuple[str, ...] = ()) -> list[Removal]:
    """`.incomplete` blobs of a killed download: huggingface_hub's per-attempt name (`<etag>.<random>.incomplete`,
    never resumed), idle for DEAD_DOWNLOAD_IDLE_S, its download lock free."""
    out = []
    locks = hub / ".locks" / repo_folder.name
    for path in hfcache.stale_incomplete(repo_folder, DEAD_DOWNLOAD_IDLE_S):
        parts = path.name.split(".")
        if len(parts) != 3 or not _lock_free(locks / f"{parts[0]}.lock"):
            continue
        item = Removal("download", f"{repo_folder.name}/blobs/{path.name}", _size(path), [path], recipes)
        if path.lstat().st_uid != os.getuid():
            item.blocked = f"{path} belongs to another user: not removed by metralectl"
        out.append(item)
    return out


def partial_downloads(repo_folder: Path, hub: Path, recipes: tuple[str, ...] = ()) -> list[Removal]:
    """metralectl's resumable partial downloads (and stray files of their folder), unless a pull of the repository
    is running now (it holds the pull lock). Removing one only costs the next pull its head start."""
    from metralectl.core.progress import human_bytes

    lock = hub / ".locks" / repo_folder.name / "metralectl-pull.lock"
    if lock.exists() and not _lock_free(lock):  # no lock file: no pull ever ran here, none runs now
        return []
    out = []
    where = f"{repo_folder.name}/{partials.PARTIAL_DIR}"
    for found in partials.listed(repo_folder):
        item = Removal("download", f"{where}/{found.part.name} (partial {found.path}, {human_bytes(found.have)} of "
                       f"{human_bytes(found.size)}; `metralectl pull` would resume it)", found.have, found.files,
                       recipes, repo=found.repo)  # removed under the pull lock: never under a pull's feet
        out.append(item)
    for stray in partials.orphans(repo_folder):
        out.append(Removal("download", f"{where}/{stray.name}", _size(stray), [stray], recipes))
    for item in out:
        if any(p.exists() and p.lstat().st_uid != os.getuid() for p in item.paths):
            item.blocked = f"{item.paths[0]} belongs to another user: not removed by metralectl"
    return out


def pulled_by_metralectl(base: Path) -> str | None:
    """The repository a folder holds when metralectl pulled it (a snapshot carries its manifest), else None."""
    try:
        snapshots = [d for d in (base / "snapshots").iterdir() if d.is_dir()]
    except OSError:
        return None
    for snapshot in snapshots:
        for name in (VERIFIED_MANIFEST, EXPECTED_LISTING):
            data = hfcache.read_json(snapshot / name)
            if isinstance(data, dict) and isinstance(data.get("repo"), str):
                return str(data["repo"])
    return None


def plan_prune(hub: Path, named: dict[str, tuple[str, ...]]) -> list[Removal]:
    """Repositories metralectl pulled that no recipe names; dead downloads in any repository a recipe names or
    metralectl pulled. `named`: repository -> the recipes naming it."""
    out: list[Removal] = []
    folders = {hfcache.repo_dir(repo, hub).name: repo for repo in named}
    try:
        entries = sorted(p for p in hub.iterdir() if p.is_dir() and p.name.startswith("models--"))
    except OSError:
        return out
    for base in entries:
        repo = folders.get(base.name)
        if repo is not None:
            out.extend(dead_downloads(base, hub, named[repo]))
            out.extend(partial_downloads(base, hub, named[repo]))
            continue
        pulled = pulled_by_metralectl(base)
        if pulled is None or hfcache.repo_dir(pulled, hub) != base:
            continue  # another tool's download (or a folder that is not what its manifest says): never ours to remove
        item = plan_repo(pulled, hub)
        if item is not None:
            out.append(item)
    return out


def forget_quant(snapshot: Path, quant: str, removed: set[str]) -> None:
    """Keep the verified manifest true after a quant's files went: its subset goes, and the files no other subset
    names. A whole-snapshot manifest is first split into the subsets of the complete models it vouched for."""
    verified = gguf_cache.read_verified(snapshot)
    if verified is None:
        return
    subsets = dict(verified.subsets) if verified.subsets is not None else {
        gguf_cache.subset_key(m.label): tuple(f.path for f in m.parts)
        for m in gguf.models(verified.files.values()) if m.complete}
    subsets.pop(gguf_cache.subset_key(quant), None)
    still = {p for members in subsets.values() for p in members}
    files: list[RepoFile] = [f for f in verified.files.values() if f.path in still or f.path not in removed]
    data = hfcache.read_json(snapshot / VERIFIED_MANIFEST)
    assert isinstance(data, dict)  # read_verified parsed it
    data["files"] = [{"path": f.path, "size": f.size, "sha256": f.sha256, "git_oid": f.git_oid}
                     for f in sorted(files, key=lambda f: f.path)]
    data["subsets"] = {k: list(v) for k, v in sorted(subsets.items())}
    hfcache.write_json_atomic(snapshot / VERIFIED_MANIFEST, data)


def remove(item: Removal, hub: Path) -> None:
    """Remove one planned item under its repository's pull lock; item.done / item.error say what happened."""
    from metralectl.seams.weights_errors import WeightsError
    from metralectl.seams.weights_guard import pull_lock

    lock = None
    try:
        if item.repo:
            lock = pull_lock(item.repo, hub)
        if item.kind == "quant":
            assert item.quant is not None
            by_snapshot: dict[Path, set[str]] = {}
            snapshots = hfcache.repo_dir(item.repo, hub) / "snapshots"
            for path in item.paths:
                if path.is_relative_to(snapshots):
                    snapshot = snapshots / path.relative_to(snapshots).parts[0]
                    by_snapshot.setdefault(snapshot, set()).add(path.relative_to(snapshot).as_posix())
            for snapshot, removed in by_snapshot.items():  # the manifest first: it never vouches for a file gone
                forget_quant(snapshot, item.quant, removed)
            for path in item.paths:
                path.unlink(missing_ok=True)
        elif item.kind == "weights":
            for path in item.paths:
                shutil.rmtree(path)
        else:
            for path in item.paths:
                path.unlink(missing_ok=True)
        item.done = True
    except WeightsError as exc:
        item.error = exc.message
    except OSError as exc:
        item.error = f"{exc.strerror or exc} ({exc.filename})" if exc.filename else str(exc)
    finally:
        if lock is not None:
            lock.close()
