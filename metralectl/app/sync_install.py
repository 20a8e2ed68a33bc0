"""Installing a synced recipe set: every change through ownedfs.Owned rooted at the synced dir.

    <synced>/.sync.lock                 held (flock) while a sync installs: a second one is told to wait
    <synced>/.staging-<nonce>/          written first, file by file (Owned.put: atomic, durable)
    <synced>/sets/<release>-<sha>-<n>/  the staging dir renamed here (Owned.move)
    <synced>/current -> sets/...        swapped in one rename (Owned.link): the step that switches sets

Anything that fails or is interrupted before the swap removes what this sync made (its staging dir, its
set) and leaves the previous set byte for byte. After the swap, older sets and the leftovers of a killed
sync are removed; an entry there that is a symlink is reported and left alone, never removed through.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metralectl.errors import ExitCode, MetralError
from metralectl.ownedfs import Owned, OutsideOwned
from metralectl.safetext import clean

WHAT = "the synced recipe set"
LOCK = ".sync.lock"
_KEEP = "nothing was installed; the previous synced set stays as it was"


class InstallFailed(MetralError):
    """Writing the synced set failed (a full disk, permissions): nothing was switched."""

    exit_code = ExitCode.FAILED


def comment(text: str) -> str:
    """One YAML comment line. Only printable ASCII: a line break (\\n, \\r, U+0085, U+2028) in text from a
    release would end the comment and start a key of its own, so such text is refused, never written."""
    if not text or any(not " " <= ch <= "~" for ch in text):
        raise MetralError(f"refusing to write {clean(text, 200)!r} into a recipe's comment: only printable "
                          "ASCII goes there", _KEEP, exit_code=ExitCode.DATA)
    return f"# {text}\n"


def install(root: Path, set_name: str, files: dict[str, str | bytes], meta: dict[str, Any]) -> tuple[str, list[str]]:
    """Write `files` (paths relative to the set) and release.json as a new set and switch `current` to it.
    Returns (the new set's path, warnings about leftovers left alone)."""
    synced = Owned(root, WHAT)
    try:
        synced.make_root()
        lock = synced.open_write(LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise _failed(root, exc) from None
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise MetralError("another `metralectl recipes sync` is installing a set right now",
                              "wait for it to finish, then run this one again", exit_code=ExitCode.BUSY) from None
        warnings = _sweep(synced, "", lambda name: name.startswith((".staging-", ".current")))
        final = f"sets/{set_name}-{uuid.uuid4().hex[:6]}"
        _stage_and_switch(synced, final, files, meta)
        warnings += _sweep(synced, "sets", lambda name: f"sets/{name}" != final)
        return str(synced.path(final)), warnings
    finally:
        os.close(lock)


def _stage_and_switch(synced: Owned, final: str, files: dict[str, str | bytes], meta: dict[str, Any]) -> None:
    staging = f".staging-{uuid.uuid4().hex}"
    made_sets = synced.lstat("sets") is None
    try:
        synced.make_dirs(f"{staging}/recipes")
        for rel, data in files.items():
            synced.put(f"{staging}/{rel}", data)
        synced.put(f"{staging}/release.json", json.dumps(meta, indent=2) + "\n")
        synced.make_dirs("sets")
        synced.move(staging, final)
        synced.link("current", final, within="sets")  # the one step that switches sets
    except BaseException as exc:
        _undo(synced, staging, final, made_sets)
        if isinstance(exc, OSError):
            raise _failed(synced.root, exc) from None
        raise


def _undo(synced: Owned, staging: str, final: str, made_sets: bool) -> None:
    """Remove what this sync made, unless the switch to it happened (then it is the installed set)."""
    switched = synced.link_target("current") == tuple(final.split("/"))
    for rel in (staging, *(() if switched else (final,))):
        try:
            if synced.lstat(rel) is not None:
                synced.remove_tree(rel)
        except (OSError, OutsideOwned):
            pass  # left for the next sync's sweep; the error that brought us here is the one to report
    if made_sets and not switched:
        try:
            synced.remove_dir("sets")  # only when empty
        except (OSError, OutsideOwned):
            pass


def _sweep(synced: Owned, under: str, doomed: Callable[[str], bool]) -> list[str]:
    """Remove the entries of `under` that `doomed(name)` names, never through a link: a symlinked
    directory is reported and left alone (a link left by a killed sync's switch is removed as a link)."""
    warnings = []
    try:
        names = synced.listdir(under)
    except (OSError, OutsideOwned) as exc:
        return [f"{clean(str(synced.path(under)))}: not cleaned ({clean(str(exc))})"]
    for name in names:
        if not doomed(name):
            continue
        rel = f"{under}/{name}" if under else name
        try:
            st = synced.lstat(rel)
            if st is not None and stat.S_ISLNK(st.st_mode) and name.startswith(".current"):
                synced.remove_file(rel)
            elif st is not None:
                synced.remove_tree(rel)
        except OutsideOwned:
            warnings.append(f"{clean(str(synced.path(rel)))} is a symlink; left alone (metralectl removes nothing "
                            f"through a link) — remove it yourself if it is not yours")
        except OSError as exc:
            warnings.append(f"{clean(str(synced.path(rel)))}: not removed ({clean(exc.strerror or str(exc))})")
    return warnings


def _failed(root: Path, exc: OSError) -> InstallFailed:
    hint = "free some disk space, then sync again" if exc.errno == errno.ENOSPC else \
        f"check that {clean(str(root))} is a directory you can write"
    return InstallFailed(f"writing the synced set in {clean(str(root))} failed: "
                         f"{clean(exc.strerror or str(exc))}; {_KEEP}", hint)
