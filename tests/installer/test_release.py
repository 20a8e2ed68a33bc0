"""scripts/release.py: the release directory, its SHA256SUMS, the wheel, the locks."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.installer.conftest import REPO, sha256


def load_release_module():
    spec = importlib.util.spec_from_file_location("release_script", REPO / "scripts" / "release.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


release = load_release_module()


def test_layout_and_sums(release_dir: Path) -> None:
    version = release.version()
    expected = {
        f"metralectl_cockpit-{version}-py3-none-any.whl",
        "install.sh",
        "install.ps1",
        "SHA256SUMS",
        *(f"metralectl-{version}-{p}.lock.txt" for p in release.PLATFORMS),
    }
    assert {p.name for p in release_dir.iterdir()} == expected
    assert {"linux-x86_64", "linux-aarch64"} <= set(release.PLATFORMS)
    # SHA256SUMS covers every other file, in coreutils' format, and `sha256sum -c` agrees.
    lines = (release_dir / "SHA256SUMS").read_text().splitlines()
    listed = {}
    for line in lines:
        digest, name = line.split("  ", 1)
        listed[name] = digest
    assert set(listed) == expected - {"SHA256SUMS"}
    for name, digest in listed.items():
        assert sha256(release_dir / name) == digest
    check = subprocess.run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=release_dir,
                           capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    # The release carries the installers of this tree.
    assert (release_dir / "install.sh").read_bytes() == (REPO / "install" / "install.sh").read_bytes()


def test_version_has_one_source(release_dir: Path) -> None:
    init = (REPO / "metralectl" / "__init__.py").read_text()
    version = re.search(r'__version__ = "([^"]+)"', init).group(1)  # type: ignore[union-attr]
    assert 'path = "metralectl/__init__.py"' in (REPO / "pyproject.toml").read_text()
    wheel = release_dir / f"metralectl_cockpit-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(f"metralectl_cockpit-{version}.dist-info/METADATA").decode()
    assert f"\nVersion: {version}\n" in metadata


def test_wheel_carries_the_data_dirs(release_dir: Path) -> None:
    """`uvx --from metralectl-cockpit metralectl list` works from the wheel alone: the catalog data is inside it."""
    wheel = next(release_dir.glob("*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    for kind in ("engine", "kernels", "images", "recipes"):
        shipped = {p.relative_to(REPO).as_posix() for p in (REPO / kind).rglob("*") if p.is_file()
                   and "__pycache__" not in p.parts}  # fmt: skip
        packed = {n.removeprefix("metralectl/_data/") for n in names if n.startswith(f"metralectl/_data/{kind}/")}
        assert shipped and shipped <= packed, f"{kind}: missing {sorted(shipped - packed)[:5]}"
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)


def test_wheel_is_reproducible(tmp_path: Path) -> None:
    """Two builds of one tree give the same bytes (so the same SHA256SUMS line)."""
    first = release.build_wheel(tmp_path / "a")
    second = release.build_wheel(tmp_path / "b")
    assert sha256(first) == sha256(second)


def test_locks_pin_everything_with_hashes(release_dir: Path) -> None:
    version = release.version()
    for platform in release.PLATFORMS:
        text = (release_dir / f"metralectl-{version}-{platform}.lock.txt").read_text()
        header = release.read_header(release_dir / f"metralectl-{version}-{platform}.lock.txt")
        assert header["python"].split() == release.PYTHONS
        entries = re.split(r"\n(?=[a-z0-9])", text.split("\n", 6)[6].strip())
        names = set()
        for entry in entries:
            first = entry.splitlines()[0]
            assert re.match(r"^[a-z0-9._-]+==[^ ;]+( ; .+)? \\$", first), first
            assert re.search(r"--hash=sha256:[0-9a-f]{64}", entry), first
            names.add(first.split("==")[0])
        # Every direct dependency of pyproject is pinned, where its marker takes it (uvloop: not on Windows).
        from packaging.requirements import Requirement

        system = {"linux": "linux", "macos": "darwin", "windows": "win32"}[platform.split("-")[0]]
        for dep in release.project()["dependencies"]:
            requirement = Requirement(dep)
            if requirement.marker is not None and not requirement.marker.evaluate({"sys_platform": system}):
                assert requirement.name.lower() not in names, f"{platform}: {requirement.name} pinned, not wanted"
                continue
            name = requirement.name.lower().replace("_", "-")
            assert name in names, f"{platform}: {name} not pinned"


def test_committed_locks_are_current() -> None:
    assert release.check_locks() == []


def test_stale_lock_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dependency added to pyproject without `release.py lock` cannot be released."""
    real = release.project()
    changed = {**real, "dependencies": [*real["dependencies"], "left-pad>=1"]}
    monkeypatch.setattr(release, "project", lambda: changed)
    problems = release.check_locks()
    assert len(problems) == len(release.PLATFORMS)
    assert "other inputs" in problems[0]


def test_lock_rendering_marks_per_python_pins() -> None:
    per_python = {py: {"a": ("1.0", ["aa" * 32]), "b": ("2.0" if py == "3.10" else "3.0", ["bb" * 32])}
                  for py in release.PYTHONS}  # fmt: skip
    text = release.render_lock("linux-x86_64", "2026-01-01T00:00:00Z", per_python)
    assert "a==1.0 \\\n" in text
    assert 'b==2.0 ; python_version == "3.10" \\\n' in text
    assert 'b==3.0 ; python_version == "3.11" or' in text
    assert release.parse_compiled("x==1 \\\n    --hash=sha256:" + "cc" * 32 + "\n") == {"x": ("1", ["cc" * 32])}



def test_a_relock_hands_uv_the_committed_pins_so_an_added_dependency_moves_nothing_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding uvloop and re-locking with the same date also moved httpx 0.28.1 -> 0.29.0 and two others: the index
    listed newer files as uploaded before the date. uv keeps what its output file already pins, where it still fits."""
    (tmp_path / "linux-x86_64.txt").write_text(
        "# metralectl dependency lock\n"
        "httpx==0.28.1 \\\n    --hash=sha256:" + "aa" * 32 + "\n"
        'filelock==4.1.0 ; python_version == "3.10" \\\n    --hash=sha256:' + "bb" * 32 + "\n"
        'filelock==4.3.1 ; python_version == "3.11" or python_version == "3.12" \\\n    --hash=sha256:' + "cc" * 32 + "\n")
    monkeypatch.setattr(release, "LOCK_DIR", tmp_path)
    assert release.committed_pins("linux-x86_64", "3.11") == ["httpx==0.28.1", "filelock==4.3.1"]
    assert release.committed_pins("linux-x86_64", "3.10") == ["httpx==0.28.1", "filelock==4.1.0"]
    assert release.committed_pins("macos-arm64", "3.11") == []  # no lock yet: nothing to keep
    uv = tmp_path / "uv"  # copies the output file it finds, then writes what a resolution would
    uv.write_text("#!/bin/sh\nwhile [ $# -gt 0 ]; do [ \"$1\" = --output-file ] && out=$2; shift; done\n"
                  f"cp \"$out\" {tmp_path}/seen\nprintf 'httpx==0.28.1 \\\\\\n    --hash=sha256:{'aa' * 32}\\n' > \"$out\"\n")
    uv.chmod(0o755)
    pins = release.resolve("linux-x86_64", "3.12", "2026-11-29T00:00:00Z", str(uv))
    seen = (tmp_path / "seen").read_text().splitlines()
    assert seen == ["httpx==0.28.1", "filelock==4.3.1"]
    assert pins == {"httpx": ("0.28.1", ["aa" * 32])}


def test_a_python_without_pip_builds_the_same_release(release_dir: Path, tmp_path: Path) -> None:
    """README's installer line runs `python3 scripts/release.py build` with the system's Python, which on Debian has
    no pip (python3-pip) and refuses installs (PEP 668). A Python with neither hatchling nor pip (here a venv made
    `--without-pip`) builds the wheel with a throwaway venv's pip, gets nothing installed into it, and the release
    is the same."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, capture_output=True)
    python = bare / "bin" / "python"
    assert subprocess.run([str(python), "-c", "import pip"], capture_output=True).returncode != 0
    before = sorted(p.name for p in (bare / "lib").rglob("site-packages/*"))
    out = tmp_path / "release"
    done = subprocess.run([str(python), str(REPO / "scripts" / "release.py"), "build", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (out / "SHA256SUMS").read_text() == (release_dir / "SHA256SUMS").read_text()
    assert sorted(p.name for p in (bare / "lib").rglob("site-packages/*")) == before  # nothing went into it
