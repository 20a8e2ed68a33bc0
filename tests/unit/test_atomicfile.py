"""The one atomic write: old or whole new, never torn; no temp file left behind; the mode kept or set;
the file and its directory fsynced in the right order. And no second copy of it in the package."""

from __future__ import annotations

import ast
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from metralectl import atomicfile
from metralectl.atomicfile import write_atomic

PACKAGE = Path(__file__).resolve().parents[2] / "metralectl"


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_new_file_gets_the_umask_default_and_whole_content(tmp_path: Path, umask_022: None) -> None:
    target = tmp_path / "sub" / "state.json"  # the directory is made too
    write_atomic(target, "héllo\n")
    assert target.read_bytes() == "héllo\n".encode()
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # as open() would: 0666 less the umask
    assert leftovers(target.parent) == []


def test_replacing_keeps_the_existing_mode(tmp_path: Path, umask_022: None) -> None:
    target = tmp_path / "peers.yaml"
    target.write_text("old")
    target.chmod(0o640)
    write_atomic(target, b"new")
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640


def test_an_explicit_mode_is_exact_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        write_atomic(tmp_path / "shared", "x", mode=0o644)  # the umask would have made it 0600
        write_atomic(tmp_path / "private", "x", mode=0o600)
        (tmp_path / "was-open").write_text("x")
        (tmp_path / "was-open").chmod(0o666)
        write_atomic(tmp_path / "was-open", "y", mode=0o600)  # an explicit mode wins over the old file's
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "shared").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "was-open").stat().st_mode) == 0o600


def test_a_private_file_is_never_readable_by_others_while_written(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real_write = os.write

    def spy(fd: int, data: bytes | memoryview) -> int:
        seen.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", spy)
    write_atomic(tmp_path / "token", "secret", mode=0o600)
    assert seen and all(m == 0o600 for m in seen)


@pytest.mark.parametrize("fail_in, error", [
    ("write", OSError(errno.ENOSPC, "No space left on device")),
    ("fsync", KeyboardInterrupt()),
    ("replace", OSError(errno.EXDEV, "Invalid cross-device link")),
])
def test_a_failure_mid_write_leaves_the_old_file_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             fail_in: str, error: BaseException) -> None:
    target = tmp_path / "run.json"
    target.write_text('{"status": "running"}')
    real_write = os.write

    def half_then_fail(fd: int, data: bytes | memoryview) -> int:
        real_write(fd, bytes(data[: len(data) // 2]))  # a torn temp file, as a full disk leaves it
        raise error

    def fail(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(os, fail_in, half_then_fail if fail_in == "write" else fail)
    with pytest.raises(type(error)):
        write_atomic(target, '{"status": "completed", "stages": []}')
    monkeypatch.undo()
    assert target.read_text() == '{"status": "running"}'
    assert leftovers(tmp_path) == []


def test_file_fsynced_before_the_rename_and_the_directory_after(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_atomic(tmp_path / "f", "x")
    assert events == ["fsync file", "replace", "fsync dir"]


def test_a_directory_that_cannot_be_fsynced_is_not_a_failed_write(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "Invalid argument")  # some filesystems answer so
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_atomic(tmp_path / "f", "x")
    assert (tmp_path / "f").read_text() == "x"


def test_the_store_and_the_caches_use_this_one() -> None:
    from metralectl.seams import store

    assert store.write_atomic is atomicfile.write_atomic


# os.replace / os.rename / mkstemp outside atomicfile would be a second atomic write. The one exception:
# ownedfs.Owned, the same atomic write (and rename, link swap) walked from a directory descriptor under a
# directory metralectl owns (the synced recipe set switches its `current` link through it).
ALLOWED_ELSEWHERE = {"ownedfs.py"}


def second_writers(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "atomicfile.py" or rel in ALLOWED_ELSEWHERE:
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Attribute) and node.attr in ("replace", "rename", "mkstemp") \
                    and isinstance(node.value, ast.Name) and node.value.id in ("os", "tempfile"):
                found.append(f"{rel}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_second_atomic_write_in_the_package() -> None:
    assert second_writers(PACKAGE) == []


def test_the_check_finds_a_second_atomic_write(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text("import os\n\ndef save(tmp, path):\n    os.replace(tmp, path)\n")
    assert second_writers(tmp_path) == ["mod.py:4: os.replace"]
