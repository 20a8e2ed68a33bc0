"""What uses weights now, judged from what runs — not only from the catalog — for `rm` and `prune`.

Three witnesses, each enough to keep an item:
  - the machine's lifecycle lock: a `run`, `swap` or `stop` in progress is about to use (or stop using)
    some checkpoint; weights wait until it is done;
  - the containers running on the daemon: a metralectl container's recipe label, with its `--set`
    overrides (the recipe as it was started), names its checkpoint; its argv (`serve ORG/NAME`,
    `-hf ORG/NAME:QUANT`) and its mounts (a path in a repository folder) name it too, for any container.
    A metralectl container whose checkpoint none of these tells (its recipe was deleted or changed while
    it serves, and its argv names nothing) keeps every weight: we cannot tell which it reads;
  - processes of this host (seams/openfiles.py): one that has a file of the item open or mapped.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metralectl.safetext import clean
from metralectl.seams.hf import cache as hfcache

if TYPE_CHECKING:
    from metralectl.app.disk_weights import Removal


@dataclass(frozen=True)
class User:
    why: str  # the item's `blocked`: "container metralectl-x is serving it (`metralectl stop` first)", …
    repo: str | None  # None: cannot tell which weights: every one is kept
    quant: str | None = None  # a GGUF quant (upper-cased); None: the whole repository


def lifecycle_users() -> list[User]:
    from metralectl.seams.store import lock_holder

    holder = lock_holder()
    return [User(f"`{clean(holder, 100)}` is in progress on this machine (it holds the lifecycle lock): weights "
                 "stay until it is done", None)] if holder else []


def _recipe_checkpoint(container: Any, catalog: Any) -> tuple[str, str | None] | None:
    """(repo, GGUF quant or None) of the recipe a metralectl container was started from, with its --set."""
    from metralectl.core.labels import LABEL_RECIPE, LABEL_SETS
    from metralectl.core.overrides import apply_sets

    name = container.labels.get(LABEL_RECIPE, "")
    if name not in catalog.recipes:
        return None
    sets = [s for s in container.labels.get(LABEL_SETS, "").split("\x1f") if s]
    try:
        recipe = apply_sets(catalog, catalog.recipes[name], sets)
    except Exception:  # noqa: BLE001 - a --set the catalog no longer accepts: the recipe cannot say
        return None
    ck = recipe.checkpoint
    return ck.repo, (ck.quant.upper() if ck.format == "gguf" else None)


def named_by(words: tuple[str, ...], mounts: tuple[str, ...], repos: set[str], hub: Path) -> list[tuple[str, str | None]]:
    """The repositories (and GGUF quants) an argv or a mount names, among `repos`."""
    out: list[tuple[str, str | None]] = []
    for repo in repos:
        folder = hfcache.folder_name(repo)
        base = str(hfcache.repo_dir(repo, hub))
        for word in words:
            if word == repo or folder in word.split("/"):
                out.append((repo, None))
            elif word.startswith(repo + ":"):
                out.append((repo, word[len(repo) + 1:].upper() or None))
        if any(m == base or m.startswith(base + "/") for m in mounts):
            out.append((repo, None))
    return out


def container_users(runtime: Any, catalog: Any, repos: set[str], hub: Path) -> list[User]:
    """What the running containers on the daemon use, among `repos`."""
    from metralectl.core.labels import LABEL_MANAGED, LABEL_RECIPE

    out: list[User] = []
    for container in runtime.containers(managed_only=False, all_states=False, mine=False):
        if not container.running:
            continue
        what = f"container {clean(container.name, 80)}"
        found = named_by(tuple(container.command), tuple(container.mounts), repos, hub)
        ours = container.labels.get(LABEL_MANAGED) == "true"
        checkpoint = _recipe_checkpoint(container, catalog) if ours else None
        if checkpoint is not None:
            found.append(checkpoint)
        if ours and not found and checkpoint is None:
            out.append(User(f"{what} serves recipe {clean(container.labels.get(LABEL_RECIPE, '?'), 60)!r}, which the "
                            "catalog no longer holds as it was started, and its command names no repository: "
                            "metralectl cannot tell which weights it reads, so none go (`metralectl stop` it first)",
                            None))
        out.extend(User(f"{what} is serving it (`metralectl stop` first)", repo, quant)
                   for repo, quant in dict.fromkeys(found))
    return out


def _keys(cache: Any, item: Removal) -> set[tuple[int, int]]:
    """(device, inode) of every regular file the item would remove (for a link: the blob it leads to)."""
    from metralectl.app.disk_weights import _walk

    keys: set[tuple[int, int]] = set()
    for path in item.paths:
        st = hfcache.lstat(cache, path)
        if st is None:
            continue
        entries = [(path, st)] + (list(_walk(cache, path)) if stat.S_ISDIR(st.st_mode) else [])
        for _entry, found in entries:
            if stat.S_ISREG(found.st_mode):
                keys.add((found.st_dev, found.st_ino))
    return keys


def process_users(items: list[Removal], hub: Path) -> dict[int, str]:
    """id(item) -> the first process that has one of its files open or mapped."""
    from metralectl.seams import openfiles

    cache = hfcache.owned(hub)
    keyed = {id(item): _keys(cache, item) for item in items}
    found = openfiles.users(k for keys in keyed.values() for k in keys)
    out: dict[int, str] = {}
    for item in items:
        for key in keyed[id(item)]:
            if key in found:
                pid, name = found[key][0]
                out[id(item)] = f"process {pid} ({clean(name, 40)}) has its files open or mapped (stop it first)"
                break
    return out


def block(items: list[Removal], users: list[User], hub: Path) -> None:
    """Mark every weights/quant item a user uses as blocked, saying who."""
    weights = [i for i in items if not i.blocked and i.kind in ("weights", "quant")]
    for item in weights:
        for user in users:
            quant = (item.quant or "").upper() if item.kind == "quant" else None
            if user.repo is None or (user.repo == item.repo and (quant is None or user.quant in (None, quant))):
                item.blocked = user.why
                break
    busy = process_users([i for i in weights if not i.blocked], hub)
    for item in weights:
        if id(item) in busy:
            item.blocked = busy[id(item)]

