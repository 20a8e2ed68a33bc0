"""`list`'s rows kept on disk, so a plain `list` loads neither the catalog nor the types it is made of.

A row (app/library.py) is a function of the checked catalog and of the target it is judged against
(the --hardware asked for, else the GPUs the driver lists), except its weights column, which reads
the HF cache. So the rows are stored, as the plain dicts `list --json` prints, under the catalog
cache's own key plus the target's inputs and the stamps of the code that computes them; the weights
are read anew on every call. A catalog that refused a user recipe is never stored: its refusals are
reported from the catalog itself. Loading the ~25 dataclass types a cached catalog unpickles into
cost `list` more than everything else it does. The rows are plain dicts, kept with marshal (built in:
no import, unlike pickle; a file another Python wrote only misses).
"""

from __future__ import annotations

import marshal
import os
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from metralectl import paths

if TYPE_CHECKING:
    from metralectl.core.catalog import Catalog

_PACKAGE = Path(__file__).resolve().parents[1]
# what a row is computed by: a change to any of them makes the stored rows miss
_CODE = ("app/library.py", "core/fit.py", "core/hardware.py", "core/model_info.py", "core/image_info.py",
         "core/recipe.py")


def _key(hardware: str | None) -> str:
    from metralectl.core import catalog_cache
    from metralectl.seams import machine

    parts = [catalog_cache.fingerprint(paths.data_root(), paths.user_data_dir("recipes")),
             f"hardware={hardware!r}", f"gpus={machine.gpu_names()!r}",
             f"ram={machine.host_memory_gb()!r}"]
    for name in _CODE:
        try:
            st = os.stat(_PACKAGE / name)
            parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append(f"{name}:absent")
    return "\n".join(parts)


def _path(hardware: str | None) -> Path:
    return paths.cache_dir() / f"library-{zlib.crc32(repr(hardware).encode()):08x}.marshal"


def read(hardware: str | None) -> tuple[dict[str, Any] | None, str]:
    """({"target": {...}, "rows": [...]} for every recipe with its weights read now, or None when nothing is
    stored under this key; the key, to store under when the caller computes the rows: it is taken before
    the catalog is read, so a data file changed meanwhile makes the next call miss, never a stale hit)."""
    key = _key(hardware)
    try:
        with open(_path(hardware), "rb") as handle:
            stored_key, view = marshal.load(handle)
        if stored_key != key:
            return None, key
        rows, checkpoints = view["rows"], view["checkpoints"]
    except Exception:  # noqa: BLE001 - missing, torn or foreign: only means "compute"
        return None, key
    from metralectl.seams.hf import state as hfstate

    hub = paths.hf_hub_cache()  # once, not per recipe: it reads the environment and the home directory
    for row, checkpoint in zip(rows, checkpoints):  # plain dicts: no recipe types
        row["weights"] = hfstate.status(SimpleNamespace(**checkpoint), hub)
    return {"target": view["target"], "rows": rows}, key


def _checkpoint(ck: Any) -> dict[str, Any]:
    """What `checkpoint_state` reads of a checkpoint (a GGUF one: its quant's files only)."""
    return {"repo": ck.repo, "revision": ck.revision, "quant": ck.quant, "format": ck.format}


def build(catalog: Catalog, hardware: str | None, key: str) -> dict[str, Any]:
    """The rows from the catalog itself (as app/library.py computes them), stored when nothing was refused."""
    from metralectl.app import library

    target = library.choose_target(catalog, hardware)
    recipes = library.rows(catalog, target)
    view: dict[str, Any] = {"target": {"hardware": target.hardware, "how": target.how},
                            "rows": [r.to_json() for r in recipes],
                            "checkpoints": [_checkpoint(catalog.recipes[r.name].checkpoint) for r in recipes]}
    if not catalog.refused:
        _write(hardware, key, view)
    return {"target": view["target"], "rows": [dict(r) for r in view["rows"]]}


def _write(hardware: str | None, key: str, view: dict[str, Any]) -> None:
    from metralectl.atomicfile import write_atomic

    try:
        write_atomic(_path(hardware), marshal.dumps((key, view)))
    except OSError:
        pass  # a read-only or full cache dir costs speed, never correctness


def engines_by_recipe() -> dict[str, str]:
    """Each recipe's engine, for `ps`: from the rows stored for the default target when they are current (no catalog
    load), else from the catalog; empty when neither can be read (`ps` then says `?`, it does not fail)."""
    from metralectl.errors import MetralError

    try:
        key = _key(None)
        with open(_path(None), "rb") as handle:
            stored_key, view = marshal.load(handle)
        if stored_key == key:
            return {str(row["name"]): str(row["engine"]) for row in view["rows"]}
    except Exception:  # noqa: BLE001 - missing, torn, foreign or older rows: only means "ask the catalog"
        pass
    try:
        from metralectl.core.catalog import load_catalog

        return {name: recipe.engine for name, recipe in load_catalog().recipes.items()}
    except MetralError:
        return {}


def select(rows: list[dict[str, Any]], hardware: str | None, tags: list[str] | None) -> list[dict[str, Any]]:
    """library.rows' filters, on the stored rows: only this class's recipes, only recipes with every tag."""
    return [r for r in rows
            if not (hardware and r["hardware"] != hardware) and not (tags and not all(t in r["tags"] for t in tags))]
