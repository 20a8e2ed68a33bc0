#!/usr/bin/env python3
"""Build metralectl's release artifacts, and refresh the dependency locks they ship.

    python3 scripts/release.py build [--out DIR]     # wheel + locks + installers + SHA256SUMS
    python3 scripts/release.py lock [--exclude-newer DATE | --refresh]   # rewrite locks/*.txt
    python3 scripts/release.py check                 # are the committed locks current?

The release is one flat directory, the layout the installers download from:

    metralectl_cockpit-<version>-py3-none-any.whl
    metralectl-<version>-<platform>.lock.txt     one per platform in PLATFORMS
    install.sh, install.ps1                      the installers of this very release
    SHA256SUMS                                   "<sha256>  <name>" for every file above

Where things come from, and why each step is reproducible:
- The version has one source, `__version__` in metralectl/__init__.py; hatchling reads the same line
  (pyproject's [tool.hatch.version]), so the wheel's name and metadata cannot disagree with it.
- The wheel is built by hatchling, whose wheels are reproducible by default (fixed timestamps,
  sorted entries): the same tree gives the same bytes, hence the same SHA256SUMS line.
- The locks are committed files (locks/<platform>.txt), produced by `lock` and only copied by
  `build`, so building a release never asks a package index anything. `lock` resolves pyproject's
  dependencies with uv (`uv pip compile --generate-hashes --only-binary :all:`) once per
  (platform, Python minor version), limited to files uploaded before a recorded date
  (`--exclude-newer`): the same date and the same dependency list give the same pins and hashes.
  Resolving per Python version matters: several dependencies drop old Pythons in newer releases,
  so 3.10 and 3.14 may need different pins; those lines carry a `python_version` marker. Binary
  only, so an install never compiles anything on the user's machine. `pip install
  --require-hashes -r <lock>` then checks every downloaded file against these hashes.
- `build` refuses locks whose recorded inputs (dependency list, Python range, date, target) no
  longer match pyproject.toml: a dependency change without `lock` cannot slip into a release.

`lock` needs uv (`python3 -m pip install uv`) and a package index; `build` and `check` need
neither: the wheel is built by hatchling where this Python has it, else by `pip wheel` (which
fetches hatchling into an isolated build environment from pip's index), else by the pip of a
throwaway virtual environment (a Python without pip, as Debian's without python3-pip; nothing is
installed into that Python).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parent.parent
LOCK_DIR = REPO / "locks"
INSTALLERS = [REPO / "install" / "install.sh", REPO / "install" / "install.ps1"]

# Release platform name -> uv's --python-platform target. The names are what the installers compute
# from `uname -s`/`uname -m` (or the Windows equivalents). manylinux_2_28 = glibc >= 2.28 (Ubuntu
# 20.04+, DGX OS, RHEL 8+); the DGX Spark is linux-aarch64, Hopper/B200 servers linux-x86_64.
PLATFORMS = {
    "linux-x86_64": "x86_64-manylinux_2_28",
    "linux-aarch64": "aarch64-manylinux_2_28",
    "macos-arm64": "aarch64-apple-darwin",
    "macos-x86_64": "x86_64-apple-darwin",
    "windows-x86_64": "x86_64-pc-windows-msvc",
}
# Every Python minor version a lock must install on (pyproject: requires-python >= 3.10).
PYTHONS = ["3.10", "3.11", "3.12", "3.13", "3.14"]


def die(message: str) -> None:
    print(f"release: {message}", file=sys.stderr)
    sys.exit(1)


def version() -> str:
    text = (REPO / "metralectl" / "__init__.py").read_text()
    match = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', text, re.MULTILINE)
    if not match:
        die("no __version__ in metralectl/__init__.py")
    return match.group(1)  # type: ignore[union-attr]


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def lock_inputs(platform: str, exclude_newer: str) -> str:
    """A fingerprint of everything a lock is derived from; recorded in the lock's header."""
    proj = project()
    payload = {
        "dependencies": sorted(proj["dependencies"]),
        "requires-python": proj.get("requires-python", ""),
        "pythons": PYTHONS,
        "target": PLATFORMS[platform],
        "exclude-newer": exclude_newer,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def read_header(path: Path) -> dict[str, str]:
    """The `# key: value` lines at the top of a lock."""
    header: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        key, sep, value = line[1:].strip().partition(": ")
        if sep:
            header[key] = value
    return header


# ---------------------------------------------------------------------------------------------------
# lock


def parse_compiled(text: str) -> dict[str, tuple[str, list[str]]]:
    """`uv pip compile --no-annotate --no-header` output -> {name: (version, [sha256 hashes])}."""
    joined = text.replace("\\\n", " ")
    out: dict[str, tuple[str, list[str]]] = {}
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        req, *rest = line.split()
        name, _, ver = req.partition("==")
        if not ver:
            die(f"unpinned line in uv output: {line}")
        hashes = sorted(h.removeprefix("--hash=sha256:") for h in rest if h.startswith("--hash=sha256:"))
        if not hashes:
            die(f"no hashes for {req} in uv output")
        out[name.lower()] = (ver, hashes)
    return out


def committed_pins(platform: str, python: str) -> list[str]:
    """The committed lock's `name==version` lines that apply to this Python (its python_version markers)."""
    path = LOCK_DIR / f"{platform}.txt"
    if not path.exists():
        return []
    pins = []
    for line in path.read_text().splitlines():
        if not line or line[0] in "# ":
            continue
        req, _, marker = line.rstrip(" \\").partition(";")
        if not marker.strip() or f'python_version == "{python}"' in marker:
            pins.append(req.strip())
    return pins


def resolve(platform: str, python: str, exclude_newer: str, uv: str) -> dict[str, tuple[str, list[str]]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "lock.txt"
        # uv keeps the pins already in its output file where they still satisfy the dependencies: a dependency
        # added or changed moves only what it must (an index that later lists a file as uploaded before the date,
        # as a mirror's copy does, would otherwise move pins nobody asked to move).
        out.write_text("".join(f"{pin}\n" for pin in committed_pins(platform, python)))
        cmd = [
            uv, "pip", "compile", str(REPO / "pyproject.toml"), "--quiet",
            "--generate-hashes", "--only-binary", ":all:", "--no-header", "--no-annotate",
            "--python-platform", PLATFORMS[platform], "--python-version", python,
            "--exclude-newer", exclude_newer, "--output-file", str(out),
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            die(f"uv could not resolve for {platform} / Python {python}:\n{done.stderr}")
        return parse_compiled(out.read_text())


def render_lock(platform: str, exclude_newer: str, per_python: dict[str, dict]) -> str:
    # Group (name, version) -> the Pythons that resolved to it; one line for all, markers otherwise.
    users: dict[tuple[str, str], list[str]] = {}
    hashes: dict[tuple[str, str], list[str]] = {}
    for py, pins in per_python.items():
        for name, (ver, hs) in pins.items():
            users.setdefault((name, ver), []).append(py)
            hashes[(name, ver)] = hs
    lines = [
        f"# metralectl dependency lock for {platform} (uv target {PLATFORMS[platform]}), binary wheels only",
        f"# python: {' '.join(PYTHONS)}",
        f"# exclude-newer: {exclude_newer}",
        f"# inputs: {lock_inputs(platform, exclude_newer)}",
        f"# Regenerate (never edit by hand): python3 scripts/release.py lock --exclude-newer {exclude_newer}",
        "# Install: pip install --require-hashes --only-binary :all: -r <this file>",
    ]
    for name, ver in sorted(users):
        pys = users[(name, ver)]
        marker = ""
        if sorted(pys) != sorted(PYTHONS):
            marker = " ; " + " or ".join(f'python_version == "{p}"' for p in sorted(pys, key=_pykey))
        lines.append(f"{name}=={ver}{marker} \\")
        hs = hashes[(name, ver)]
        for i, h in enumerate(hs):
            lines.append(f"    --hash=sha256:{h}" + (" \\" if i < len(hs) - 1 else ""))
    return "\n".join(lines) + "\n"


def _pykey(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def cmd_lock(args: argparse.Namespace) -> None:
    uv = shutil.which("uv")
    if not uv:
        die("`lock` needs uv on PATH: python3 -m pip install uv")
    if args.exclude_newer:
        exclude_newer = args.exclude_newer
    elif args.refresh or not (LOCK_DIR / "linux-x86_64.txt").exists():
        exclude_newer = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT00:00:00Z")
    else:  # keep the recorded date: re-running `lock` reproduces the committed files
        exclude_newer = read_header(LOCK_DIR / "linux-x86_64.txt")["exclude-newer"]
    LOCK_DIR.mkdir(exist_ok=True)
    for platform in args.platforms or PLATFORMS:
        per_python = {py: resolve(platform, py, exclude_newer, uv) for py in PYTHONS}
        path = LOCK_DIR / f"{platform}.txt"
        path.write_text(render_lock(platform, exclude_newer, per_python))
        print(f"release: wrote {path.relative_to(REPO)}")


# ---------------------------------------------------------------------------------------------------
# check / build


def check_locks() -> list[str]:
    problems = []
    for platform in PLATFORMS:
        path = LOCK_DIR / f"{platform}.txt"
        if not path.exists():
            problems.append(f"missing {path.relative_to(REPO)}")
            continue
        header = read_header(path)
        want = lock_inputs(platform, header.get("exclude-newer", ""))
        if header.get("inputs") != want:
            problems.append(
                f"{path.relative_to(REPO)} was made from other inputs than pyproject.toml now lists "
                "(dependencies, Python range or target changed)"
            )
    return problems


def cmd_check(_args: argparse.Namespace) -> None:
    problems = check_locks()
    for p in problems:
        print(f"release: {p}", file=sys.stderr)
    if problems:
        die("locks are stale: run `python3 scripts/release.py lock` and commit locks/")
    print("release: locks are current")


def build_wheel(out: Path) -> Path:
    with tempfile.TemporaryDirectory() as scratch:
        done = subprocess.run(wheel_command(out, Path(scratch)), cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        die(f"building the wheel failed:\n{done.stdout}{done.stderr}")
    wheels = list(out.glob("metralectl_cockpit-*.whl"))
    if len(wheels) != 1:
        die(f"expected one wheel in {out}, found {wheels}")
    return wheels[0]


def wheel_command(out: Path, scratch: Path) -> list[str]:
    """hatchling here, else pip (hatchling in an isolated build env), else a throwaway venv's pip: a system
    Python without pip (PEP 668 or not) gets nothing installed into it."""
    if importlib.util.find_spec("hatchling") is not None:
        return [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)]
    pip_wheel = ["-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)]
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, *pip_wheel]
    venv = scratch / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
    if made.returncode != 0:
        die("building the wheel needs hatchling or pip in this Python, or its venv module to make a throwaway "
            "environment with pip (Debian/Ubuntu: sudo apt install python3-venv):\n" + made.stderr.strip())
    python = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    return [str(python), *pip_wheel]


def check_wheel(wheel: Path, ver: str) -> None:
    """The wheel must carry the data directories and the console script (`uvx metralectl list`), and the man page."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = zf.read(f"metralectl_cockpit-{ver}.dist-info/entry_points.txt").decode()
    for kind in ("engine", "kernels", "images", "recipes"):
        if not any(n.startswith(f"metralectl/_data/{kind}/") for n in names):
            die(f"{wheel.name} lacks metralectl/_data/{kind}/")
    if "metralectl = metralectl.cli.main:main" not in entry_points:
        die(f"{wheel.name} lacks the metralectl console script")
    if f"metralectl_cockpit-{ver}.data/data/share/man/man1/metralectl.1" not in names:
        die(f"{wheel.name} lacks the man page (share/man/man1/metralectl.1; install.sh installs it)")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cmd_build(args: argparse.Namespace) -> None:
    problems = check_locks()
    if problems:
        for p in problems:
            print(f"release: {p}", file=sys.stderr)
        die("locks are stale: run `python3 scripts/release.py lock` and commit locks/")
    ver = version()
    out = Path(args.out or REPO / "dist" / "release" / ver).resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_wheel(Path(tmp))
        if wheel.name != f"metralectl_cockpit-{ver}-py3-none-any.whl":
            die(f"hatchling built {wheel.name}, expected version {ver}")
        check_wheel(wheel, ver)
        shutil.copy2(wheel, out / wheel.name)
    for platform in PLATFORMS:
        shutil.copyfile(LOCK_DIR / f"{platform}.txt", out / f"metralectl-{ver}-{platform}.lock.txt")
    for script in INSTALLERS:
        shutil.copyfile(script, out / script.name)
    names = sorted(p.name for p in out.iterdir())
    # GNU coreutils' text format, so `sha256sum -c SHA256SUMS` works on the release directory.
    (out / "SHA256SUMS").write_text("".join(f"{sha256(out / n)}  {n}\n" for n in names))
    print(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the release directory")
    b.add_argument("--out", help="output directory (default dist/release/<version>; emptied first)")
    b.set_defaults(func=cmd_build)
    lk = sub.add_parser("lock", help="re-resolve locks/*.txt with uv (needs a package index)")
    lk.add_argument("--exclude-newer", help="only files uploaded before this RFC 3339 date")
    lk.add_argument("--refresh", action="store_true", help="move the date to today (new versions)")
    lk.add_argument("--platform", dest="platforms", action="append", choices=list(PLATFORMS))
    lk.set_defaults(func=cmd_lock)
    c = sub.add_parser("check", help="fail if the committed locks no longer match pyproject.toml")
    c.set_defaults(func=cmd_check)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
