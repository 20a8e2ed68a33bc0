"""`recipes sync`'s call sites: every filesystem change it makes under the synced dir is an ownedfs.Owned
method on an Owned rooted there (tests/unit/owned_scan.py reads the modules' AST), and the list of those
calls is written out here, so a new one is a visible change to this test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.owned_scan import direct_changes, owned_calls

PACKAGE = Path(__file__).resolve().parents[2] / "metralectl"
SYNC_MODULES = ["app/recipe_sync.py", "app/sync_install.py", "core/synced_set.py", "core/release_archive.py",
                "core/bounded_gzip.py", "core/recipe_import.py", "seams/sync_http.py"]
CHANGING = {"make_root", "open_write", "make_dirs", "put", "move", "link", "remove_file", "remove_dir",
            "remove_tree", "chmod"}

# module -> every Owned method it calls, sorted (reads and changes).
CALL_SITES = {
    "app/sync_install.py": sorted([
        "make_root",  # the synced dir itself (the path to it is the user's)
        "open_write",  # .sync.lock
        "lstat", "make_dirs", "put", "put", "make_dirs", "move", "link",  # stage, then switch `current`
        "link_target", "lstat", "remove_tree", "remove_dir",  # undo what this sync made
        "listdir", "lstat", "remove_file", "remove_tree",  # sweep leftovers and old sets
    ]),
    "core/synced_set.py": sorted(["resolve", "lstat", "lstat", "read_bytes"]),
    "app/recipe_sync.py": [],
}


@pytest.mark.parametrize("module", SYNC_MODULES)
def test_no_filesystem_change_bypasses_owned(module: str) -> None:
    assert direct_changes(PACKAGE / module) == []


def test_the_one_direct_open_reads_the_users_from_directory() -> None:
    """`--from DIR` is the user's directory, not one metralectl owns: read only (O_RDONLY, never written)."""
    path = PACKAGE / "seams" / "sync_fetch.py"
    [found] = direct_changes(path)
    line = int(found.split(":")[1])
    assert re.search(r"os\.open\(path, os\.O_RDONLY \| os\.O_NONBLOCK", path.read_text().splitlines()[line - 1])


@pytest.mark.parametrize("module", sorted(CALL_SITES))
def test_the_owned_call_sites_are_these(module: str) -> None:
    calls = owned_calls(PACKAGE / module)
    assert all(call.split(": ", 1)[1].startswith("synced.") for call in calls)
    assert sorted(call.rsplit(".", 1)[1] for call in calls) == CALL_SITES[module]


def test_only_the_installer_changes_anything() -> None:
    for module in SYNC_MODULES:
        changing = {c.rsplit(".", 1)[1] for c in owned_calls(PACKAGE / module)} & CHANGING
        assert not changing or module == "app/sync_install.py", (module, changing)
