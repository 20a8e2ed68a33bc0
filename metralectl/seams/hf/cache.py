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
for those files only, never for the whole snapshot (gguf.py judges it; state.py picks).

The cache is an `ownedfs.Owned` (docs/staging.md, "What is trusted"): every read here walks from the
hub folder without following a link out of it (a snapshot entry is followed to its blob only while it
stays inside), reads are capped, and every name read back from a file (a manifest, huggingface_hub's
trees/*.json, refs/main) passes the same grammar as a name from the Hub before it is used; a file that
fails is ignored, as if it were not there.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metralectl import paths, wording
from metralectl.core.progress import human_bytes
from metralectl.errors import MetralError
from metralectl.names import is_valid
from metralectl.ownedfs import OutsideOwned, Owned
from metralectl.seams.hf.listing import Listing, RepoFile, make_listing, repo_file


VERIFIED_MANIFEST = ".metralectl-verified.json"
EXPECTED_LISTING = ".metralectl-expected.json"
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
ATTEMPT_PART = re.compile(r"[A-Za-z0-9_-]{1,128}")  # each part of `<etag>.<random>.incomplete` read back
MAX_JSON_BYTES = 64 << 20  # a listing or manifest read back (100k files fit)
MAX_REF_BYTES = 256  # refs/main: a commit and a newline
WHAT = "the Hugging Face cache"
PARTIAL_DIR = ".metralectl-partial"  # resumable downloads of a repository (partials.py)


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


# --- where -----------------------------------------------------------------------------------------------
def owned(hub: Path | None = None) -> Owned:
    """The hub folder as the one directory these modules change (and read) anything in."""
    return Owned(hub or paths.hf_hub_cache(), WHAT)


def owned_of(base: Path) -> Owned:
    """The cache holding a repository folder (`<hub>/models--ORG--NAME`)."""
    return owned(base.parent)


def owned_of_snapshot(snapshot: Path) -> Owned:
    """The cache holding a snapshot (`<hub>/models--ORG--NAME/snapshots/<commit>`)."""
    return owned(snapshot.parent.parent.parent)


def folder_name(repo: str) -> str:
    """`models--ORG--NAME`: one path component whatever the repo says (paths.hf_repo_folder)."""
    return paths.hf_repo_folder(repo)


def repo_of_folder(name: str) -> str:
    org, sep, rest = name[len("models--"):].partition("--")
    return f"{org}/{rest}" if name.startswith("models--") and sep else name[len("models--"):]


def repo_dir(repo: str, hub: Path | None = None) -> Path:
    return (hub or paths.hf_hub_cache()) / folder_name(repo)


def snapshot_path(repo: str, commit: str, hub: Path | None = None) -> Path:
    return repo_dir(repo, hub) / "snapshots" / commit


def link_note(cache: Owned, rel: Path | str) -> str:
    return (f"{paths.display(cache.path(rel))} is a symbolic link (or leads through one); metralectl does not "
            f"follow links in {WHAT}: left alone")


# --- reading (never through a link that leaves the cache) -------------------------------------------------
def lstat(cache: Owned, rel: Path | str) -> os.stat_result | None:
    """The entry itself, or None when missing or reached only through a link."""
    try:
        return cache.lstat(rel)
    except (OSError, OutsideOwned):
        return None


def is_dir(cache: Owned, rel: Path | str) -> bool:
    st = lstat(cache, rel)
    return st is not None and stat.S_ISDIR(st.st_mode)


def is_link(cache: Owned, rel: Path | str) -> bool:
    st = lstat(cache, rel)
    return st is not None and stat.S_ISLNK(st.st_mode)


def listdir(cache: Owned, rel: Path | str) -> list[str]:
    try:
        return cache.listdir(rel)
    except (OSError, OutsideOwned):
        return []


def read_json(path: Path, cache: Owned | None = None) -> object:
    """The file's JSON value (callers check its shape), or None when it is missing, not JSON, larger than
    MAX_JSON_BYTES, not a regular file, or reached through a link."""
    cache = cache or Owned(path.parent, WHAT)
    try:
        return json.loads(cache.read_bytes(path, MAX_JSON_BYTES))
    except (OSError, ValueError, MetralError):
        return None


def put_json(cache: Owned, rel: Path | str, data: Any) -> None:
    """`data` as JSON, replaced atomically: a reader sees the old file or the whole new one."""
    cache.put(rel, json.dumps(data, indent=1))


def write_json_atomic(path: Path, data: Any) -> None:
    """put_json for a file named by its path (its folder taken as the owned directory)."""
    put_json(Owned(path.parent, WHAT), path.name, data)


def read_ref(cache: Owned, base: Path, name: str = "main") -> str | None:
    """The commit refs/<name> holds (one trailing newline or space allowed), None unless it is a commit."""
    try:
        text = cache.read_bytes(base / "refs" / name, MAX_REF_BYTES).decode("ascii").strip()
    except (OSError, UnicodeDecodeError, MetralError):
        return None
    return text if is_valid("commit", text) else None


def find_snapshot(base: Path, revision: str | None) -> Path | None:
    """The pinned commit's snapshot; unpinned: the one refs/main names, else the newest. Only folders count (a
    snapshot that is a link is none), named by a commit or at least by a plain file name."""
    cache = owned_of(base)
    snapshots = base / "snapshots"
    if revision:
        return snapshots / revision if is_valid("commit", revision) and is_dir(cache, snapshots / revision) else None
    commit = read_ref(cache, base)
    if commit and is_dir(cache, snapshots / commit):
        return snapshots / commit
    found = []
    for name in listdir(cache, snapshots):  # huggingface_hub names them by commit; others' tools may not
        st = lstat(cache, snapshots / name)
        if is_valid("file name", name) and not name.startswith(".") and st is not None and stat.S_ISDIR(st.st_mode):
            found.append((st.st_mtime, name))
    return snapshots / max(found)[1] if found else None


def read_manifest(snapshot: Path) -> Listing | None:
    """The listing a verified pull of the WHOLE snapshot recorded, if it is readable and for this very commit
    (a GGUF pull's manifest, with `subsets`, vouches for some files only: gguf.py reads it)."""
    data = read_json(snapshot / VERIFIED_MANIFEST, owned_of_snapshot(snapshot))
    if isinstance(data, dict) and "subsets" in data:
        return None
    listing = Listing.from_json(data)
    return listing if listing is not None and listing.commit == snapshot.name else None


def read_expected(snapshot: Path) -> Listing | None:
    """The repo's listing at this commit, from metralectl's own record or huggingface_hub's tree cache."""
    cache = owned_of_snapshot(snapshot)
    listing = Listing.from_json(read_json(snapshot / EXPECTED_LISTING, cache))
    if listing is not None and listing.commit == snapshot.name:
        return listing
    base = snapshot.parent.parent
    tree = read_json(base / "trees" / f"{snapshot.name}.json", cache)  # huggingface_hub >= 1.x
    source = "huggingface_hub's tree cache"
    try:
        assert isinstance(tree, dict)
        # judged by sizes only: a hash that is not one is dropped, never used as a name
        files = [repo_file(p, e["size"], _valid("sha256", e.get("lfs_sha256")), _valid("git oid", e.get("blob_id")),
                           source, need_hash=False) for p, e in tree["files"].items()]
        return make_listing(repo_of_folder(base.name), snapshot.name, files, source)
    except (AssertionError, KeyError, TypeError, AttributeError, MetralError):
        return None


def _valid(kind: str, value: object) -> str | None:
    return value if isinstance(value, str) and is_valid(kind, value) else None


def file_ok(snapshot: Path, spec: RepoFile, cache: Owned | None = None, under: str | None = None) -> bool:
    """Present with the listed size: a regular file, or a link followed to its blob while it stays inside
    the cache (one leaving it, or ending at a device or FIFO, is not the file). `under`: the snapshot's
    path in the cache, when the caller has it (`list` asks for every file of every snapshot)."""
    cache = cache or owned_of_snapshot(snapshot)
    try:
        st = cache.stat_inside(f"{under}/{spec.path}" if under is not None else snapshot / spec.path)
    except (OSError, MetralError):
        return False
    return st is not None and stat.S_ISREG(st.st_mode) and st.st_size == spec.size


def under_cache(cache: Owned, snapshot: Path) -> str | None:
    try:
        return "/".join(cache.parts(snapshot))
    except MetralError:
        return None


def blob_ok(cache: Owned, base: Path, spec: RepoFile) -> bool:
    st = lstat(cache, base / "blobs" / spec.etag) if spec.etag else None
    return st is not None and stat.S_ISREG(st.st_mode) and st.st_size == spec.size


def missing(base: Path, commit: str, listing: Listing) -> list[RepoFile]:
    """Files that would still have to be fetched: neither in the snapshot nor as a finished blob."""
    cache = owned_of(base)
    snapshot = base / "snapshots" / commit
    return [spec for spec in listing.files if not file_ok(snapshot, spec, cache) and not blob_ok(cache, base, spec)]


def incomplete_blobs(base: Path) -> list[Path]:
    return [base / "blobs" / n for n in listdir(owned_of(base), base / "blobs") if n.endswith(".incomplete")]


def attempt_etag(path: Path) -> str | None:
    """The etag of a per-attempt download `<etag>.<random>.incomplete` (its lock's name), when the name is one."""
    parts = path.name.split(".")
    ok = len(parts) == 3 and all(ATTEMPT_PART.fullmatch(p) for p in parts[:2])
    return parts[0] if ok else None


def stale_incomplete(base: Path, idle_s: float = 120.0) -> list[Path]:
    """Leftovers of a killed download: `.incomplete` blobs nobody has written to for idle_s.

    huggingface_hub >= 1.x writes each download to a fresh `<etag>.<random>.incomplete` (and so does
    `metralectl pull` for its small files) and cannot resume one left by a dead process, so these only
    take disk space.
    """
    cache = owned_of(base)
    now = time.time()
    out = []
    for path in incomplete_blobs(base):
        st = lstat(cache, path)
        if st is not None and stat.S_ISREG(st.st_mode) and now - st.st_mtime > idle_s:
            out.append(path)
    return out


def parts_waiting(base: Path) -> bool:
    """Whether a repository folder holds partial downloads (one directory listing: cheap enough for `list`)."""
    return any(n.endswith(".part") for n in listdir(owned_of(base), base / PARTIAL_DIR))


def _judge(listing: Listing, snapshot: Path, cache: Owned) -> tuple[int, int]:
    under = under_cache(cache, snapshot)
    present = [f for f in listing.files if file_ok(snapshot, f, cache, under)]
    return len(present), sum(f.size for f in present)


def _counted(status: str, snapshot: Path, detail: str, listing: Listing, count: int, size: int) -> CacheState:
    return CacheState(status, snapshot, detail, snapshot.name, len(listing.files), count, listing.total_bytes, size)


def folder_state(base: Path) -> CacheState | None:
    """absent, said, when the repository folder is missing or a link (never followed); None when it is a folder."""
    cache = owned_of(base)
    st = lstat(cache, base)
    if st is not None and stat.S_ISDIR(st.st_mode):
        return None
    if st is not None and stat.S_ISLNK(st.st_mode):
        return CacheState("absent", None, f"{paths.display(base)} is a symbolic link: metralectl does not follow "
                          f"links in {WHAT} (point HF_HUB_CACHE at the other disk instead)")
    return CacheState("absent", None, f"{paths.display(base)} does not exist")


def cache_state(repo: str, revision: str | None = None, hub: Path | None = None) -> CacheState:
    """The whole snapshot's state (a safetensors checkpoint). Callers holding a checkpoint use
    state.checkpoint_state."""
    base = repo_dir(repo, hub)
    cache = owned_of(base)
    absent = folder_state(base)
    if absent is not None:
        return absent
    snapshot = find_snapshot(base, revision)
    incomplete = bool(incomplete_blobs(base)) or parts_waiting(base)
    if snapshot is None:
        status = "partial" if incomplete else "absent"
        return CacheState(status, None, f"no snapshot{' for ' + revision if revision else ''} yet")
    commit = snapshot.name
    verified = read_manifest(snapshot)
    if verified is not None:
        count, size = _judge(verified, snapshot, cache)
        if count == len(verified.files):
            return _counted("complete", snapshot, f"verified by metralectl pull: {wording.count(count, 'file')}, "
                            f"{human_bytes(size)} at {commit[:12]}", verified, count, size)
        return _counted("partial", snapshot, f"{len(verified.files) - count} of {wording.count(len(verified.files), 'file')} "
                        "missing or changed since they were verified", verified, count, size)
    expected = read_expected(snapshot)
    if expected is not None:
        count, size = _judge(expected, snapshot, cache)
        if count == len(expected.files):
            return _counted("present", snapshot, f"{'all ' if count > 1 else ''}{wording.count(count, 'file')} present, not verified "
                            "(`metralectl pull` verifies them)", expected, count, size)
        return _counted("partial", snapshot, f"{count} of {wording.count(len(expected.files), 'file')}, {human_bytes(size)} of "
                        f"{human_bytes(expected.total_bytes)} downloaded", expected, count, size)
    names = set(listdir(cache, snapshot))
    has_weights = any(n.endswith(".safetensors") for n in names)
    if incomplete or "config.json" not in names or not has_weights:
        return CacheState("partial", snapshot, "download incomplete (unfinished blobs or missing files)",
                          commit=commit)
    return CacheState("present", snapshot, "files present, not verified (run `metralectl pull` to verify)",
                      commit=commit)
