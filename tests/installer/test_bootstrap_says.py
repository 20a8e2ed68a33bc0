"""scripts/bootstrap.sh says what it is doing before each step that is quiet for a while: before apt-get
(naming the packages) and before pip; a failing step still stops it (`set -e`).

The script runs as written under bash, with fakes for `id` (root), `apt-get` and the venv's python (which
log their calls on stderr, so the order of words and calls shows), and no other tool than python3 on
PATH: every package the script looks for is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def fake(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def bootstrap(tmp_path: Path, apt_exit: int = 0, realengines: bool = True) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "cat"):
        found = shutil.which(tool)
        assert found
        (bin_dir / tool).symlink_to(found)
    (bin_dir / "python3").symlink_to(os.path.realpath(sys.executable))
    fake(bin_dir, "id", 'echo 0\n')
    fake(bin_dir, "apt-get", f'echo "CALL apt-get $*" >&2\nexit {apt_exit}\n')
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake(venv / "bin", "python", 'case "$1" in -m) echo "CALL pip $*" >&2 ;; esac\nexit 0\n')
    fake(venv / "bin", "metralectl", 'echo "metralectl 9.9"\n')
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "METRALECTL_VENV": str(venv), "LANG": "C.UTF-8"}
    if not realengines:
        env["METRALECTL_SKIP_REALENGINES"] = "1"
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed here")
    return subprocess.run([bash, str(REPO / "scripts" / "bootstrap.sh")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def test_it_says_what_it_installs_before_apt_and_pip(tmp_path: Path) -> None:
    done = bootstrap(tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    calls = [i for i, line in enumerate(lines) if line.startswith("CALL ")]
    assert [lines[i].split()[1:3] for i in calls] == [["apt-get", "update"], ["apt-get", "install"], ["pip", "-m"]]
    before_apt = lines[calls[0] - 1]
    installed = lines[calls[1]].split("--no-install-recommends ", 1)[1].split()
    assert before_apt.startswith("bootstrap: apt-get update, then installing") and "docker.io" in installed
    assert before_apt.split(": ", 2)[2].split(" (")[0].split() == installed, before_apt  # every package, named
    assert lines[calls[1] + 1] == "bootstrap: Debian packages installed"
    assert lines[calls[2] - 1].startswith("bootstrap: pip: installing metralectl") and "torch" in lines[calls[2] - 1]
    assert lines[-1] == f"bootstrap: done (metralectl 9.9 in {tmp_path / 'venv'}; tests: {tmp_path / 'venv'}/bin/python -m pytest)"


def test_without_the_real_engine_packages_it_does_not_announce_them(tmp_path: Path) -> None:
    done = bootstrap(tmp_path, realengines=False)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("bootstrap: pip:")]
    assert said == [f"bootstrap: pip: installing metralectl (editable) with its test extras into {tmp_path / 'venv'}"]


def test_a_failing_apt_get_still_stops_it(tmp_path: Path) -> None:
    done = bootstrap(tmp_path, apt_exit=100)
    assert done.returncode == 100, done.stderr
    assert "bootstrap: apt-get update, then installing" in done.stderr
    assert "CALL pip" not in done.stderr and "bootstrap: done" not in done.stderr
