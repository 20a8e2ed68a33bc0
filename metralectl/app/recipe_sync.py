"""`metralectl recipes sync`: fetch an engine release's recipes, verify, convert, install atomically.

Order: fetch every asset and its .sha256 into memory; verify each digest, index.json's `assets` and
every recipe against index.json (any disagreement refuses the whole release); convert each recipe
(recipe_import) against the release's own serve-options.json; write the set into a staging directory
beside the installed one; then swap the `current` symlink with one rename. A failure or an interrupt
before the swap removes the staging directory and leaves the previous set exactly as it was. A recipe
that does not convert (executable keys, an unknown flag, a refused value) is reported with its file and
line and left out; the rest are installed, and the sync exits non-zero so scripts notice.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metralectl.core import release_archive as ra
from metralectl.core import serve_options, synced_set
from metralectl.errors import Problem
from metralectl.core.recipe_import import ImportContext, Imported, UpstreamFile, convert

if TYPE_CHECKING:
    from metralectl.core.catalog import Catalog
    from metralectl.seams.sync_fetch import Progress, Source

ENGINE_REPO = "Metrale/metrale-inference"


@dataclass
class Change:
    name: str
    id: str  # the engine's recipe id
    status: str  # added | changed | removed | unchanged | refused
    problems: list[Problem] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "id": self.id, "status": self.status,
                "problems": [p.__dict__ for p in self.problems]}


@dataclass
class SyncReport:
    release: str
    commit: str
    engine_version: str
    source: str
    revision: str
    installed: str
    changes: list[Change]

    def count(self, status: str) -> int:
        return sum(1 for c in self.changes if c.status == status)

    @property
    def refused(self) -> list[Change]:
        return [c for c in self.changes if c.status == "refused"]

    def to_json(self) -> dict[str, Any]:
        return {"release": self.release, "commit": self.commit, "engine_version": self.engine_version,
                "source": self.source, "revision": self.revision, "installed": self.installed,
                "changes": [c.to_json() for c in self.changes],
                "counts": {s: self.count(s) for s in ("added", "changed", "removed", "unchanged", "refused")}}


def _fetch(source: Source, progress: Progress | None) -> tuple[dict[str, bytes], dict[str, str]]:
    data, digests = {}, {}
    for name in ra.ASSETS:
        data[name] = source.read(name, ra.LIMITS[name], progress)
        sidecar = source.read(f"{name}.sha256", ra.SIDECAR_LIMIT, progress)
        digests[name] = ra.verify(name, data[name], sidecar)
    return data, digests


def _previous(root: Path) -> dict[str, dict[str, Any]]:
    current = synced_set.current(root)
    meta = synced_set.read_meta(current) if current is not None else None
    return {r["name"]: r for r in (meta or {}).get("recipes", [])}


def sync(catalog: Catalog, source: Source, *, root: Path | None = None, progress: Progress | None = None,
         today: str | None = None) -> SyncReport:
    """Verify and install one release's recipes; raises ReleaseError (nothing installed) on any
    verification failure."""
    root = root or synced_set.synced_dir()
    data, digests = _fetch(source, progress)
    index = ra.parse_index(data["index.json"])
    ra.check_assets(index, digests)
    try:
        options = serve_options.parse(data["serve-options.json"], "serve-options.json")
    except serve_options.ServeOptionsError as exc:
        raise ra.ReleaseError(str(exc)) from None
    texts = ra.read_recipes(data["recipes.tar.gz"], index)
    for entry in index.recipes:
        why = ra.check_recipe(entry, texts.get(entry.id), index)
        if why:
            raise ra.ReleaseError(why, "the archive and index.json disagree: nothing was installed")
    label = ra.release_label(index, source.location)
    contract = catalog.engines["metrale"]
    revision = synced_set.revision_for(contract, label, index.commit, options, source.location)
    contract.revisions.setdefault(revision.id, revision)
    for name, spec in revision.specs.items():
        contract.flags.setdefault(name, spec)
    taken = today or _dt.date.today().isoformat()
    ctx = ImportContext(catalog, revision, ENGINE_REPO, index.commit, label, taken)
    converted: list[tuple[ra.IndexEntry, Imported]] = []
    for entry in sorted(index.recipes, key=lambda e: e.id):
        upstream = UpstreamFile(entry.id, entry.path, texts[entry.id], entry.sha256)
        converted.append((entry, convert(upstream, replace(ctx, display=f"{label}:{entry.path}"))))
    return _install(root, source, index, digests, label, revision.id, converted, data["serve-options.json"])


def _install(root: Path, source: Source, index: ra.ReleaseIndex, digests: dict[str, str], label: str,
             revision: str, converted: list[tuple[ra.IndexEntry, Imported]], dump: bytes) -> SyncReport:
    previous = _previous(root)
    (root / "sets").mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".staging-*"):
        shutil.rmtree(stale, ignore_errors=True)  # an earlier sync that was killed
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    final = root / "sets" / f"{label}-{digests['index.json'][:12]}-{uuid.uuid4().hex[:6]}"
    link = root / f".current-{uuid.uuid4().hex[:6]}"
    changes: list[Change] = []
    installed: list[dict[str, Any]] = []
    try:
        (staging / "recipes").mkdir()
        seen: set[str] = set()
        for entry, result in converted:
            name = result.name or entry.id
            if result.ok and name in seen:
                result.problems.append(Problem(f"{label}:{entry.path}", 0, 0, "", f"a second recipe named {name!r}"))
            if not result.ok or name in seen:
                changes.append(Change(name, entry.id, "refused", [p for p in result.problems if p.severity == "error"]
                                      or result.problems))
                continue
            seen.add(name)
            header = (f"# Synced from engine release {label} ({entry.path}, sha256 {entry.sha256}).\n"
                      "# Written by `metralectl recipes sync`; the next sync replaces it.\n")
            text = result.text(header)
            (staging / "recipes" / f"{name}.yaml").write_text(text)
            digest = ra.sha256_bytes(text.encode())
            old = previous.get(name)
            status = "added" if old is None else ("unchanged" if old.get("ours_sha256") == digest else "changed")
            changes.append(Change(name, entry.id, status))
            installed.append({"name": name, "id": entry.id, "path": entry.path, "sha256": entry.sha256,
                              "ours_sha256": digest, "pinned_defaults": result.pinned_defaults})
        changes += [Change(name, str(old.get("id", "")), "removed") for name, old in sorted(previous.items())
                    if name not in seen]
        (staging / "serve-options.json").write_bytes(dump)
        meta = {"format": synced_set.FORMAT, "release": label, "commit": index.commit, "revision": revision,
                "engine_version": index.engine_version, "source": source.location, "digests": digests,
                "fetched_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "recipes": installed}
        (staging / "release.json").write_text(json.dumps(meta, indent=2) + "\n")
        os.rename(staging, final)
        os.symlink(os.path.relpath(final, root), link)
        os.replace(link, root / "current")  # the one step that switches sets
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if not (root / "current").exists() or os.path.realpath(root / "current") != os.path.realpath(final):
            shutil.rmtree(final, ignore_errors=True)
        if link.is_symlink():
            link.unlink()
        raise
    for other in (root / "sets").iterdir():
        if other.resolve() != final.resolve():
            shutil.rmtree(other, ignore_errors=True)
    order = {"added": 0, "changed": 1, "removed": 2, "refused": 3, "unchanged": 4}
    changes.sort(key=lambda c: (order[c.status], c.name))
    return SyncReport(label, index.commit, index.engine_version, source.location, revision, str(final), changes)
