"""An engine release's recipe assets, verified: index.json, recipes.tar.gz, serve-options.json.

Each asset comes with a `<name>.sha256` sidecar in sha256sum format (`<64 hex>  <name>`); index.json
also lists the archives' digests (`assets:`) and every recipe's own path, sha256 and size. All of it
must agree, or the release is refused as a whole. Every name in it (recipe ids, paths, the commit,
asset and member names) passes its grammar (names.check) before any use. The archive is read in memory
as a stream, member by member, through a decompressor that counts what it produces: the whole archive, its
headers and the members index.json does not list included, may unpack to at most MAX_UNPACKED bytes in
at most MAX_MEMBERS entries, checked while it is read (a gzip bomb stops at the cap). Regular files and
directories only, under well-formed relative names.
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
import zlib
from dataclasses import dataclass, field
from typing import Any

from metralectl import names
from metralectl.core.bounded_gzip import BoundedGunzip, TooLarge, Truncated
from metralectl.errors import ExitCode, MetralError
from metralectl.safetext import clean

ASSETS = ("index.json", "recipes.tar.gz", "serve-options.json")
LIMITS = {"index.json": 64 << 20, "recipes.tar.gz": 64 << 20, "serve-options.json": 16 << 20}
SIDECAR_LIMIT = 4096
MAX_MEMBER = 1 << 20  # one recipe file
MAX_MEMBERS = 4096  # entries of any kind in the archive (directories and unlisted files count)
MAX_UNPACKED = 64 << 20  # everything the archive decompresses to: headers, listed and unlisted members
SIGNATURE_SUFFIXES = (".sig", ".asc", ".minisig", ".sigstore", ".bundle", ".pem")
_SIDECAR_RE = re.compile(r"([0-9a-f]{64}) [ *](\S+)")
_LABEL_RE = re.compile(r"b[0-9]{1,9}")


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
    match = _SIDECAR_RE.fullmatch(lines[0].strip()) if len(lines) == 1 else None
    if match is None:
        raise ReleaseError(f"{asset}.sha256 is not one sha256sum line (`<64 hex>  {asset}`)",
                           "the release's sidecar is malformed; it is refused rather than trusted")
    named = names.check("asset name", match.group(2), f"{asset}.sha256")
    if named != asset:
        raise ReleaseError(f"{asset}.sha256 names {clean(named)!r}, not {asset}")
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
    """index.json, every name in it checked against its grammar (metralectl.names) before anything uses it."""
    try:
        top = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ReleaseError(f"index.json is not JSON: {clean(str(exc), 200)}") from None
    if not isinstance(top, dict) or top.get("schema_version") != 1:
        stated = top.get("schema_version") if isinstance(top, dict) else None
        raise ReleaseError(f"index.json has schema_version {clean(repr(stated), 40)}; this metralectl reads 1")
    if not isinstance(top.get("commit"), str):
        raise ReleaseError("index.json names no 40-character engine `commit`")
    commit = names.check("commit", top["commit"], "index.json `commit`")
    assets = top.get("assets")
    if not isinstance(assets, dict):
        raise ReleaseError("index.json has no `assets` mapping of file name to sha256")
    for name, digest in assets.items():
        names.check("asset name", name, "index.json `assets`")
        names.check("sha256", digest, f"index.json `assets` ({clean(name)})")
    entries = []
    raw_recipes = top.get("recipes") or []
    if not isinstance(raw_recipes, list) or len(raw_recipes) > MAX_MEMBERS:
        raise ReleaseError(f"index.json `recipes` is not a list of at most {MAX_MEMBERS} recipes")
    for i, raw in enumerate(raw_recipes):
        if not isinstance(raw, dict):
            raise ReleaseError(f"index.json recipes[{i}] is not an object")
        size = raw.get("bytes")
        if not (isinstance(size, int) and not isinstance(size, bool) and 0 <= size <= MAX_MEMBER):
            raise ReleaseError(f"index.json recipes[{i}] needs id, path, sha256 and bytes (at most {MAX_MEMBER})")
        where = f"index.json recipes[{i}]"
        entries.append(IndexEntry(names.check("recipe id", raw.get("id"), f"{where} `id`"),
                                  names.check("release path", raw.get("path"), f"{where} `path`"),
                                  names.check("sha256", raw.get("sha256"), f"{where} `sha256`"), size))
    files = top.get("files", {})
    if not isinstance(files, dict):
        raise ReleaseError("index.json `files` is not a mapping of recipe id to text")
    for rid, text in files.items():
        names.check("recipe id", rid, "index.json `files`")
        if not isinstance(text, str):
            raise ReleaseError(f"index.json `files` gives {clean(rid)} no text")
    release = top.get("release")
    if release is not None:
        release = names.check("version", release, "index.json `release`")
    version = top.get("engine_version")
    version = "" if version in (None, "") else names.check("version", version, "index.json `engine_version`")
    return ReleaseIndex(commit, version, dict(assets), entries, dict(files), release)


def check_assets(index: ReleaseIndex, digests: dict[str, str]) -> None:
    """index.json's `assets` must name the archives we verified, and no signature we cannot check."""
    signed = sorted(n for n in index.assets if n.endswith(SIGNATURE_SUFFIXES))
    if signed:
        raise ReleaseError(f"the release is signed ({', '.join(clean(n) for n in signed)}); metralectl cannot verify "
                           "that signature, so it refuses the release rather than ignore the signature")
    for name in ("recipes.tar.gz", "serve-options.json"):
        stated = index.assets.get(name)
        if stated != digests[name]:
            raise ReleaseError(f"index.json lists {name} with sha256 {clean(str(stated))}, the verified file has "
                               f"{digests[name]}",
                               "the assets come from different releases; nothing was installed")


def _member_name(member: tarfile.TarInfo) -> str | None:
    """The member's path with a leading `./` dropped (None: the archive's own `.` entry), checked as a
    release path: no absolute name, no `..`, no control or hidden characters, nothing but [A-Za-z0-9._-]."""
    name = member.name.removeprefix("./")
    if member.isdir() and name in ("", "."):
        return None
    return names.check("release path", name, "recipes.tar.gz")


def read_recipes(archive: bytes, index: ReleaseIndex) -> dict[str, bytes]:
    """recipe id -> its bytes, each checked against index.json. Read as a stream through BoundedGunzip:
    the whole archive may unpack to MAX_UNPACKED bytes in MAX_MEMBERS entries (a member declaring more
    than what is left is refused at its header, before a byte of it is decompressed). A member that is
    not a plain file or directory refuses the release; a file index.json does not list is skipped (and
    counted)."""
    wanted = {e.path: e for e in index.recipes}
    wanted.update({e.path.removeprefix("recipes/"): e for e in index.recipes})
    found: dict[str, bytes] = {}
    stream = BoundedGunzip(archive, MAX_UNPACKED)
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
            for count, member in enumerate(tar, 1):
                if count > MAX_MEMBERS:
                    raise ReleaseError(f"recipes.tar.gz holds more than {MAX_MEMBERS} entries",
                                       "an engine release's archive holds a few dozen recipes; this one is refused")
                name = _member_name(member)
                if member.size > MAX_UNPACKED - stream.produced:
                    raise ReleaseError(f"recipes.tar.gz: {clean(member.name, 120)} declares {member.size} bytes; the "
                                       f"whole archive may unpack to at most {MAX_UNPACKED >> 20} MB")
                if member.isdir():
                    continue
                if not member.isreg() or member.issparse():
                    raise ReleaseError(f"recipes.tar.gz holds {clean(member.name, 120)!r}, which is not a plain file "
                                       "(links, devices, FIFOs and sparse files are refused)")
                entry = wanted.get(name) if name is not None else None
                if entry is None:
                    continue  # skipped: tarfile reads past it through the bounded stream
                if member.size > MAX_MEMBER:
                    raise ReleaseError(f"{clean(member.name, 120)} is {member.size} bytes; a recipe is at most "
                                       f"{MAX_MEMBER}")
                if entry.id in found:
                    raise ReleaseError(f"recipes.tar.gz holds {clean(entry.path)} twice")
                handle = tar.extractfile(member)
                found[entry.id] = handle.read(MAX_MEMBER + 1) if handle is not None else b""
    except TooLarge:
        raise ReleaseError(f"recipes.tar.gz unpacks to more than {MAX_UNPACKED >> 20} MB; it was not unpacked further",
                           "an engine release's archive is a few hundred KB; this one is refused") from None
    except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error, Truncated) as exc:
        raise ReleaseError(f"recipes.tar.gz is not a readable gzip tar archive: {clean(str(exc), 200)}") from None
    return found


def check_recipe(entry: IndexEntry, data: bytes | None, index: ReleaseIndex) -> str | None:
    """Why one recipe's bytes do not match what index.json says of it (None: they do)."""
    path = clean(entry.path)
    if data is None:
        return f"{path} is listed in index.json but missing from recipes.tar.gz"
    if len(data) != entry.bytes or sha256_bytes(data) != entry.sha256:
        return (f"{path} in recipes.tar.gz has sha256 {sha256_bytes(data)} ({len(data)} bytes); index.json "
                f"says {entry.sha256} ({entry.bytes} bytes)")
    text = index.files.get(entry.id)
    if text is not None and text.encode("utf-8", "surrogatepass") != data:
        return f"index.json's copy of {clean(entry.id)} differs from the archive's {path}"
    return None


def release_label(index: ReleaseIndex, source: str) -> str:
    """bNN when the index or the source says it (…/download/b35/), else the commit's first 7."""
    if index.release and _LABEL_RE.fullmatch(index.release):
        return index.release
    found = [part for part in source.rstrip("/").split("/") if _LABEL_RE.fullmatch(part)]
    return found[-1] if found else index.commit[:7]


def to_json(index: ReleaseIndex) -> dict[str, Any]:
    return {"commit": index.commit, "engine_version": index.engine_version, "assets": index.assets}
