"""filecap: a file read as a regular file under a cap (issue 27, class 7), whatever it was replaced with."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from metralectl.errors import ExitCode


def test_a_regular_file_is_read_and_a_link_to_one_followed(tmp_path: Path) -> None:
    from metralectl.filecap import read_bytes, read_text

    (tmp_path / "real.yaml").write_text("name: x\n")
    (tmp_path / "link.yaml").symlink_to(tmp_path / "real.yaml")  # a user's dotfiles may be links
    assert read_bytes(tmp_path / "real.yaml", 100) == b"name: x\n"
    assert read_text(tmp_path / "link.yaml", 100) == "name: x\n"
    with pytest.raises(FileNotFoundError):
        read_bytes(tmp_path / "missing.yaml", 100)


@pytest.mark.parametrize("kind", ["fifo", "directory", "device", "huge", "just-over"])
def test_what_is_refused(tmp_path: Path, kind: str) -> None:
    from metralectl.filecap import FileRefused, read_bytes

    path = tmp_path / "f"
    if kind == "fifo":
        os.mkfifo(path)  # opening it to read would wait for a writer forever
    elif kind == "directory":
        path.mkdir()
    elif kind == "device":
        path = Path("/dev/zero")  # never ends
    elif kind == "huge":
        with open(path, "wb") as fh:
            fh.truncate(1 << 40)  # a sparse terabyte: Path.read_bytes would ask for all of it
    else:
        path.write_bytes(b"x" * 101)
    with pytest.raises(FileRefused) as caught:
        read_bytes(path, 100, "state file")
    assert caught.value.exit_code == ExitCode.DATA and "state file" in caught.value.message
