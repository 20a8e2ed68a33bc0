"""The local Hugging Face cache as the engine will look in it — read with the filesystem only.

Layout: <hub>/models--ORG--NAME/{refs/<branch>, snapshots/<commit>/..., blobs/<etag>[.incomplete]}.
`list` calls `cache_state` for every recipe on every run, so nothing here touches the network or
imports huggingface_hub; stat() calls and two small JSON files are the whole cost.

What a snapshot can carry (written by `metralectl pull`, see weights.py):
  .metralectl-expected.json  the repo's file listing at that commit, written before downloading
  .metralectl-verified.json  the same listing, written only after every file was checked
Only the second makes a snapshot "complete"; a snapshot whose files all match a listing but were
never hashed is "present"; one missing files is "partial". A GGUF checkpoint needs only its quant's
files: its verified manifest also carries `subsets` (quant -> the files verified for it) and vouches
for those files only, never for the whole snapshot (gguf_cache.py judges it; weights_state.py picks).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from metralectl import paths
from metralectl.atomicfile import write_atomic
from metralectl.core.progress import human_bytes
from metralectl.seams import partials

VERIFIED_MANIFEST = ".metralectl-verified.json"
EXPECTED_LISTING = ".metralectl-expected.json"
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
MANIFEST_SCHEMA = 1


@dataclass(frozen=True)
class RepoFile:
    """One file of a repository at a commit, as the Hub lists it."""

    path: str
    size: int
    sha256: str | None = None  # LFS files: the content's sha256 (also their blob name in the cache)
    git_oid: str | None = None  # git blob id: sha1 of "blob <size>\\0" + content

    @property
    def etag(self) -> str | None:
        """The blob's file name under blobs/ (huggingface_hub names blobs by the Hub's ETag)."""
        return self.sha256 or self.git_oid


@dataclass(frozen=True)
class Listing:
    repo: str
    commit: str
    files: tuple[RepoFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {"schema": MANIFEST_SCHEMA, "repo": self.repo, "commit": self.commit,
                "files": [asdict(f) for f in self.files]}

    @classmethod
    def from_json(cls, data: Any) -> Listing | None:
        try:
            files = tuple(RepoFile(str(f["path"]), int(f["size"]), f.get("sha256"), f.get("git_oid"))
                          for f in data["files"])
            return cls(str(data["repo"]), str(data["commit"]), files)
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class CacheState:
    status: str  # "complete" | "present" | "partial" | "absent"
    snapshot: Path | None
    detail: str
    commit: str | None = None
    files_total: int | None = None
    files_present: int | None = None
    bytes_total: int | None = None
    bytes_present: int | None = None
    paths: tuple[str, ...] = ()  # a GGUF quant's files (what was judged); empty for a whole snapshot


def repo_dir(repo: str, hub: Path | None = None) -> Path:
    return (hub or paths.hf_hub_cache()) / ("models--" + repo.replace("/", "--"))


def snapshot_path(repo: str, commit: str, hub: Path | None = None) -> Path:
    return repo_dir(repo, hub) / "snapshots" / commit


def find_snapshot(base: Path, revision: str | None) -> Path | None:
    """The pinned commit's snapshot; unpinned: the one refs/main names, else the newest."""
    snapshots = base / "snapshots"
    if revision:
        candidate = snapshots / revision
        return candidate if candidate.is_dir() else None
    ref = base / "refs" / "main"
    try:
        commit = ref.read_text().strip()
    except OSError:
        commit = ""
    if commit and (snapshots / commit).is_dir():
        return snapshots / commit
    try:
        dirs = [d for d in snapshots.iterdir() if d.is_dir()]
    except OSError:
        return None
    return max(dirs, key=lambda d: d.stat().st_mtime) if dirs else None


def read_json(path: Path) -> object:
    """The file's JSON value (callers check its shape), or None when it is missing or not JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_json_atomic(path: Path, data: Any) -> None:
    """`data` as JSON, written atomically (metralectl.atomicfile): a reader sees the old file or the whole new one."""
    write_atomic(path, json.dumps(data, indent=1))


def read_manifest(snapshot: Path) -> Listing | None:
    """The listing a verified pull of the WHOLE snapshot recorded, if it is readable and for this very commit
    (a GGUF pull's manifest, with `subsets`, vouches for some files only: gguf_cache reads it)."""
    data = read_json(snapshot / VERIFIED_MANIFEST)
    if isinstance(data, dict) and "subsets" in data:
        return None
    listing = Listing.from_json(data)
    return listing if listing is not None and listing.commit == snapshot.name else None


def read_expected(snapshot: Path) -> Listing | None:
    """The repo's listing at this commit, from metralectl's own record or huggingface_hub's tree cache."""
    listing = Listing.from_json(read_json(snapshot / EXPECTED_LISTING))
    if listing is not None and listing.commit == snapshot.name:
        return listing
    tree = read_json(snapshot.parent.parent / "trees" / f"{snapshot.name}.json")  # huggingface_hub >= 1.x
    if not isinstance(tree, dict):
        return None
    try:
        files = tuple(RepoFile(p, int(e["size"]), e.get("lfs_sha256"), e.get("blob_id"))
                      for p, e in tree["files"].items())
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return Listing(snapshot.parent.parent.name, snapshot.name, files)


def file_ok(snapshot: Path, spec: RepoFile) -> bool:
    """Present with the listed size (stat follows the snapshot's symlink to its blob)."""
    try:
        return (snapshot / spec.path).stat().st_size == spec.size
    except OSError:
        return False


def missing(base: Path, commit: str, listing: Listing) -> list[RepoFile]:
    """Files that would still have to be fetched: neither in the snapshot nor as a finished blob."""
    snapshot = base / "snapshots" / commit
    out = []
    for spec in listing.files:
        if file_ok(snapshot, spec):
            continue
        blob = base / "blobs" / spec.etag if spec.etag else None
        try:
            if blob is not None and blob.stat().st_size == spec.size:
                continue
        except OSError:
            pass
        out.append(spec)
    return out


def repair_links(base: Path, commit: str, listing: Listing) -> int:
    """Before a download: make the snapshot fetchable again where huggingface_hub would not fetch it.

    A finished blob without its snapshot link (a download killed between huggingface_hub's rename of the
    blob and its symlink, or a link removed by hand) counts as present in `missing`, so nothing would
    download it: link it. A link to a blob of the wrong size counts as missing, but huggingface_hub sees
    the link and downloads nothing: remove both (a finished blob of the wrong size is damaged; downloads
    in progress are `.incomplete` files). Returns how many files were repaired."""
    snapshot = base / "snapshots" / commit
    repaired = 0
    for spec in listing.files:
        if file_ok(snapshot, spec) or not spec.etag:
            continue
        blob, pointer = base / "blobs" / spec.etag, snapshot / spec.path
        try:
            size = blob.stat().st_size if blob.exists() else None
            if size is not None and size != spec.size:
                blob.unlink()
                pointer.unlink(missing_ok=True)
            elif size == spec.size:
                pointer.parent.mkdir(parents=True, exist_ok=True)
                if pointer.is_symlink():
                    pointer.unlink()  # a dangling or wrong link
                pointer.symlink_to(os.path.relpath(blob, pointer.parent))
            else:
                continue
            repaired += 1
        except OSError:
            continue  # left to the download and the verification
    return repaired


def incomplete_blobs(base: Path) -> list[Path]:
    try:
        return [p for p in (base / "blobs").iterdir() if p.name.endswith(".incomplete")]
    except OSError:
        return []


def stale_incomplete(base: Path, idle_s: float = 120.0) -> list[Path]:
    """Leftovers of a killed download: `.incomplete` blobs nobody has written to for idle_s.

    huggingface_hub >= 1.x writes each download to a fresh `<etag>.<random>.incomplete` and cannot
    resume one left by a dead process, so these only take disk space.
    """
    now = time.time()
    out = []
    for path in incomplete_blobs(base):
        try:
            if now - path.stat().st_mtime > idle_s:
                out.append(path)
        except OSError:
            continue
    return out


def _judge(listing: Listing, snapshot: Path) -> tuple[int, int]:
    present = [f for f in listing.files if file_ok(snapshot, f)]
    return len(present), sum(f.size for f in present)


def _counted(status: str, snapshot: Path, detail: str, listing: Listing, count: int, size: int) -> CacheState:
    return CacheState(status, snapshot, detail, snapshot.name, len(listing.files), count, listing.total_bytes, size)


def cache_state(repo: str, revision: str | None = None, hub: Path | None = None) -> CacheState:
    """The whole snapshot's state (a safetensors checkpoint). Callers holding a checkpoint use
    weights_state.checkpoint_state."""
    base = repo_dir(repo, hub)
    if not base.is_dir():
        return CacheState("absent", None, f"{paths.display(base)} does not exist")
    snapshot = find_snapshot(base, revision)
    incomplete = bool(incomplete_blobs(base)) or partials.any_in(base)
    if snapshot is None:
        status = "partial" if incomplete else "absent"
        return CacheState(status, None, f"no snapshot{' for ' + revision if revision else ''} yet")
    commit = snapshot.name
    verified = read_manifest(snapshot)
    if verified is not None:
        count, size = _judge(verified, snapshot)
        if count == len(verified.files):
            return _counted("complete", snapshot, f"verified by metralectl pull: {count} files, "
                            f"{human_bytes(size)} at {commit[:12]}", verified, count, size)
        return _counted("partial", snapshot, f"{len(verified.files) - count} of {len(verified.files)} files "
                        "missing or changed since they were verified", verified, count, size)
    expected = read_expected(snapshot)
    if expected is not None:
        count, size = _judge(expected, snapshot)
        if count == len(expected.files):
            return _counted("present", snapshot, f"all {count} files present, not verified "
                            "(`metralectl pull` verifies them)", expected, count, size)
        return _counted("partial", snapshot, f"{count} of {len(expected.files)} files, {human_bytes(size)} of "
                        f"{human_bytes(expected.total_bytes)} downloaded", expected, count, size)
    names = {p.name for p in snapshot.iterdir()}
    has_weights = any(n.endswith(".safetensors") for n in names)
    if incomplete or "config.json" not in names or not has_weights:
        return CacheState("partial", snapshot, "download incomplete (unfinished blobs or missing files)",
                          commit=commit)
    return CacheState("present", snapshot, "files present, not verified (run `metralectl pull` to verify)",
                      commit=commit)


# --- ownership: the "I once ran sudo metralectl" trap (SPEC §5) ---------------------------------------
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
        return (f"{self.count} path{'s' if self.count != 1 else ''} in your Hugging Face cache "
                f"belong{'s' if self.count == 1 else ''} to {', '.join(owners)}, not to you: {sample}{more}")


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
    """Paths of the cache (the hub dir, HF_HOME, the repo's tree, its locks) not owned by `uid`.

    A root-owned file or directory there (a past `sudo` download) makes the next unprivileged
    download or cleanup fail half-way with a bare PermissionError; finding it first lets us say why.
    """
    uid = os.geteuid() if uid is None else uid
    hub = hub or paths.hf_hub_cache()
    home = paths.hf_home()
    tops = [p for p in (home, hub) if p.exists() and (p == hub or hub.is_relative_to(home))]
    trees: list[Path] = []
    if repo is not None:
        folder = repo_dir(repo, hub).name
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
