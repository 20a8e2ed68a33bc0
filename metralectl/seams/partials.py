"""Resumable downloads on disk: the part files `metralectl pull` keeps across runs — filesystem only.

A large LFS file is downloaded (by resume.py) into its repository folder, beside huggingface_hub's own:
  <hub>/models--ORG--NAME/.metralectl-partial/<sha256>.part   the bytes so far, appended in order
  <hub>/models--ORG--NAME/.metralectl-partial/<sha256>.json   which file it is: repo, path, size, sha256,
                                                                commit, and the server's validator (ETag)
Inside the repository folder, so the finished file is renamed (atomically, same filesystem) into blobs/,
`rm` of a safetensors checkpoint takes its partials with the folder, and huggingface_hub's cache scan
stays quiet (it warns about an unknown folder at the top of the hub, not about one inside a repository's).
The folder is 0700 and the files 0600 until the verified file is placed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from metralectl.atomicfile import write_atomic

PARTIAL_DIR = ".metralectl-partial"


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


def read(part: Path) -> Partial | None:
    """The partial a `.part` file is, from its sidecar; None when either is missing or unreadable."""
    meta = part.with_suffix(".json")
    try:
        data = json.loads(meta.read_text())
        have = part.stat().st_size
        return Partial(part, meta, str(data["repo"]), str(data["path"]), str(data["sha256"]), int(data["size"]),
                       have, data.get("validator"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_meta(partial: Partial, commit: str) -> None:
    data = {"repo": partial.repo, "path": partial.path, "sha256": partial.sha256, "size": partial.size,
            "commit": commit, "validator": partial.validator}
    write_atomic(partial.meta, json.dumps(data), mode=0o600)


def orphans(base: Path) -> list[Path]:
    """Files in the partial folder that belong to no readable partial (a sidecar without its part, say)."""
    known = {p for item in listed(base) for p in item.files}
    try:
        return sorted(p for p in folder(base).iterdir() if p.is_file() and p not in known)
    except OSError:
        return []


def listed(base: Path) -> list[Partial]:
    """Every readable partial download of a repository folder."""
    try:
        parts = sorted(folder(base).glob("*.part"))
    except OSError:
        return []
    return [p for p in (read(part) for part in parts) if p is not None]


def any_in(base: Path) -> bool:
    """Whether a repository folder holds partial downloads (one directory listing: cheap enough for `list`)."""
    try:
        return any(name.endswith(".part") for name in os.listdir(folder(base)))
    except OSError:
        return False


def discard(partial: Partial) -> None:
    for path in partial.files:
        path.unlink(missing_ok=True)
