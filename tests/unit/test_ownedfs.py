"""metralectl.names and metralectl.ownedfs: names from outside against their grammars, and changes inside an owned
directory tried as an attacker would (symlinks on the way, `..`, links that leave, FIFOs, directories swapped)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from metralectl.errors import ExitCode
from metralectl.names import UnsafeName, check, is_valid
from metralectl.ownedfs import Owned, OutsideOwned

SHA = "a" * 64
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize("kind,value", [
    ("commit", COMMIT), ("sha256", SHA), ("blob id", COMMIT), ("blob id", SHA), ("repo", "Qwen/Qwen3-0.6B"),
    ("repo", "gpt2"), ("quant", "UD-Q4_K_XL"), ("recipe name", "qwen3.5-35b-a3b"),
    ("recipe id", "qwen3.5/qwen3.5-35b-a3b-nvfp4"), ("release path", "recipes/qwen3.5/x.yaml"),
    ("repo path", "model-00001-of-00002.safetensors"), ("repo path", "onnx/model.onnx"),
    ("repo path", ".gitattributes"), ("repo path", "README_中文.md"), ("file name", "config.json"),
    ("version", "1.0.0-beta-preview"), ("version", "b35"), ("version", "2.1+cu128"),
    ("asset name", "recipes.tar.gz"), ("asset name", "index.json.minisig"),
])
def test_well_formed_names_pass(kind: str, value: str) -> None:
    assert check(kind, value, "the Hub") == value


@pytest.mark.parametrize("kind,value", [
    ("commit", COMMIT + "\n"), ("commit", "../../../../etc"), ("commit", COMMIT.upper()), ("sha256", "../" + SHA[3:]),
    ("blob id", SHA + "\n"), ("blob id", "x" * 64), ("repo", "org/../../etc"), ("repo", "org/na\x1bme"),
    ("repo", "-org/name"), ("repo", "org/name/more"), ("quant", "Q4\n"), ("quant", "../Q4"),
    ("recipe name", "../evil"), ("recipe name", "Evil"), ("recipe id", "a/../../b"),
    ("release path", "../x.yaml"), ("release path", "/etc/passwd"), ("release path", "a//b"),
    ("repo path", "../../../../tmp/pwned"), ("repo path", "/etc/passwd"), ("repo path", "a/./b"),
    ("repo path", "a/../b"), ("repo path", "a\\..\\b"), ("repo path", "x\x1b]0;title\x07"),
    ("repo path", "x\u202egnp.exe"), ("repo path", ".metralectl-verified.json"),
    ("repo path", "sub/.metralectl-partial/x"), ("repo path", "a\nb"), ("repo path", " lead"),
    ("repo path", "x" * 256), ("repo path", ""), ("file name", "a/b"), ("commit", None), ("sha256", 7),
    ("version", "1.0\x1b]0;t\x07"), ("version", "b35\n"), ("version", "-rc"), ("version", "1" * 65),
    ("version", 35), ("asset name", "../index.json"), ("asset name", "a/b"), ("asset name", ".hidden"),
    ("asset name", "index.json\n"), ("asset name", "na me"),
])
def test_hostile_names_are_refused(kind: str, value: object) -> None:
    assert not is_valid(kind, value)
    with pytest.raises(UnsafeName) as caught:
        check(kind, value, "the mirror")
    assert caught.value.exit_code == ExitCode.DATA
    assert "\x1b" not in caught.value.message and "\n" not in caught.value.message
    assert "the mirror gave" in caught.value.message


@pytest.fixture
def box(tmp_path: Path) -> tuple[Owned, Path]:
    root = tmp_path / "owned"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    return Owned(root, "the test cache"), outside


def test_writes_and_reads_inside(box: tuple[Owned, Path]) -> None:
    owned, _ = box
    owned.put("a/b/c.json", '{"x": 1}', mode=0o600)
    assert (owned.root / "a/b/c.json").read_text() == '{"x": 1}'
    assert (owned.root / "a/b/c.json").stat().st_mode & 0o777 == 0o600
    owned.link("a/b/link", "c.json")
    assert owned.read_bytes("a/b/link", 100, follow_inside=True) == b'{"x": 1}'
    assert owned.resolve("a/b/link") == ("a", "b", "c.json")
    owned.move("a/b/c.json", "d/e.json")
    assert owned.lstat("a/b/c.json") is None and (owned.root / "d/e.json").is_file()
    assert owned.remove_file("d/e.json") and not owned.remove_file("d/e.json")
    owned.remove_tree("a")
    assert owned.listdir() == ["d"]
    assert not [p for p in owned.root.rglob("*tmp")]  # no temp file left


def test_a_symlinked_directory_on_the_way_is_never_followed(box: tuple[Owned, Path]) -> None:
    owned, outside = box
    (owned.root / "models--x").symlink_to(outside)
    for attempt in (lambda: owned.put("models--x/precious", "pwned"),
                    lambda: owned.put("models--x/new", "pwned"),
                    lambda: owned.remove_file("models--x/precious"),
                    lambda: owned.make_dirs("models--x/sub"),
                    lambda: owned.open_write("models--x/precious", os.O_WRONLY | os.O_TRUNC),
                    lambda: owned.link("models--x/l", "x"),
                    lambda: owned.move("models--x/precious", "stolen")):
        with pytest.raises(OutsideOwned):
            attempt()
    assert (outside / "precious").read_text() == "keep me"
    assert sorted(p.name for p in outside.iterdir()) == ["precious"]


def test_a_symlink_as_the_last_component_is_replaced_or_refused_never_written_through(box: tuple[Owned, Path]) -> None:
    owned, outside = box
    (owned.root / "part").symlink_to(outside / "precious")
    with pytest.raises(OutsideOwned):
        owned.open_write("part", os.O_WRONLY | os.O_APPEND)
    owned.put("part", "ours")  # an atomic write replaces the link entry, it does not write through it
    assert (outside / "precious").read_text() == "keep me"
    assert (owned.root / "part").read_text() == "ours" and not (owned.root / "part").is_symlink()


def test_remove_tree_removes_links_not_what_they_point_to(box: tuple[Owned, Path]) -> None:
    owned, outside = box
    owned.make_dirs("repo/snapshots/c")
    (owned.root / "repo/snapshots/c/evil").symlink_to(outside / "precious")
    (owned.root / "repo/snapshots/d").symlink_to(outside)
    owned.remove_tree("repo")
    assert not (owned.root / "repo").exists()
    assert (outside / "precious").read_text() == "keep me"
    (owned.root / "top").symlink_to(outside)
    with pytest.raises(OutsideOwned):
        owned.remove_tree("top")  # a folder of ours that is a link: reported, left alone
    assert (outside / "precious").exists()


def test_removing_a_link_entry_never_touches_its_target(box: tuple[Owned, Path]) -> None:
    owned, outside = box
    (owned.root / "entry").symlink_to(outside / "precious")
    assert owned.remove_file("entry")
    assert (outside / "precious").read_text() == "keep me"


@pytest.mark.parametrize("target", ["/etc/passwd", "../../outside/precious", "../../x", "../a/../../x"])
def test_links_that_would_leave_are_not_made(box: tuple[Owned, Path], target: str) -> None:
    owned, _ = box
    with pytest.raises(OutsideOwned):
        owned.link("snap/file", target)
    assert owned.lstat("snap/file") is None


def test_links_are_kept_within_the_subtree_asked(box: tuple[Owned, Path]) -> None:
    owned, _ = box
    owned.link("repo/snapshots/c/f", "../../blobs/" + SHA, within="repo/blobs")
    with pytest.raises(OutsideOwned):
        owned.link("repo/snapshots/c/g", "../../refs/main", within="repo/blobs")


def test_reading_through_links_stops_at_the_root(box: tuple[Owned, Path]) -> None:
    owned, outside = box
    owned.make_dirs("snap")
    (owned.root / "snap/out").symlink_to(outside / "precious")
    (owned.root / "snap/rel").symlink_to("../../outside/precious")
    (owned.root / "snap/loop").symlink_to("loop")
    for name in ("snap/out", "snap/rel", "snap/loop"):
        assert owned.resolve(name) is None
        assert owned.stat_inside(name) is None
        with pytest.raises(OutsideOwned):
            owned.read_bytes(name, 100, follow_inside=True)


def test_fifos_and_devices_are_not_read(box: tuple[Owned, Path]) -> None:
    owned, _ = box
    os.mkfifo(owned.root / "fifo")
    with pytest.raises(OutsideOwned):
        owned.read_bytes("fifo", 100)  # would block forever if opened for a plain read
    (owned.root / "zero").symlink_to("/dev/zero")
    with pytest.raises(OutsideOwned):
        owned.read_bytes("zero", 100, follow_inside=True)


def test_read_is_capped_whatever_the_size_claims(box: tuple[Owned, Path]) -> None:
    owned, _ = box
    owned.put("big", b"x" * 1001)
    assert len(owned.read_bytes("big", 1001)) == 1001
    with pytest.raises(OutsideOwned):
        owned.read_bytes("big", 1000)


@pytest.mark.parametrize("rel", ["../outside/precious", "/etc/passwd", "a/../../x", "./.."])
def test_relative_paths_that_leave_are_refused(box: tuple[Owned, Path], rel: str) -> None:
    owned, _ = box
    with pytest.raises(OutsideOwned):
        owned.put(rel, "x")
    with pytest.raises(OutsideOwned):
        owned.parts(Path("/elsewhere/x"))


def test_an_absolute_path_under_the_root_is_accepted(box: tuple[Owned, Path]) -> None:
    owned, _ = box
    owned.put(owned.root / "x" / "y", "1")
    assert owned.parts(owned.root / "x" / "y") == ("x", "y")
    assert owned.contains(owned.root / "x") and not owned.contains(owned.root.parent)


def test_make_root_creates_the_root_through_the_users_links(tmp_path: Path) -> None:
    """The path to an owned directory is the user's (a link above or at the root is theirs): made, followed."""
    (tmp_path / "disk").mkdir()
    (tmp_path / "config").symlink_to(tmp_path / "disk")
    owned = Owned(tmp_path / "config" / "synced" / "deeper", "the test set")
    owned.make_root()
    owned.make_root()  # twice is fine
    assert (tmp_path / "disk" / "synced" / "deeper").is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutsideOwned, match="is not a directory"):
        Owned(tmp_path / "file", "the test set").make_root()
