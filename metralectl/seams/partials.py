"""Resumable downloads on disk: the part files `metralectl pull` keeps across runs — filesystem only.

A large LFS file is downloaded (by resume.py) into its repository folder, beside huggingface_hub's own:
  <hub>/models--ORG--NAME/.metralectl-partial/<sha256>.part   the bytes so far, appended in order
  <hub>/models--ORG--NAME/.metralectl-partial/<sha256>.json   which file it is: repo, path, size, sha256,
                                                                commit, and the server's validator (ETag)
Inside the repository folder, so the finished file is renamed (atomically, same filesystem) into blobs/,
`rm` of a safetensors checkpoint takes its partials with the folder, and huggingface_hub's cache scan
stays quiet (it warns about an unknown folder at the top of the hub, not about one inside a repository's).
The folder is 0700 and the files 0600 until the verified file is placed.

Everything here goes through the cache's `Owned` (hfcache.owned_of): a part, a sidecar or the folder that
is a symlink is never opened, written or followed; a sidecar is read capped, and its names (repo, path,
sha256, validator) pass their grammars or the sidecar is no partial (an orphan `prune` may remove).
"""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass
from pathlib import Path

from metralectl.errors import MetralError
from metralectl.names import is_valid
from metralectl.ownedfs import OutsideOwned
from metralectl.seams import hfcache

PARTIAL_DIR = hfcache.PARTIAL_DIR
MAX_VALIDATOR = 256  # an ETag sent back as If-Range: printable ASCII, no more


@dataclass(frozen=True)
class Partial:
    part: Path
    meta: Path
    repo: str
    path: str  # the file's path in the repository
    sha256: str
    size: int  # the whole file, as the Hub lists it
    have: int  # bytes on disk so far
    validator: str | None = None  # the ETag that served the bytes so far (sent as If-Range)

    @property
    def files(self) -> list[Path]:
        return [self.part, self.meta]


def folder(base: Path) -> Path:
    """The partial-download folder of a repository folder (`models--ORG--NAME`)."""
    return base / PARTIAL_DIR


def header_safe(value: object) -> str | None:
    """`value` when it can be sent as a header value as it is (printable ASCII, capped), else None."""
    if isinstance(value, str) and 0 < len(value) <= MAX_VALIDATOR and value.isascii() and value.isprintable():
        return value
    return None


def read(part: Path) -> Partial | None:
    """The partial a `.part` file is, from its sidecar; None when either is missing, unreadable, not a regular
    file (a link is not followed), or names something that fails its grammar."""
    base = part.parent.parent
    cache = hfcache.owned_of(base)
    sha = part.name[: -len(".part")] if part.name.endswith(".part") else ""
    if not is_valid("sha256", sha):
        return None
    meta = part.with_suffix(".json")
    data = hfcache.read_json(meta, cache)
    st = hfcache.lstat(cache, part)
    if not isinstance(data, dict) or st is None or not stat.S_ISREG(st.st_mode):
        return None
    try:
        spec = hfcache.repo_file(data["path"], data["size"], data["sha256"], None, "a partial download's sidecar")
        repo = data["repo"]
        if spec.sha256 != sha or not is_valid("repo", repo):
            return None
    except (KeyError, MetralError):
        return None
    return Partial(part, meta, repo, spec.path, sha, spec.size, st.st_size, header_safe(data.get("validator")))


def write_meta(partial: Partial, commit: str) -> None:
    data = {"repo": partial.repo, "path": partial.path, "sha256": partial.sha256, "size": partial.size,
            "commit": commit, "validator": header_safe(partial.validator)}
    cache = hfcache.owned_of(partial.part.parent.parent)
    cache.put(partial.meta, json.dumps(data), mode=0o600)


def entries(base: Path) -> list[tuple[str, bool]]:
    """(name, is a regular file) of everything in the partial folder (empty when missing or a link)."""
    cache = hfcache.owned_of(base)
    out = []
    for name in hfcache.listdir(cache, folder(base)):
        st = hfcache.lstat(cache, folder(base) / name)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            out.append((name, stat.S_ISREG(st.st_mode)))
    return out


def orphans(base: Path) -> list[Path]:
    """Entries of the partial folder that belong to no readable partial (a sidecar without its part, a link
    someone left: removing one removes the entry, never what a link points to)."""
    known = {p for item in listed(base) for p in item.files}
    return sorted(p for p in (folder(base) / name for name, _ in entries(base)) if p not in known)


def listed(base: Path) -> list[Partial]:
    """Every readable partial download of a repository folder."""
    parts = sorted(folder(base) / name for name, regular in entries(base) if regular and name.endswith(".part"))
    return [p for p in (read(part) for part in parts) if p is not None]


def any_in(base: Path) -> bool:
    """Whether a repository folder holds partial downloads (one directory listing: cheap enough for `list`)."""
    return hfcache.parts_waiting(base)


def discard(partial: Partial) -> None:
    cache = hfcache.owned_of(partial.part.parent.parent)
    for path in partial.files:
        try:
            cache.remove_file(path)
        except (OSError, OutsideOwned):
            pass
