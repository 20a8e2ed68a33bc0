"""`metralectl recipes sync`: fetch an engine release's recipes, verify, convert, install all or nothing.

Order: fetch every asset and its .sha256 into memory; verify each digest, index.json's `assets` and
every recipe against index.json (any disagreement refuses the whole release); convert each recipe
(recipe_import) against the release's own serve-options.json. One recipe that does not convert
(executable keys, an unknown flag, a refused value, a name that is no recipe name or one taken twice)
refuses the release: RecipesRefused lists every refused recipe with its file and line, and nothing on
disk changed. Only `skip_refused` (`--skip-refused`) installs the rest, and the report says so.

Installing (sync_install) writes the set into a staging directory beside the installed one through
ownedfs.Owned rooted at the synced dir, then swaps the `current` symlink in one rename. A failure or
an interrupt before the swap removes what it staged and leaves the previous set byte for byte.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metralectl import names
from metralectl.app import sync_install
from metralectl.core import release_archive as ra
from metralectl.core import serve_options, synced_set
from metralectl.core.engines.registry import the_builtin
from metralectl.core.recipe_import import ImportContext, Imported, UpstreamFile, convert
from metralectl.errors import ExitCode, Problem
from metralectl.safetext import clean

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
    installed: str  # the installed set's directory; "" when nothing was installed
    changes: list[Change]
    warnings: list[str] = field(default_factory=list)  # left alone: a link where a leftover was (said, not followed)

    def count(self, status: str) -> int:
        return sum(1 for c in self.changes if c.status == status)

    @property
    def refused(self) -> list[Change]:
        return [c for c in self.changes if c.status == "refused"]

    def to_json(self) -> dict[str, Any]:
        return {"release": self.release, "commit": self.commit, "engine_version": self.engine_version,
                "source": self.source, "revision": self.revision, "installed": self.installed or None,
                "changes": [c.to_json() for c in self.changes], "warnings": self.warnings,
                "counts": {s: self.count(s) for s in ("added", "changed", "removed", "unchanged", "refused")}}


class RecipesRefused(ra.ReleaseError):
    """One or more of the release's recipes were refused, so the release was: nothing was installed."""

    exit_code = ExitCode.DATA

    def __init__(self, report: SyncReport) -> None:
        count, total = len(report.refused), len(report.changes) - report.count("removed")
        every = count == total
        what = (f"all {total} recipes" if total > 1 else "the one recipe") if every else \
            f"{count} of the {total} recipes"
        super().__init__(
            f"{what} of engine release {report.release} {'was' if count == 1 else 'were'} refused: nothing was "
            "installed; the previous synced set stays",
            "the release has nothing metralectl can install" if every else
            "each refusal is listed above with its file and line; `--skip-refused` installs the others")
        self.report = report


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
    recipes = (meta or {}).get("recipes", [])
    return {str(r["name"]): r for r in recipes if isinstance(r, dict) and "name" in r} \
        if isinstance(recipes, list) else {}


def sync(catalog: Catalog, source: Source, *, root: Path | None = None, progress: Progress | None = None,
         today: str | None = None, skip_refused: bool = False) -> SyncReport:
    """Verify, convert and install one release's recipes. Raises ReleaseError (nothing installed) on any
    verification failure, and RecipesRefused when a recipe is refused (unless skip_refused)."""
    root = root or synced_set.synced_dir()
    data, digests = _fetch(source, progress)
    index = ra.parse_index(data["index.json"])
    ra.check_assets(index, digests)
    try:
        options = serve_options.parse(data["serve-options.json"], "serve-options.json")
    except serve_options.ServeOptionsError as exc:
        raise ra.ReleaseError(clean(str(exc))) from None
    texts = ra.read_recipes(data["recipes.tar.gz"], index)
    for entry in index.recipes:
        why = ra.check_recipe(entry, texts.get(entry.id), index)
        if why:
            raise ra.ReleaseError(why, "the archive and index.json disagree: nothing was installed")
    label = ra.release_label(index, source.location)
    contract = catalog.engines[the_builtin("publishes_recipe_sets")]
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
    plan = _plan(label, converted, _previous(root))
    report = SyncReport(label, index.commit, index.engine_version, source.location, revision.id, "", plan.changes)
    if report.refused and (not skip_refused or not plan.installs):
        raise RecipesRefused(report)
    meta = {"format": synced_set.FORMAT, "release": label, "commit": index.commit, "revision": revision.id,
            "engine_version": index.engine_version, "source": source.location, "digests": digests,
            "fetched_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "recipes": [i.meta for i in plan.installs]}
    files: dict[str, str | bytes] = {f"recipes/{i.name}.yaml": i.text for i in plan.installs}
    files["serve-options.json"] = data["serve-options.json"]
    set_name = f"{label}-{digests['index.json'][:12]}"
    report.installed, report.warnings = sync_install.install(root, set_name, files, meta)
    return report


@dataclass
class _Install:
    name: str
    text: str
    meta: dict[str, Any]


@dataclass
class _Plan:
    changes: list[Change]
    installs: list[_Install]


ORDER = {"added": 0, "changed": 1, "removed": 2, "refused": 3, "unchanged": 4}


def _plan(label: str, converted: list[tuple[ra.IndexEntry, Imported]], previous: dict[str, dict[str, Any]]) -> _Plan:
    """What the release installs, and what it changes against the previous set; every refusal listed."""
    changes: list[Change] = []
    installs: list[_Install] = []
    seen: set[str] = set()
    for entry, result in converted:
        name = result.name or entry.id
        where = f"{label}:{entry.path}"
        if result.ok and not names.is_valid("recipe name", name):
            result.problems.append(Problem(where, 0, 0, "", f"{clean(name)!r} is not a recipe name "
                                                            "(lower-case letters, digits, . _ -)"))
        elif result.ok and name in seen:
            result.problems.append(Problem(where, 0, 0, "", f"a second recipe named {clean(name)!r}",
                                           "two engine recipes make the same recipe name; the release is refused"))
        errors = [p for p in result.problems if p.severity == "error"]
        if not result.ok or errors:
            changes.append(Change(name, entry.id, "refused", errors or result.problems))
            continue
        seen.add(name)
        header = sync_install.comment(f"Synced from engine release {label} ({entry.path}, sha256 {entry.sha256}).") \
            + sync_install.comment("Written by `metralectl recipes sync`; the next sync replaces it.")
        text = result.text(header)
        digest = ra.sha256_bytes(text.encode())
        old = previous.get(name)
        status = "added" if old is None else ("unchanged" if old.get("ours_sha256") == digest else "changed")
        changes.append(Change(name, entry.id, status))
        installs.append(_Install(name, text, {"name": name, "id": entry.id, "path": entry.path, "sha256": entry.sha256,
                                              "ours_sha256": digest, "pinned_defaults": result.pinned_defaults}))
    changes += [Change(name, str(old.get("id", "")), "removed") for name, old in sorted(previous.items())
                if name not in seen]
    changes.sort(key=lambda c: (ORDER[c.status], c.name))
    return _Plan(changes, installs)
