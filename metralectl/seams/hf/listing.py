"""A repository's file listing at a commit, and the rules every listing passes before any name in it is used.

A listing comes from outside: a Hub or mirror (weights.hub_listing), or a file read back from the cache
(our manifests, huggingface_hub's trees/*.json, a partial download's sidecar). Whatever its source, each
path passes its "repo path" grammar (names.check), each hash its own ("sha256", "git oid"), the repo and the commit
theirs, every size is an int from 0 to MAX_FILE_BYTES, no path comes twice or is both a file and a folder,
and there are at most MAX_FILES files. A listing from the Hub that fails is refused (exit 65, nothing
written); a file read back that fails is ignored, as if it were not there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from metralectl.errors import ExitCode, MetralError
from metralectl.names import check
from metralectl.safetext import clean
from metralectl.seams.hf.hub import WeightsError


MANIFEST_SCHEMA = 1
MAX_FILES = 100_000  # files in one listing: the largest Hub repositories hold a few thousand
MAX_FILE_BYTES = 1 << 42  # 4 TiB: a listed size beyond it is a lie, not a model file


class ListingRefused(WeightsError):
    """A listing (from the Hub or read back) that cannot be a repository's: refused, nothing written."""

    exit_code = ExitCode.DATA


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


def repo_file(path: object, size: object, sha256: object, git_oid: object, source: str,
              need_hash: bool = True) -> RepoFile:
    """One listed file with every name checked (names.check) and a sane size; else UnsafeName /
    ListingRefused (exit 65). `need_hash=False`: a listing only judged by sizes (`list`), not downloaded."""
    name = check("repo path", path, source)
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_FILE_BYTES:
        raise ListingRefused(f"{source} listed {_shown(name)} with the size {_shown(repr(size))}: not a size "
                             f"from 0 to {MAX_FILE_BYTES} bytes; nothing was written", _FIX)
    sha = check("sha256", sha256, source) if sha256 is not None else None
    oid = check("git oid", git_oid, source) if git_oid is not None else None
    if sha is None and oid is None and need_hash:
        raise ListingRefused(f"{source} listed {_shown(name)} without a sha256 or a git blob id: it could be "
                             "neither named in the cache nor verified; nothing was written", _FIX)
    return RepoFile(name, size, sha, oid)


def make_listing(repo: object, commit: object, files: Sequence[RepoFile], source: str) -> Listing:
    """A listing whose repo and commit are well-formed, with at most MAX_FILES files, no path twice and no
    path that is both a file and a folder; else UnsafeName / ListingRefused (exit 65)."""
    name = check("repo", repo, source)
    sha = check("commit", commit, source)
    if len(files) > MAX_FILES:
        raise ListingRefused(f"{source} listed {len(files)} files for {name}: more than {MAX_FILES}; "
                             "nothing was written", _FIX)
    seen: set[str] = set()
    folders: set[str] = set()
    for f in files:
        if f.path in seen:
            raise ListingRefused(f"{source} listed {_shown(f.path)} twice for {name}; nothing was written", _FIX)
        seen.add(f.path)
        parts = f.path.split("/")
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
    both = sorted(seen & folders)
    if both:
        raise ListingRefused(f"{source} listed {_shown(both[0])} both as a file and as a folder for {name}; "
                             "nothing was written", _FIX)
    return Listing(name, sha, tuple(sorted(files, key=lambda f: f.path)))


_FIX = ("a Hub or mirror that sends such a listing is broken or hostile: check HF_ENDPOINT "
        "(unset it for https://huggingface.co)")


def _shown(text: str) -> str:
    return repr(clean(text, 120))


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
    def from_json(cls, data: Any, source: str = "a manifest in the cache") -> Listing | None:
        """The listing a file recorded, every name checked as a listing from the Hub is; None when it is
        not one (unreadable, or a name that fails its grammar: such a file vouches for nothing)."""
        try:
            files = [repo_file(f["path"], f["size"], f.get("sha256"), f.get("git_oid"), source)
                     for f in data["files"]]
            return make_listing(data["repo"], data["commit"], files, source)
        except (KeyError, TypeError, AttributeError, MetralError):
            return None
