"""`recipes sync` in symlinked sandboxes: links planted in the synced dir (`sets`, `current`, `.staging-*`,
`sets/<old>`, a link inside an old set, the lock) never lead a write, a rename or a removal outside it.
Every outside directory holds a sentinel tree that must come out byte for byte as it went in."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from metralectl.app import recipe_sync
from metralectl.core import synced_set
from metralectl.core.catalog import load_catalog
from metralectl.errors import ExitCode, MetralError
from metralectl.ownedfs import OutsideOwned
from metralectl.seams.sync_fetch import Source
from tests.unit.release_fixture import fixture_recipes, write_release
from tests.unit.test_sync_all_or_nothing import snapshot

N = len(fixture_recipes())


def _sync(location: Path, root: Path) -> recipe_sync.SyncReport:
    return recipe_sync.sync(load_catalog(use_cache=False), Source(str(location)), root=root, today="2026-12-01")


@pytest.fixture()
def outside(tmp_path: Path) -> Path:
    """A directory that is not metralectl's, shaped like a set (a release.json naming recipes, a recipes/
    folder), with a precious file: a sync that followed a link here would read, fill or empty it."""
    place = tmp_path / "outside"
    (place / "recipes").mkdir(parents=True)
    (place / "precious").write_text("keep me\n")
    (place / "recipes" / "planted.yaml").write_text("name: planted\n")
    (place / "release.json").write_text(json.dumps({
        "format": 1, "release": "b1", "commit": "0" * 40, "source": "/x", "revision": "b1",
        "recipes": [{"name": "planted", "id": "x/planted", "ours_sha256": "0" * 64}]}))
    return place


@pytest.fixture()
def root(isolated_env: Path) -> Path:
    return synced_set.synced_dir()


def test_sets_as_a_link_out_refuses_the_sync_and_leaves_both_sides(tmp_path: Path, root: Path, outside: Path) -> None:
    root.mkdir(parents=True)
    (root / "sets").symlink_to(outside)
    before, theirs = snapshot(root), snapshot(outside)
    with pytest.raises(OutsideOwned, match="'sets' is a symlink or not a directory") as caught:
        _sync(write_release(tmp_path / "b40"), root)
    assert caught.value.exit_code == ExitCode.DATA
    assert snapshot(outside) == theirs  # nothing renamed into it, nothing emptied out of it
    assert {k: v for k, v in snapshot(root).items() if k != ".sync.lock"} == before


def test_current_as_a_link_out_is_neither_read_nor_written_through(tmp_path: Path, root: Path,
                                                                   outside: Path) -> None:
    root.mkdir(parents=True)
    (root / "current").symlink_to(outside)
    theirs = snapshot(outside)
    assert synced_set.current(root) is None  # a release.json there makes it no set of ours
    catalog = load_catalog(use_cache=False)
    assert "planted" not in catalog.recipes
    assert any("`current` does not lead to a set under sets/" in p.message for r in catalog.refused
               for p in r.problems)
    report = _sync(write_release(tmp_path / "b40"), root)
    assert report.count("removed") == 0 and report.count("added") == N  # the planted list was not the previous set
    assert os.readlink(root / "current").startswith("sets/")  # the link replaced, as a link
    assert snapshot(outside) == theirs


def test_current_leading_out_through_a_relative_link_is_no_set(root: Path, outside: Path) -> None:
    (root / "sets").mkdir(parents=True)
    (root / "sets" / "b1").symlink_to(outside)
    (root / "current").symlink_to("sets/b1")
    assert synced_set.current(root) is None
    (root / "current").unlink()
    (root / "current").symlink_to("../../outside")
    assert synced_set.current(root) is None


def test_a_staging_leftover_that_is_a_link_is_reported_and_left_alone(tmp_path: Path, root: Path,
                                                                       outside: Path) -> None:
    root.mkdir(parents=True)
    (root / ".staging-1").symlink_to(outside)
    (root / ".staging-2").mkdir()  # a real leftover of a killed sync: removed
    (root / ".staging-2" / "x.yaml").write_text("x")
    theirs = snapshot(outside)
    report = _sync(write_release(tmp_path / "b40"), root)
    assert report.installed and (root / ".staging-1").is_symlink() and not (root / ".staging-2").exists()
    assert any(".staging-1 is a symlink; left alone" in w for w in report.warnings)
    assert snapshot(outside) == theirs


def test_an_old_set_that_is_a_link_is_reported_and_left_alone(tmp_path: Path, root: Path, outside: Path) -> None:
    _sync(write_release(tmp_path / "b40"), root)
    (root / "sets" / "b39-planted").symlink_to(outside)
    old = Path(os.readlink(root / "current")).name
    (root / "sets" / old / "recipes" / "escape").symlink_to(outside)  # a link inside an old set
    theirs = snapshot(outside)
    report = _sync(write_release(tmp_path / "b41"), root)
    assert any("b39-planted is a symlink; left alone" in w for w in report.warnings)
    assert sorted(p.name for p in (root / "sets").iterdir()) == sorted(["b39-planted", Path(report.installed).name])
    assert snapshot(outside) == theirs  # the old set removed, the link inside it removed as a link


def test_the_cli_prints_the_warning_escaped(tmp_path: Path, root: Path, outside: Path) -> None:
    import subprocess
    import sys

    from tests.unit.recipe_helpers import REPO

    root.mkdir(parents=True)
    (root / ".staging-\x1b]0;pwned\x07").symlink_to(outside)
    out = subprocess.run([sys.executable, "-m", "metralectl", "recipes", "sync", "--from",
                          str(write_release(tmp_path / "b40"))], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "METRALECTL_CONFIG_DIR": str(root.parent)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "warning: " in out.stderr and "\\x1b]0;pwned\\x07 is a symlink; left alone" in out.stderr
    assert "\x1b" not in out.stderr and "\x07" not in out.stderr


def test_the_lock_as_a_link_out_refuses_the_sync(tmp_path: Path, root: Path, outside: Path) -> None:
    root.mkdir(parents=True)
    (root / ".sync.lock").symlink_to(outside / "precious")
    with pytest.raises(MetralError) as caught:
        _sync(write_release(tmp_path / "b40"), root)
    assert caught.value.exit_code == ExitCode.DATA
    assert (outside / "precious").read_text() == "keep me\n"


def test_the_synced_dir_itself_may_be_the_users_link(tmp_path: Path, root: Path) -> None:
    """Above what metralectl owns, a link is the user's choice (synced/ on a larger disk): followed."""
    elsewhere = tmp_path / "bigdisk" / "synced"
    elsewhere.mkdir(parents=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    root.symlink_to(elsewhere)
    report = _sync(write_release(tmp_path / "b40"), root)
    assert report.count("added") == N and (elsewhere / "current").is_symlink()


def test_a_second_sync_while_one_installs_is_told_to_wait(tmp_path: Path, root: Path) -> None:
    import fcntl

    _sync(write_release(tmp_path / "b40"), root)
    before = snapshot(root)
    fd = os.open(root / ".sync.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(MetralError, match="another `metralectl recipes sync` is installing") as caught:
            _sync(write_release(tmp_path / "b41"), root)
        assert caught.value.exit_code == ExitCode.BUSY
    finally:
        os.close(fd)
    assert snapshot(root) == before
