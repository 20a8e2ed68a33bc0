"""The local Hugging Face cache as the engine will look in it — read with the filesystem only.

Layout: <hub>/models--ORG--NAME/{refs/<branch>, snapshots/<commit>/..., blobs/<sha>[.incomplete]}.
A download verified by `metralectl pull` leaves a manifest in the snapshot; without it a present
snapshot is only "present" (unverified), never "complete".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from metralectl import paths

VERIFIED_MANIFEST = ".metralectl-verified.json"


@dataclass(frozen=True)
class CacheState:
    status: str  # "complete" | "present" | "partial" | "absent"
    snapshot: Path | None
    detail: str


def repo_dir(repo: str, hub: Path | None = None) -> Path:
    return (hub or paths.hf_hub_cache()) / ("models--" + repo.replace("/", "--"))


def _snapshot(base: Path, revision: str | None) -> Path | None:
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


def cache_state(repo: str, revision: str | None = None, hub: Path | None = None) -> CacheState:
    base = repo_dir(repo, hub)
    if not base.is_dir():
        return CacheState("absent", None, f"{paths.display(base)} does not exist")
    snapshot = _snapshot(base, revision)
    try:
        incomplete = any(p.name.endswith(".incomplete") for p in (base / "blobs").iterdir())
    except OSError:
        incomplete = False
    if snapshot is None:
        status = "partial" if incomplete else "absent"
        return CacheState(status, None, f"no snapshot{' for ' + revision if revision else ''} yet")
    if (snapshot / VERIFIED_MANIFEST).is_file() and not incomplete:
        return CacheState("complete", snapshot, "verified by metralectl pull")
    names = {p.name for p in snapshot.iterdir()}
    has_weights = any(n.endswith(".safetensors") for n in names)
    if incomplete or "config.json" not in names or not has_weights:
        return CacheState("partial", snapshot, "download incomplete (unfinished blobs or missing files)")
    return CacheState("present", snapshot, "files present, not verified (run `metralectl pull` to verify)")
