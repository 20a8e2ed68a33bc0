"""The Hugging Face cache's modules change the filesystem only through ownedfs.Owned (issue 27, class 1).

For every module of the Hugging Face seam (seams/hf/, found by listing the package, so a new module is scanned
too) and of `rm`/`prune` (app/disk_weights, app/disk_users, cli/disk_cmds), tests/unit/owned_scan.py finds no write,
rename, link, removal, mkdir, chmod or truncation that bypasses Owned, and the Owned call sites are
enumerated (printed with `-s`, and pinned below) so a reviewer sees every place the cache is changed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.owned_scan import direct_changes, owned_calls

PACKAGE = Path(__file__).resolve().parents[2] / "metralectl"
HF_MODULES = sorted(p.relative_to(PACKAGE).as_posix() for p in (PACKAGE / "seams" / "hf").glob("*.py"))
MODULES = [*HF_MODULES, "seams/openfiles.py", "app/disk_weights.py", "app/disk_users.py", "cli/disk_cmds.py"]

# The methods each module calls on the cache's Owned (reads included): a change here is a change in what
# touches the cache, and is reviewed as one.
CHANGES = {"put", "open_write", "make_dirs", "move", "link", "remove_file", "remove_dir", "remove_tree", "chmod",
           "make_root"}
EXPECTED_CHANGES = {
    "seams/hf/weights.py": {"make_dirs", "put", "remove_file"},
    "seams/hf/steps.py": {"make_root", "open_write", "remove_file"},
    "seams/hf/download.py": {"open_write", "make_dirs", "remove_file", "remove_dir", "chmod", "move", "link"},
    "seams/hf/staging.py": {"put", "remove_file"},
    "seams/hf/cache.py": {"put"},
    "app/disk_weights.py": {"remove_file", "remove_tree"},
}


def test_every_module_of_the_hf_seam_is_scanned() -> None:
    """The package is listed, not named by hand: each of its modules (and only real ones) is in the scan."""
    assert {"seams/hf/weights.py", "seams/hf/cache.py", "seams/hf/download.py", "seams/hf/steps.py",
            "seams/hf/staging.py", "seams/hf/gguf.py"} <= set(HF_MODULES)
    assert all((PACKAGE / m).is_file() for m in MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_no_filesystem_change_bypasses_owned(module: str) -> None:
    assert direct_changes(PACKAGE / module) == []


def test_owned_call_sites_are_the_reviewed_ones() -> None:
    found: dict[str, set[str]] = {}
    for module in MODULES:
        calls = sorted(owned_calls(PACKAGE / module), key=lambda c: int(c.split(":")[0]))
        for call in calls:
            print(f"{module}:{call}")  # the enumeration a reviewer reads (pytest -s)
        methods = {c.rsplit(".", 1)[-1] for c in calls}
        if methods & CHANGES:
            found[module] = methods & CHANGES
    assert found == EXPECTED_CHANGES


def test_the_scanner_would_see_a_bypass(tmp_path: Path) -> None:
    """The scan is not vacuous: the calls main made in these modules are found."""
    sample = tmp_path / "old.py"
    sample.write_text("import os\nfrom metralectl.atomicfile import place, symlink_atomic, write_atomic\n"
                      "def f(p, q, blob):\n    p.mkdir(parents=True)\n    os.truncate(p, 0)\n"
                      "    place(p, blob)\n    symlink_atomic(q, 'x')\n    p.unlink(missing_ok=True)\n"
                      "    write_atomic(q, 'c')\n    handle = open(q, 'a+')\n    os.chmod(p, 0o644)\n")
    assert len(direct_changes(sample)) == 8
