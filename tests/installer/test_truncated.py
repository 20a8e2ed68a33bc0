"""`curl … | sh` with the download cut short runs nothing, at any cut point.

install.sh defines functions only; its last line, `{ main "$@"; }`, cannot run before sh has read
its closing brace. Here every line boundary and many points inside lines (all of the last lines)
are piped to dash and to bash in POSIX mode (macOS's sh), against a HOME that already holds an
install (so a truncated `--uninstall` would show too): afterwards HOME, TMPDIR and the server's
request log are exactly as before.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.installer.conftest import INSTALL_SH, Box, tree


def cut_points(script: bytes) -> list[int]:
    points = {i + 1 for i, b in enumerate(script) if b == ord("\n")}       # after every line
    points |= set(range(1, len(script), 41))                               # inside lines
    points |= set(range(len(script) - 200, len(script)))                   # all of the last lines
    complete = {len(script), len(script) - 1}   # the whole script, with or without its final newline
    return sorted(p for p in points if 0 < p and p not in complete)


def fake_existing_install(box: Box) -> None:
    data = box.data
    (data / "venvs" / "0.1.0-x").mkdir(parents=True)
    (data / "venvs" / "0.1.0-x" / "marker").write_text("old\n")
    (data / "venv").symlink_to(data / "venvs" / "0.1.0-x")
    box.link.parent.mkdir(parents=True)
    box.link.symlink_to(data / "venvs" / "0.1.0-x" / "marker")
    (data / "receipt").write_text(f"version=0.1.0\nvenv={data}/venvs/0.1.0-x\nbin={box.link}\n")


@pytest.mark.parametrize("shell", ["dash", "bash"])
def test_truncated_script_changes_nothing(box: Box, shell: str) -> None:
    if not shutil.which(shell):
        pytest.skip(f"{shell} not installed")
    script = INSTALL_SH.read_bytes()
    assert script.rstrip().endswith(b'{ main "$@"; }')
    fake_existing_install(box)
    before = tree(box.home)
    asked = len(box.server.requests)
    argv = [shutil.which(shell)] + (["--posix"] if shell == "bash" else [])
    env = {**box.env}
    points = cut_points(script)
    if shell == "bash":
        points = points[::3]     # bash starts slower; a third of the cuts is plenty on top of dash
    ran_main = []
    for i, cut in enumerate(points):
        args = ["--uninstall"] if i % 2 else []
        if os.geteuid() == 0:
            args.append("--allow-root")
        done = subprocess.run([*argv, "-s", "--", *args], input=script[:cut], env=env,
                              capture_output=True, timeout=30)  # fmt: skip
        if b"metralectl" in done.stdout or b"metralectl installer" in done.stderr:
            ran_main.append((cut, done.stdout[-200:], done.stderr[-200:]))
    assert ran_main == [], f"{len(ran_main)} truncated scripts ran: {ran_main[:3]}"
    assert tree(box.home) == before
    assert list(box.tmp.iterdir()) == []
    assert len(box.server.requests) == asked
    assert len(points) > 300


def test_whole_script_does_run(box: Box) -> None:
    """The control: the same harness with the complete script does reach main."""
    args = ["--allow-root"] if os.geteuid() == 0 else []
    done = subprocess.run([shutil.which("dash"), "-s", "--", "--help", *args], input=INSTALL_SH.read_bytes(),
                          env=box.env, capture_output=True)  # fmt: skip
    assert b"usage: install.sh" in done.stdout
