"""What `rm` and `prune` remove from the HF cache, and the removal itself — filesystem only.

Only repository folders (`models--ORG--NAME`) are ever touched: a recipe's repository (its whole folder
for a safetensors checkpoint; for a GGUF one only its quant's files, with the snapshot's verified
manifest kept in step), a repository metralectl pulled that no recipe names any more (its snapshots
carry metralectl's manifest), and dead downloads in those folders: `.incomplete` blobs and metralectl's
own resumable partials (`.metralectl-partial/`, seams/hf/staging.py). A folder holding another user's files
is refused, never half-removed. Everything is planned first (what goes, and the bytes it frees) so
`--dry-run` shows exactly what a real run would do.

Every look and every removal goes through the cache's `ownedfs.Owned`: nothing is followed through a
symlink. A repository folder that is a link is left alone (said); a snapshot entry that points outside
its repository's blobs is left alone with what it points to (said: "left alone: X points outside the
cache"); a link inside a folder that goes whole is removed as a link, its target never touched.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from metralectl import paths
from metralectl.errors import MetralError
from metralectl.ownedfs import Owned
from metralectl.safetext import clean
from metralectl.seams.hf import cache as hfcache, gguf as hfgguf, staging as hfstaging
from metralectl.seams.hf.cache import EXPECTED_LISTING, VERIFIED_MANIFEST
from metralectl.seams.hf.listing import Listing, RepoFile
from metralectl.seams.hf.steps import lock_free

DEAD_DOWNLOAD_IDLE_S = 120.0  # an `.incomplete` blob nobody wrote to for this long, whose lock is free


@dataclass
class Removal:
    """One thing to remove, what it frees, and why it may not go."""

    kind: str  # weights | quant | download | image | left-alone
    name: str  # REPO, REPO:QUANT, the download's file, or the image ref
    bytes: int
    paths: list[Path] = field(default_factory=list)  # weights: what is deleted (folders whole)
    recipes: tuple[str, ...] = ()  # the recipes that name it
    blocked: str | None = None  # why it is refused (a running container uses it, another user's files…)
    repo: str = ""
    quant: str | None = None
    done: bool = False
    error: str | None = None
    left_alone: list[str] = field(default_factory=list)  # links in it not followed, and what they point to

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "name": self.name, "bytes": self.bytes, "recipes": list(self.recipes),
                "blocked": self.blocked, "removed": self.done, "error": self.error, "left_alone": self.left_alone}


def _walk(cache: Owned, rel: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every entry under `rel` (links as links, never followed), with its lstat."""
    todo = [rel]
    while todo:
        folder = todo.pop()
        for name in hfcache.listdir(cache, folder):
            st = hfcache.lstat(cache, folder / name)
            if st is None:
                continue
            yield folder / name, st
            if stat.S_ISDIR(st.st_mode):
                todo.append(folder / name)


def _size(cache: Owned, path: Path) -> int:
    """Bytes of the regular files at or under `path` (links counted as links: nothing)."""
    st = hfcache.lstat(cache, path)
    if st is None or stat.S_ISLNK(st.st_mode):
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size
    return sum(s.st_size for _, s in _walk(cache, path) if stat.S_ISREG(s.st_mode))


def _foreign(cache: Owned, path: Path, uid: int) -> tuple[Path, int] | None:
    """The first entry at or under `path` another user owns (None: all ours)."""
    st = hfcache.lstat(cache, path)
    if st is not None and st.st_uid != uid:
        return path, st.st_uid
    return next(((p, s.st_uid) for p, s in _walk(cache, path) if s.st_uid != uid), None)


def _check_owner(cache: Owned, item: Removal, path: Path) -> None:
    other = _foreign(cache, path, os.getuid())
    if other is not None:
        item.blocked = f"{paths.display(other[0])} belongs to another user (uid {other[1]}): not removed by metralectl"


def _link_note(entry: Path, target: tuple[str, ...] | None, cache: Owned) -> str:
    where = paths.display(cache.path("/".join(target))) if target is not None else "outside the cache"
    return f"left alone: {clean(paths.display(entry))} points outside the cache ({clean(where)})"


def _blob_of(cache: Owned, base: Path, entry: Path) -> tuple[str, ...] | None:
    """For a link in a snapshot: the blob it leads to, when every hop stays inside the cache and it ends in this
    repository's blobs/ (a `blobs` that is itself a link leads out); None otherwise."""
    try:
        target = cache.resolve(entry)
    except (OSError, MetralError):
        return None
    blobs = cache.parts(base / "blobs")
    return target if target is not None and target[:-1] == blobs else None


def _folder_refused(cache: Owned, base: Path, kind: str, name: str, recipes: tuple[str, ...],
                    repo: str) -> Removal | None:
    """A refusal for a repository folder that is a link or no folder (left alone, said); None when it is one."""
    st = hfcache.lstat(cache, base)
    if st is None or stat.S_ISDIR(st.st_mode):
        return None
    why = "is a symbolic link" if stat.S_ISLNK(st.st_mode) else "is not a folder"
    return Removal(kind, name, 0, [], recipes, f"left alone: {clean(paths.display(base))} {why}; metralectl does "
                   "not follow links in the Hugging Face cache", repo=repo)


def plan_repo(repo: str, hub: Path, recipes: tuple[str, ...] = ()) -> Removal | None:
    """The whole repository folder (a safetensors checkpoint); None when the cache holds nothing of it."""
    cache = hfcache.owned(hub)
    base = hfcache.repo_dir(repo, hub)
    if hfcache.lstat(cache, base) is None:
        return None
    refused = _folder_refused(cache, base, "weights", repo, recipes, repo)
    if refused is not None:
        return refused
    item = Removal("weights", repo, _size(cache, base), [base], recipes, repo=repo)
    inside = cache.parts(base)
    for entry, st in _walk(cache, base):
        if not stat.S_ISLNK(st.st_mode):
            continue
        target = cache.link_target(entry)
        if target is None or target[: len(inside)] != inside or (
                entry.is_relative_to(base / "snapshots") and _blob_of(cache, base, entry) is None):
            item.left_alone.append(_link_note(entry, target, cache) + ": the link goes with the folder, what it "
                                   "points to stays")
    _check_owner(cache, item, base)
    return item


def _links(cache: Owned, base: Path) -> dict[Path, Path | None]:
    """Every file of every snapshot -> the blob it points to (itself for a plain file; None: a link out)."""
    out: dict[Path, Path | None] = {}
    for entry, st in _walk(cache, base / "snapshots"):
        if stat.S_ISLNK(st.st_mode):
            target = _blob_of(cache, base, entry)
            out[entry] = cache.path("/".join(target)) if target is not None else None
        elif not stat.S_ISDIR(st.st_mode):
            out[entry] = entry
    return out


def quant_paths(snapshot: Path, quant: str) -> set[str]:
    """The quant's model files in a snapshot: as its manifest's subset records them, and as the files on disk
    name themselves (sidecars such as mmproj are shared by every quant: never included)."""
    key = hfgguf.subset_key(quant)
    found = {f.path for m in hfgguf.models(hfgguf.local_files(snapshot)) if m.label.upper() == key for f in m.parts}
    verified = hfgguf.read_verified(snapshot)
    if verified is not None and verified.subsets is not None:
        found |= set(verified.subsets.get(key, ()))
    return found


def plan_quant(repo: str, quant: str, hub: Path, recipes: tuple[str, ...] = ()) -> Removal | None:
    """A GGUF quant's files in every snapshot, and the blobs no other file of the repository points to."""
    cache = hfcache.owned(hub)
    base = hfcache.repo_dir(repo, hub)
    if hfcache.lstat(cache, base) is None:
        return None
    refused = _folder_refused(cache, base, "quant", f"{repo}:{quant}", recipes, repo)
    if refused is not None:
        return refused
    snapshots = [base / "snapshots" / n for n in hfcache.listdir(cache, base / "snapshots")
                 if hfcache.is_dir(cache, base / "snapshots" / n)]
    links = _links(cache, base)
    going: list[Path] = []
    notes: list[str] = []
    for snapshot in snapshots:
        for rel in sorted(quant_paths(snapshot, quant)):
            entry = snapshot / rel
            if entry in links and links[entry] is None:
                notes.append(_link_note(entry, cache.link_target(entry), cache))
            elif entry in links:
                going.append(entry)
    if not going and not notes:
        return None
    kept_targets = {target for entry, target in links.items() if entry not in going}
    blobs = {t for p in going if (t := links[p]) is not None and t != p and t not in kept_targets}
    freed = sum(_size(cache, b) for b in blobs) + sum(_size(cache, p) for p in going)
    item = Removal("quant", f"{repo}:{quant}", freed, [*going, *sorted(blobs)], recipes, repo=repo, quant=quant,
                   left_alone=notes)
    if not going:
        item.blocked = "left alone: each of its files points outside the cache (listed below)"
    for path in item.paths:
        st = hfcache.lstat(cache, path)
        if st is not None and st.st_uid != os.getuid():
            item.blocked = f"{paths.display(path)} belongs to another user: not removed by metralectl"
            break
    return item


def dead_downloads(repo_folder: Path, hub: Path, recipes: tuple[str, ...] = ()) -> list[Removal]:
    """`.incomplete` blobs of a killed download: the per-attempt name (`<etag>.<random>.incomplete`, never
    resumed), idle for DEAD_DOWNLOAD_IDLE_S, its download lock free."""
    cache = hfcache.owned(hub)
    out = []
    for path in hfcache.stale_incomplete(repo_folder, DEAD_DOWNLOAD_IDLE_S):
        etag = hfcache.attempt_etag(path)
        if etag is None or not lock_free(cache, Path(".locks") / repo_folder.name / f"{etag}.lock"):
            continue
        item = Removal("download", f"{repo_folder.name}/blobs/{path.name}", _size(cache, path), [path], recipes)
        _check_owner(cache, item, path)
        out.append(item)
    return out


def partial_downloads(repo_folder: Path, hub: Path, recipes: tuple[str, ...] = ()) -> list[Removal]:
    """metralectl's resumable partial downloads (and stray entries of their folder), unless a pull of the
    repository is running now (it holds the pull lock). Removing one only costs the next pull its head start."""
    from metralectl.core.progress import human_bytes

    cache = hfcache.owned(hub)
    if not lock_free(cache, Path(".locks") / repo_folder.name / "metralectl-pull.lock"):
        return []
    where = f"{repo_folder.name}/{hfcache.PARTIAL_DIR}"
    if hfcache.is_link(cache, hfstaging.partial_folder(repo_folder)):
        return [Removal("left-alone", where, 0, [], recipes, f"{clean(paths.display(hfstaging.partial_folder(repo_folder)))} "
                        "is a symbolic link: not followed, nothing in it removed")]
    out = []
    for found in hfstaging.partials_listed(repo_folder):
        item = Removal("download", f"{where}/{found.part.name} (partial {clean(found.path)}, {human_bytes(found.have)} "
                       f"of {human_bytes(found.size)}; `metralectl pull` would resume it)", found.have, found.files,
                       recipes, repo=found.repo)  # removed under the pull lock: never under a pull's feet
        out.append(item)
    for stray in hfstaging.orphan_partials(repo_folder):
        link = hfcache.is_link(cache, stray)
        out.append(Removal("download", f"{where}/{clean(stray.name)}", _size(cache, stray), [stray], recipes,
                           left_alone=[f"left alone: what {clean(stray.name)} points to (the link itself goes)"]
                           if link else []))
    for item in out:
        for path in item.paths:
            _check_owner(cache, item, path)
    return out


def pulled_by_metralectl(base: Path) -> str | None:
    """The repository a folder holds when metralectl pulled it (a snapshot carries its manifest), else None."""
    cache = hfcache.owned_of(base)
    for name in hfcache.listdir(cache, base / "snapshots"):
        snapshot = base / "snapshots" / name
        if not hfcache.is_dir(cache, snapshot):
            continue
        for manifest in (VERIFIED_MANIFEST, EXPECTED_LISTING):
            listing = Listing.from_json(hfcache.read_json(snapshot / manifest, cache))
            if listing is not None:
                return listing.repo
    return None


def plan_prune(hub: Path, named: dict[str, tuple[str, ...]]) -> list[Removal]:
    """Repositories metralectl pulled that no recipe names; dead downloads in any repository a recipe names or
    metralectl pulled. `named`: repository -> the recipes naming it. A repository folder that is a link is
    only said (left alone)."""
    cache = hfcache.owned(hub)
    out: list[Removal] = []
    folders = {hfcache.folder_name(repo): repo for repo in named}
    for name in hfcache.listdir(cache, Path("")):
        base = hub / name
        st = hfcache.lstat(cache, base)
        if not name.startswith("models--") or st is None:
            continue
        if stat.S_ISLNK(st.st_mode):
            out.append(Removal("left-alone", clean(name), 0, [], named.get(folders.get(name, ""), ()),
                               f"{clean(paths.display(base))} is a symbolic link: not followed, nothing in it removed"))
            continue
        if not stat.S_ISDIR(st.st_mode):
            continue
        repo = folders.get(name)
        if repo is not None:
            out.extend(dead_downloads(base, hub, named[repo]))
            out.extend(partial_downloads(base, hub, named[repo]))
            continue
        pulled = pulled_by_metralectl(base)
        if pulled is None or hfcache.folder_name(pulled) != name:
            continue  # another tool's download (or a folder that is not what its manifest says): never ours to remove
        item = plan_repo(pulled, hub)
        if item is not None:
            out.append(item)
    return out


def forget_quant(snapshot: Path, quant: str, removed: set[str]) -> None:
    """Keep the verified manifest true after a quant's files went: its subset goes, and the files no other subset
    names. A whole-snapshot manifest is first split into the subsets of the complete models it vouched for."""
    verified = hfgguf.read_verified(snapshot)
    if verified is None:
        return
    cache = hfcache.owned_of_snapshot(snapshot)
    subsets = dict(verified.subsets) if verified.subsets is not None else {
        hfgguf.subset_key(m.label): tuple(f.path for f in m.parts)
        for m in hfgguf.models(verified.files.values()) if m.complete}
    subsets.pop(hfgguf.subset_key(quant), None)
    still = {p for members in subsets.values() for p in members}
    files: list[RepoFile] = [f for f in verified.files.values() if f.path in still or f.path not in removed]
    data = hfcache.read_json(snapshot / VERIFIED_MANIFEST, cache)
    assert isinstance(data, dict)  # read_verified parsed it
    data["files"] = [{"path": f.path, "size": f.size, "sha256": f.sha256, "git_oid": f.git_oid}
                     for f in sorted(files, key=lambda f: f.path)]
    data["subsets"] = {k: list(v) for k, v in sorted(subsets.items())}
    hfcache.put_json(cache, snapshot / VERIFIED_MANIFEST, data)


def remove(item: Removal, hub: Path) -> None:
    """Remove one planned item under its repository's pull lock; item.done / item.error say what happened."""
    from metralectl.seams.hf.steps import pull_lock

    cache = hfcache.owned(hub)
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
                cache.remove_file(path)
        elif item.kind == "weights":
            for path in item.paths:
                cache.remove_tree(path)
        else:
            for path in item.paths:
                cache.remove_file(path)
        item.done = True
    except MetralError as exc:
        item.error = exc.message
    except OSError as exc:
        item.error = f"{exc.strerror or exc} ({exc.filename})" if exc.filename else str(exc)
    finally:
        if lock is not None:
            lock.close()


remove_item = remove  # the name `disk_cmds` calls (owned_scan reads a bare `remove()` as os.remove)
