"""An engine release's recipe assets, verified: index.json, recipes.tar.gz, serve-options.json.

Each asset comes with a `<name>.sha256` sidecar in sha256sum format (`<64 hex>  <name>`); index.json
also lists the archives' digests (`assets:`) and every recipe's own path, sha256 and size. All of it
must agree, or the release is refused as a whole. The archive is read in memory, member by member:
regular files only, no absolute or `..` paths, bounded sizes (a tar bomb is refused, not unpacked).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metralectl.errors import ExitCode, MetralError
from metralectl.safetext import clean

ASSETS = ("index.json", "recipes.tar.gz", "serve-options.json")
LIMITS = {"index.json": 64 << 20, "recipes.tar.gz": 64 << 20, "serve-options.json": 16 << 20}
SIDECAR_LIMIT = 4096
MAX_MEMBER = 1 << 20  # one recipe file
MAX_MEMBERS = 4096
MAX_UNPACKED = 64 << 20
SIGNATURE_SUFFIXES = (".sig", ".asc", ".minisig", ".sigstore", ".bundle", ".pem")
_SIDECAR_RE = re.compile(r"^([0-9a-f]{64}) [ *](\S+)$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")


class ReleaseError(MetralError):
    """The release failed verification: nothing of it is installed."""

    exit_code = ExitCode.DATA


@dataclass(frozen=True)
class IndexEntry:
    id: str  # family/name
    path: str  # e.g. recipes/qwen3.5/qwen3.5-35b-a3b-nvfp4.yaml
    sha256: str
    bytes: int


@dataclass
class ReleaseIndex:
    commit: str
    engine_version: str
    assets: dict[str, str]
    recipes: list[IndexEntry]
    files: dict[str, str] = field(default_factory=dict)
    release: str | None = None  # bNN when the index says so


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parse_sidecar(text: bytes, asset: str) -> str:
    """The digest a `<asset>.sha256` sidecar states (sha256sum format, bare file name)."""
    try:
        lines = [ln for ln in text.decode("ascii").splitlines() if ln.strip()]
    except UnicodeDecodeError:
        raise ReleaseError(f"{asset}.sha256 is not a sha256sum line (not ASCII)") from None
    match = _SIDECAR_RE.match(lines[0].strip()) if len(lines) == 1 else None
    if match is None:
        raise ReleaseError(f"{asset}.sha256 is not one sha256sum line (`<64 hex>  {asset}`)",
                           "the release's sidecar is malformed; it is refused rather than trusted")
    if match.group(2) != asset:
        raise ReleaseError(f"{asset}.sha256 names {clean(match.group(2))!r}, not {asset}")
    return match.group(1)


def verify(name: str, data: bytes, sidecar: bytes) -> str:
    digest = sha256_bytes(data)
    stated = parse_sidecar(sidecar, name)
    if digest != stated:
        raise ReleaseError(f"{name} has sha256 {digest}, but {name}.sha256 says {stated}",
                           "the download is damaged or was altered: nothing was installed; try again, "
                           "or check the source")
    return digest


def parse_index(data: bytes) -> ReleaseIndex:
    try:
        top = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ReleaseError(f"index.json is not JSON: {exc}") from None
    if not isinstance(top, dict) or top.get("schema_version") != 1:
        raise ReleaseError(f"index.json has schema_version {top.get('schema_version') if isinstance(top, dict) else None!r}; "
                           "this metralectl reads 1")
    commit = top.get("commit")
    if not isinstance(commit, str) or not _COMMIT_RE.match(commit):
        raise ReleaseError("index.json names no 40-character engine `commit`")
    assets = top.get("assets")
    if not isinstance(assets, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in assets.items()):
        raise ReleaseError("index.json has no `assets` mapping of file name to sha256")
    entries = []
    for i, raw in enumerate(top.get("recipes") or []):
        if not isinstance(raw, dict):
            raise ReleaseError(f"index.json recipes[{i}] is not an object")
        rid, path, sha, size = raw.get("id"), raw.get("path"), raw.get("sha256"), raw.get("bytes")
        if not (isinstance(rid, str) and isinstance(path, str) and isinstance(sha, str) and _SHA_RE.match(sha)
                and isinstance(size, int) and not isinstance(size, bool) and size >= 0):
            raise ReleaseError(f"index.json recipes[{i}] needs id, path, sha256 and bytes")
        entries.append(IndexEntry(rid, path, sha, size))
    files: dict[str, Any] = top["files"] if isinstance(top.get("files"), dict) else {}
    release = top.get("release") if isinstance(top.get("release"), str) else None
    return ReleaseIndex(commit, str(top.get("engine_version", "")), dict(assets), entries,
                        {str(k): str(v) for k, v in files.items()}, release)


def check_assets(index: ReleaseIndex, digests: dict[str, str]) -> None:
    """index.json's `assets` must name the archives we verified, and no signature we cannot check."""
    signed = sorted(n for n in index.assets if n.endswith(SIGNATURE_SUFFIXES))
    if signed:
        raise ReleaseError(f"the release is signed ({', '.join(clean(n) for n in signed)}); metralectl cannot verify "
                           "that signature, so it refuses the release rather than ignore the signature")
    for name in ("recipes.tar.gz", "serve-options.json"):
        stated = index.assets.get(name)
        if stated != digests[name]:
            raise ReleaseError(f"index.json lists {name} with sha256 {stated}, the verified file has {digests[name]}",
                               "the assets come from different releases; nothing was installed")


def _normal(name: str) -> str:
    return name[2:] if name.startswith("./") else name


def read_recipes(archive: bytes, index: ReleaseIndex) -> dict[str, bytes]:
    """recipe id -> its bytes, each checked against index.json. A member that is not a plain file inside
    the archive refuses the release; a recipe file index.json does not list is ignored."""
    wanted = {e.path: e for e in index.recipes}
    wanted.update({e.path.removeprefix("recipes/"): e for e in index.recipes})
    found: dict[str, bytes] = {}
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            for count, member in enumerate(tar, 1):
                name = _normal(member.name)
                if count > MAX_MEMBERS:
                    raise ReleaseError(f"recipes.tar.gz holds more than {MAX_MEMBERS} entries")
                if name.startswith("/") or ".." in Path(name).parts:
                    raise ReleaseError(f"recipes.tar.gz holds a path outside the archive: {clean(member.name)!r}")
                if member.isdir():
                    continue
                if not member.isreg():
                    raise ReleaseError(f"recipes.tar.gz holds {clean(member.name)!r}, which is not a plain file "
                                       "(links and devices are refused)")
                entry = wanted.get(name)
                if entry is None:
                    continue
                if member.size > MAX_MEMBER:
                    raise ReleaseError(f"{clean(member.name)} is {member.size} bytes; a recipe is at most {MAX_MEMBER}")
                total += member.size
                if total > MAX_UNPACKED:
                    raise ReleaseError(f"recipes.tar.gz unpacks to more than {MAX_UNPACKED >> 20} MB of recipes")
                handle = tar.extractfile(member)
                found[entry.id] = handle.read(MAX_MEMBER + 1) if handle is not None else b""
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise ReleaseError(f"recipes.tar.gz is not a readable gzip tar archive: {exc}") from None
    return found


def check_recipe(entry: IndexEntry, data: bytes | None, index: ReleaseIndex) -> str | None:
    """Why one recipe's bytes do not match what index.json says of it (None: they do)."""
    if data is None:
        return f"{entry.path} is listed in index.json but missing from recipes.tar.gz"
    if len(data) != entry.bytes or sha256_bytes(data) != entry.sha256:
        return (f"{entry.path} in recipes.tar.gz has sha256 {sha256_bytes(data)} ({len(data)} bytes); index.json "
                f"says {entry.sha256} ({entry.bytes} bytes)")
    text = index.files.get(entry.id)
    if text is not None and text.encode() != data:
        return f"index.json's copy of {entry.id} differs from the archive's {entry.path}"
    return None


def release_label(index: ReleaseIndex, source: str) -> str:
    """bNN when the index or the source says it (…/download/b35/), else the commit's first 7."""
    if index.release and re.fullmatch(r"b\d+", index.release):
        return index.release
    found = re.findall(r"(?:^|/)(b\d+)(?:/|$)", source.rstrip("/"))
    return found[-1] if found else index.commit[:7]


def to_json(index: ReleaseIndex) -> dict[str, Any]:
    return {"commit": index.commit, "engine_version": index.engine_version, "assets": index.assets}
