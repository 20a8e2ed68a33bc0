"""The synced recipe set on disk, and loading it into the catalog.

Layout under <config>/synced/:
    current -> sets/<release>-<index sha256 prefix>-<nonce>   (a symlink, swapped atomically)
    sets/<...>/release.json          where it came from, what was verified, each recipe's provenance
    sets/<...>/serve-options.json    that release's own flag surface (its recipes are checked against it)
    sets/<...>/recipes/<name>.yaml   our recipe documents, converted by recipe_import
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metralectl import paths
from metralectl.ownedfs import Owned, OutsideOwned

from metralectl.core import serve_options
from metralectl.core.engine_revisions import Revision, synced_revision
from metralectl.errors import Problem

if TYPE_CHECKING:
    from metralectl.core.catalog import Catalog
    from metralectl.core.contract import EngineContract

FORMAT = 1
WHAT = "the synced recipe set"
META_LIMIT = 16 << 20  # release.json: a few KB per recipe


def synced_dir() -> Path:
    return paths.user_data_dir("synced")


def current(root: Path | None = None) -> Path | None:
    """The installed set: where `current` leads, when that is a directory directly under sets/ holding a
    regular release.json. A `current` that leads anywhere else (out of the synced dir, through a link on
    the way) is no set: None, and nothing there is read."""
    synced = Owned(root or synced_dir(), WHAT)
    try:
        parts = synced.resolve("current")
        if parts is None or len(parts) != 2 or parts[0] != "sets":
            return None
        meta = synced.lstat(f"{parts[0]}/{parts[1]}/release.json")
    except (OSError, OutsideOwned):
        return None
    return synced.path("/".join(parts)) if meta is not None and stat.S_ISREG(meta.st_mode) else None


def stray_current(root: Path | None = None) -> bool:
    """Whether a `current` entry is there but leads to no set under sets/ (a link planted or broken)."""
    synced = Owned(root or synced_dir(), WHAT)
    return synced.lstat("current") is not None and current(root) is None


def read_meta(set_dir: Path) -> dict[str, Any] | None:
    """The set's release.json (at most META_LIMIT bytes, a regular file, no link followed)."""
    try:
        synced = Owned(set_dir, WHAT)
        meta = json.loads(synced.read_bytes("release.json", META_LIMIT))
    except (OSError, ValueError, RecursionError, OutsideOwned):
        return None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("recipes"), list):
        return None
    return meta if all(isinstance(meta.get(key), str) for key in ("release", "commit", "source")) else None


def revision_for(contract: EngineContract, label: str, commit: str, options: serve_options.ServeOptions,
                 source: str) -> Revision:
    """The shipped revision when the release's dump is one we pin; else one built from its own dump,
    with the policy of a shipped revision at the same commit if there is one."""
    for rev in contract.revisions.values():
        if rev.sha256 == options.sha256 and ((rev.serve_options and not rev.synced) or rev.release == label):
            return rev  # a pinned dump, or this release already loaded from the installed set
    rev_id = label if label not in contract.revisions else f"{label}-{options.sha256[:8]}"
    rev = synced_revision(contract, rev_id, commit, label, options, source)
    same_commit = next((r for r in contract.revisions.values() if r.commit == commit and not r.synced), None)
    if same_commit is not None:
        from dataclasses import replace

        rev = replace(rev, policy=same_commit.policy)
    return rev


def load_into(catalog: Catalog, root: Path | None = None) -> None:
    """Add the current synced set to the catalog: its revision, then its recipes (a refused one is reported
    and left out, like a user recipe)."""
    from metralectl.core.catalog import Refused, _load, _yaml_files
    from metralectl.core.recipe import RecipeOrigin
    from metralectl.core.yamlsrc import YamlSyntax

    set_dir = current(root)
    if set_dir is None:
        if stray_current(root):
            where = str((root or synced_dir()) / "current")
            catalog.refused.append(Refused(where, [Problem(
                where, 0, 0, "", "the synced set's `current` does not lead to a set under sets/; not loaded",
                "run `metralectl recipes sync` again (it replaces the link)")]))
        return
    meta = read_meta(set_dir)
    from metralectl.core.engines.registry import the_builtin  # a synced set exists: its engine's contract

    contract = catalog.engines.get(the_builtin("publishes_recipe_sets"))
    if meta is None or contract is None:
        catalog.refused.append(Refused(str(set_dir / "release.json"), [Problem(
            str(set_dir / "release.json"), 0, 0, "", "the synced set's release.json is unreadable",
            "run `metralectl recipes sync` again")]))
        return
    try:
        options = serve_options.load(set_dir / "serve-options.json")
    except serve_options.ServeOptionsError as exc:
        catalog.refused.append(Refused(str(set_dir / "serve-options.json"), [Problem(
            str(set_dir / "serve-options.json"), 0, 0, "", str(exc), "run `metralectl recipes sync` again")]))
        return
    revision = revision_for(contract, str(meta["release"]), str(meta["commit"]), options, str(meta["source"]))
    contract.revisions.setdefault(revision.id, revision)
    for name, spec in revision.specs.items():
        contract.flags.setdefault(name, spec)
    for path in _yaml_files(set_dir / "recipes"):
        try:
            doc = _load(path)
        except YamlSyntax as exc:
            catalog.refused.append(Refused(str(path), [exc.problem]))
            continue
        name = str(doc.data.get("name")) if isinstance(doc.data, dict) else ""
        shipped = catalog.recipes.get(name)
        origin = RecipeOrigin("synced", str(path), overrides=shipped.origin.path if shipped else None,
                              release=str(meta["release"]))
        recipe, problems = catalog.check_document(doc, origin)
        if recipe is None:
            catalog.refused.append(Refused(str(path), problems))
            continue
        catalog.recipes[recipe.name] = recipe
        catalog.documents[recipe.name] = doc
