"""A GGUF quant: which files of a GGUF repository it needs (llama.cpp's `-hf REPO:QUANT` rule, restated), and
those files in the local HF cache, judged as llama-server will read them — filesystem only.

A GGUF repository holds many quants (10-70 GB each); a recipe serves one. `llama-server -hf REPO:QUANT
--offline` lists every file under the snapshot refs/ names and takes, in listing order, the first
model .gguf whose repo path holds QUANT followed by `.` or `-` (case-insensitive), skipping parts 2..n
of a split, then every part that shares its prefix and part count (llama.cpp common/download.cpp:
find_best_model, get_gguf_split_info, get_split_files; common/hf-cache.cpp: get_cached_ref). So the
files a quant needs are its model file or all parts of its split, nothing else:

  - sidecars (`mmproj`, `imatrix`, `mtp-`, `eagle3-`, `dflash-`, `dspark-` in the file name) are not
    model files; llama-server loads an mmproj found in the cache, so pulling one would add vision
    input no recipe asked for;
  - a root `preset.ini` turns llama-server into a router serving that preset instead of the quant, so
    pulling it would change what is served; README/config files are read by nobody.

In the cache, "complete" means every file the recipe's quant needs (select) was verified by `metralectl
pull`, whatever else is there or not. The snapshot's verified manifest (cache.VERIFIED_MANIFEST) carries
`files` (every file verified at this commit, for any quant) and `subsets` (quant, upper-cased -> the paths
it needs); each pull adds its quant (`record`, under the pull's lock, written atomically). A manifest
without `subsets` vouches for every file of the repository. llama-server decides two more things by itself
(common/hf-cache.cpp): the snapshot (refs/main, else the first valid ref) and, among the cached files, the
first one whose name matches; `serving_problem` says when either would not be what was verified.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metralectl import paths, wording
from metralectl.core.progress import human_bytes
from metralectl.errors import ExitCode, MetralError
from metralectl.names import is_valid
from metralectl.safetext import clean
from metralectl.seams.hf import cache as hfcache
from metralectl.seams.hf.cache import (CacheState, VERIFIED_MANIFEST, file_ok, find_snapshot, folder_state,
                                       incomplete_blobs, read_expected, read_json, repo_dir)
from metralectl.seams.hf.hub import WeightsError
from metralectl.seams.hf.listing import Listing, RepoFile


SIDECARS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")  # llama.cpp: gguf_filename_is_model
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
_PREFIXED = ("UD",)  # Unsloth's dynamic quants: recipes (and the engine's quant list) name them UD-Q4_K_XL


@dataclass(frozen=True)
class SplitInfo:
    prefix: str  # the path without `.gguf` and without `-NNNNN-of-NNNNN`, directories included
    tag: str  # llama.cpp's quant tag: the last `-`/`.` separated word of the prefix, upper-cased
    index: int
    count: int


def split_info(path: str) -> SplitInfo | None:
    """llama.cpp's reading of a .gguf path (None for any other file)."""
    if not path.endswith(".gguf"):
        return None
    prefix, index, count = path[: -len(".gguf")], 1, 1
    split = _SPLIT.match(prefix)
    if split:
        prefix, index, count = split.group(1), int(split.group(2)), int(split.group(3))
    tag = _TAG.search(prefix)
    return SplitInfo(prefix, tag.group(1).upper() if tag else "", index, count)


def is_model_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return path.endswith(".gguf") and not any(word in name for word in SIDECARS)


def matches(path: str, quant: str) -> bool:
    """The file `-hf REPO:QUANT` would consider: a model .gguf whose path holds QUANT then `.` or `-`."""
    return is_model_file(path) and re.search(re.escape(quant) + r"[.-]", path, re.IGNORECASE) is not None


def quant_label(info: SplitInfo) -> str:
    """The quant a file is of, as a recipe names it: llama.cpp's tag, with a `UD-` prefix kept."""
    head = info.prefix[: len(info.prefix) - len(info.tag)].upper()
    for word in _PREFIXED:
        if head.endswith(f"{word}-") and (len(head) == len(word) + 1 or head[-len(word) - 2] in "-./"):
            return f"{word}-{info.tag}"
    return info.tag


@dataclass(frozen=True)
class Model:
    """One model file, or one split of several parts: what llama-server would load as a whole."""

    prefix: str
    count: int
    label: str
    parts: tuple[RepoFile, ...]  # as listed, by part number; fewer than `count` when parts are missing

    @property
    def first(self) -> str:
        return self.parts[0].path

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.parts)

    @property
    def complete(self) -> bool:
        return len(self.parts) == self.count

    def describe(self) -> str:
        parts = f"{self.count} parts, " if self.count > 1 else ""
        return f"{self.label} ({parts}{human_bytes(self.total_bytes)})"


def models(files: Iterable[RepoFile]) -> list[Model]:
    """Every model llama.cpp could pick from `files`: groups by (prefix, count) whose first part exists."""
    groups: dict[tuple[str, int], list[tuple[int, RepoFile]]] = {}
    for f in files:
        info = split_info(f.path)
        if info is None or not is_model_file(f.path):
            continue
        groups.setdefault((info.prefix, info.count), []).append((info.index, f))
    out = []
    for (prefix, count), members in groups.items():
        members.sort(key=lambda m: m[0])
        if members[0][0] != 1:
            continue  # llama.cpp starts from part 1; parts without it are never loaded
        info = split_info(members[0][1].path)
        assert info is not None
        unique = {index: f for index, f in members if 1 <= index <= count}
        out.append(Model(prefix, count, quant_label(info), tuple(unique[i] for i in sorted(unique))))
    return sorted(out, key=lambda m: (m.label, m.prefix))


def available(files: Iterable[RepoFile]) -> str:
    """The quants a listing holds, for a message: `BF16 (3 parts, 69.4 GB), Q4_K_M (21.0 GB)`."""
    found = models(files)
    return ", ".join(m.describe() for m in found) if found else "no model .gguf file at all"


def select(repo: str, commit: str, files: Sequence[RepoFile], quant: str) -> Model:
    """The model (with every part) `-hf REPO:QUANT` needs from this listing, or a WeightsError that says why."""
    where = f"{repo}@{commit[:12]}"
    candidates = [m for m in models(files) if matches(m.first, quant)]
    if len(candidates) > 1:  # an exact name wins (Q4_K_M over UD-Q4_K_M); llama.cpp itself takes the first listed
        exact = [m for m in candidates if m.label.upper() == quant.upper()]
        candidates = exact if len(exact) == 1 else candidates
    if not candidates:
        raise WeightsError(
            f"{where} has no .gguf file for quant {quant}: no model file's name holds `{quant}.` or `{quant}-`; "
            f"the repository has: {available(files)}",
            "set `checkpoint.quant:` in the recipe to one of those (`metralectl show RECIPE` names the recipe file)",
            exit_code=ExitCode.DATA)
    if len(candidates) > 1:
        names = ", ".join(m.first for m in candidates)
        raise WeightsError(
            f"quant {quant} is ambiguous in {where}: it names {len(candidates)} models ({names}); "
            f"llama-server -hf {repo}:{quant} would load whichever its cache lists first",
            "name a quant that only one of them holds (e.g. with its `UD-` prefix)", exit_code=ExitCode.DATA)
    model = candidates[0]
    if not model.complete:
        have = ", ".join(f.path for f in model.parts)
        raise WeightsError(f"{where} lists only {len(model.parts)} of the {model.count} parts of {model.prefix} "
                           f"({have}); llama-server cannot load an incomplete split",
                           "the repository is being uploaded or is broken: pin an earlier commit (checkpoint.revision)")
    return model


def rivals(paths: Iterable[str], quant: str, chosen: Iterable[str]) -> list[str]:
    """Files besides `chosen` that llama-server could pick for QUANT (first parts and single files)."""
    mine = set(chosen)
    out = []
    for path in paths:
        info = split_info(path)
        if path in mine or info is None or info.index != 1 or not matches(path, quant):
            continue
        out.append(path)
    return sorted(out)


@dataclass(frozen=True)
class Verified:
    """What a snapshot's verified manifest vouches for."""

    files: dict[str, RepoFile]
    subsets: dict[str, tuple[str, ...]] | None  # None: a whole-snapshot manifest (every listed file verified)


def subset_key(quant: str) -> str:
    return quant.upper()  # llama.cpp matches the quant case-insensitively


def read_verified(snapshot: Path) -> Verified | None:
    data = read_json(snapshot / VERIFIED_MANIFEST, hfcache.owned_of_snapshot(snapshot))
    listing = Listing.from_json(data)
    if listing is None or listing.commit != snapshot.name or not isinstance(data, dict):
        return None
    files = {f.path: f for f in listing.files}
    raw = data.get("subsets")
    if raw is None:
        return Verified(files, None)
    if not isinstance(raw, dict):
        return None
    subsets: dict[str, tuple[str, ...]] = {}
    for quant, members in raw.items():
        if is_valid("quant", quant) and isinstance(members, list) and members and all(isinstance(p, str) and p in files for p in members):
            subsets[subset_key(str(quant))] = tuple(members)  # an entry naming unverified files vouches for nothing
    return Verified(files, subsets)


def needed_from(verified: Verified, repo: str, commit: str, quant: str) -> tuple[RepoFile, ...] | None:
    """The quant's files as the manifest recorded them; None when it vouches for no such quant."""
    if verified.subsets is None:
        try:
            return select(repo, commit, list(verified.files.values()), quant).parts
        except WeightsError:
            return None
    members = verified.subsets.get(subset_key(quant))
    return tuple(verified.files[p] for p in members) if members is not None else None


def _ok(snapshot: Path, spec: RepoFile) -> bool:
    cache = hfcache.owned_of_snapshot(snapshot)
    return file_ok(snapshot, spec, cache, hfcache.under_cache(cache, snapshot))


def _counted(status: str, snapshot: Path, detail: str, need: tuple[RepoFile, ...]) -> CacheState:
    present = [f for f in need if _ok(snapshot, f)]
    return CacheState(status, snapshot, detail, snapshot.name, len(need), len(present),
                      sum(f.size for f in need), sum(f.size for f in present), tuple(f.path for f in need))


def _present(snapshot: Path, need: tuple[RepoFile, ...]) -> int:
    return sum(1 for f in need if _ok(snapshot, f))


def _downloading(base: Path, need: tuple[RepoFile, ...]) -> bool:
    etags = {f.etag for f in need if f.etag}
    return any(p.name.split(".", 1)[0] in etags for p in incomplete_blobs(base))


def quant_state(repo: str, revision: str | None, quant: str, hub: Path | None = None) -> CacheState:
    """complete: every file of the quant verified; present: all there, not verified; partial: some;
    absent: none (other quants of the repository may be complete)."""
    base = repo_dir(repo, hub)
    absent = folder_state(base)
    if absent is not None:
        return absent
    snapshot = find_snapshot(base, revision)
    if snapshot is None:
        return CacheState("absent", None, f"no snapshot{' for ' + revision if revision else ''} yet")
    commit = snapshot.name
    verified = read_verified(snapshot)
    need = needed_from(verified, repo, commit, quant) if verified is not None else None
    if need is not None:
        count = _present(snapshot, need)
        if count == len(need):
            return _counted("complete", snapshot, f"verified by metralectl pull: {quant}, "
                            f"{wording.count(count, 'file')}, {human_bytes(sum(f.size for f in need))} at {commit[:12]}",
                            need)
        return _counted("partial", snapshot, f"{len(need) - count} of {wording.count(len(need), 'file')} of {quant} missing or "
                        "changed since they were verified", need)
    expected = read_expected(snapshot)
    if expected is not None:
        try:
            need = select(repo, commit, expected.files, quant).parts
        except WeightsError as exc:
            return CacheState("absent", snapshot, exc.message, commit)
        return _judged(base, snapshot, quant, need)
    return _unlisted(snapshot, quant)


def _judged(base: Path, snapshot: Path, quant: str, need: tuple[RepoFile, ...]) -> CacheState:
    count = _present(snapshot, need)
    total = human_bytes(sum(f.size for f in need))
    if count == len(need):
        return _counted("present", snapshot, f"{'all ' if count > 1 else ''}{wording.count(count, 'file')} of {quant} present, not verified "
                        "(`metralectl pull` verifies them)", need)
    if count or _downloading(base, need):
        return _counted("partial", snapshot, f"{count} of {wording.count(len(need), 'file')} of {quant} ({total}) downloaded", need)
    return _counted("absent", snapshot, f"no file of {quant} ({wording.count(len(need), 'file')}, {total}) in the cache yet", need)


def local_files(snapshot: Path) -> list[RepoFile]:
    """The snapshot's files as llama-server lists them (symlinks into blobs/ included), with their sizes; a link
    that leaves the cache (or ends at no regular file) is listed with the size -1, never followed."""
    cache = hfcache.owned_of_snapshot(snapshot)
    out = []
    todo = [""]
    while todo:
        folder = todo.pop()
        for name in hfcache.listdir(cache, snapshot / folder if folder else snapshot):
            rel = f"{folder}/{name}" if folder else name
            st = hfcache.lstat(cache, snapshot / rel)
            if st is None:
                continue
            if stat.S_ISDIR(st.st_mode):
                todo.append(rel)
                continue
            try:
                found = cache.stat_inside(snapshot / rel) if stat.S_ISLNK(st.st_mode) else st
            except (OSError, MetralError):
                found = None
            regular = found is not None and stat.S_ISREG(found.st_mode)
            out.append(RepoFile(rel, found.st_size if found is not None and regular else -1))
    return sorted(out, key=lambda f: f.path)


def _unlisted(snapshot: Path, quant: str) -> CacheState:
    """No listing (a cache filled by other tools): judge by the names on disk, as llama-server would."""
    found = [m for m in models(local_files(snapshot)) if matches(m.first, quant)]
    if not found:
        return CacheState("absent", snapshot, f"no .gguf file for {quant} in {paths.display(snapshot)}",
                          snapshot.name)
    model = found[0]
    if model.complete and all(f.size >= 0 for f in model.parts):
        return CacheState("present", snapshot, f"{model.first} present, not verified (`metralectl pull` verifies it)",
                          snapshot.name, paths=tuple(f.path for f in model.parts))
    return CacheState("partial", snapshot, f"{len(model.parts)} of {model.count} parts of {model.prefix} present",
                      snapshot.name, paths=tuple(f.path for f in model.parts))


# --- what a pull writes --------------------------------------------------------------------------------------
def record(snapshot: Path, listing: Listing, quant: str, model: Model, stamp: dict[str, Any]) -> None:
    """Add the quant's verified files to the snapshot's manifest, keeping everything it vouched for before.
    The caller holds the repository's pull lock, so nobody else writes it meanwhile; the write is atomic."""
    before = read_verified(snapshot)
    files = dict(before.files) if before is not None else {}
    subsets = dict(before.subsets or {}) if before is not None else {}
    if before is not None and before.subsets is None:  # a whole-snapshot manifest: every model in it was verified
        for found in models(before.files.values()):
            if found.complete:
                subsets[subset_key(found.label)] = tuple(f.path for f in found.parts)
    for spec in model.parts:
        files[spec.path] = spec
    old = before.files if before is not None else {}
    for key, members in list(subsets.items()):  # an entry whose file was re-listed differently no longer holds
        if any(files[p] != old.get(p) for p in members):
            del subsets[key]
    subsets[subset_key(quant)] = tuple(f.path for f in model.parts)
    merged = Listing(listing.repo, listing.commit, tuple(sorted(files.values(), key=lambda f: f.path)))
    data = {**merged.to_json(), "subsets": {k: list(v) for k, v in sorted(subsets.items())}, **stamp}
    hfcache.put_json(hfcache.owned_of_snapshot(snapshot), snapshot / VERIFIED_MANIFEST, data)


def trusted(snapshot: Path, wanted: tuple[RepoFile, ...]) -> set[str]:
    """The wanted files a manifest already vouches for, with the same content, still in place."""
    verified = read_verified(snapshot)
    if verified is None:
        return set()
    return {f.path for f in wanted if verified.files.get(f.path) == f and file_ok(snapshot, f)}


def recorded(snapshot: Path, quant: str, wanted: tuple[RepoFile, ...]) -> bool:
    """The manifest already vouches for exactly these files as the quant's."""
    verified = read_verified(snapshot)
    if verified is None:
        return False
    return needed_from(verified, snapshot.parent.parent.name, snapshot.name, quant) == wanted


# --- what llama-server will read -----------------------------------------------------------------------------
def served_commit(base: Path) -> str | None:
    """The snapshot `-hf` reads: refs/main, else the first valid ref in directory order (hf-cache.cpp). Refs
    are read capped, never through a link, and only a well-formed commit counts."""
    cache = hfcache.owned_of(base)
    fallback = None
    for name in hfcache.listdir(cache, base / "refs"):
        commit = hfcache.read_ref(cache, base, name)
        if commit is None:
            continue
        if name == "main":
            return commit
        fallback = fallback or commit
    return fallback


def serving_problem(repo: str, quant: str, state: CacheState) -> tuple[str, str] | None:
    """(message, hint) when llama-server would not load the verified files of a complete quant."""
    if state.snapshot is None:
        return None
    base, commit = state.snapshot.parent.parent, state.snapshot.name
    served = served_commit(base)
    if served != commit:
        now = f"refs/main names {served[:12]}" if served else "no ref names any snapshot"
        return (f"llama-server would not read the verified snapshot of {repo} ({commit[:12]}): `-hf` takes no "
                f"revision and reads the snapshot refs/ names, and {now}",
                f"`metralectl pull` of the recipe unpinned moves refs/main to the newest commit; to serve a pinned "
                f"commit, point refs/main at it: echo {commit} > {paths.display(base / 'refs' / 'main')}")
    others = rivals((f.path for f in local_files(state.snapshot)), quant, state.paths)
    if others:
        return (f"llama-server -hf {repo}:{quant} could load {', '.join(clean(o, 200) for o in others)} instead of the verified "
                f"{state.paths[0] if state.paths else 'file'}: it takes the first file whose name holds "
                f"`{quant}.` or `{quant}-`, in the order the cache lists them",
                f"remove the other file from {paths.display(state.snapshot)}, or serve a quant only one file matches")
    return None
