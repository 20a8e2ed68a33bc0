"""README's and docs/install.md's install lines, run exactly as written.

No release of metralectl (the distribution `metralectl-cockpit`) is published, so every way the docs give installs
from a checkout: `uv tool install .`, `pipx install .`, and the verified installer run against a release the
project's own release script builds. The docs also say how to have the engine team's launcher (the distribution
`metralectl`, a Rust binary with the same command name) beside it. Every line of the fenced `sh` blocks in
README's "Install" and in docs/install.md's sections before "What the installer does" is taken from the file
and run verbatim by /bin/sh:

- in a fresh copy of the checkout (its files as git sees them), with a fresh HOME;
- as an unprivileged user (`nobody`) when the tests run as root, so nothing can be written into the system
  Python (PEP 668) or anywhere outside HOME and the copy; where that user cannot reach the test tools, as
  root with an `id` double that says uid 1000 (the installer refuses root, as a user should never run it);
- against a package index on loopback (the only difference from a user's machine; given through the tools'
  own environment variables, never on the line) that holds the locked dependency wheels, hatchling (the
  build backend `uv tool install .`, `pipx install .` and the release build fetch), pip (pipx's shared
  library) and a stand-in for the engine team's wheel, built the way theirs is (a binary under
  `metralectl-<version>.data/scripts/`, no Python code). It holds no `metralectl-cockpit`: none is published.

A line that installs this project must leave a `metralectl` in ~/.local/bin that lists the shipped catalog. A
line for the engine team's launcher runs after README's `uv tool install .` and must leave this project's
`metralectl` as it was and the stand-in reachable (under its new name or place, or as the line's own output).
"""

from __future__ import annotations

import base64
import hashlib
import html
import http.server
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.installer.conftest import FAKES

REPO = Path(__file__).resolve().parents[2]
README, INSTALL_MD = REPO / "README.md", REPO / "docs" / "install.md"
# (file, the headings whose sections hold install lines; "" is the text before the first `## `)
SECTIONS = ((README, ("## Install",)),
            (INSTALL_MD, ("", "## The engine team's metralectl, and having both")))  # fmt: skip
ENGINE_VERSION = "0.1.1"
MARK = "stand-in for the engine team's metralectl"
# what a build from the checkout and pipx fetch from the index, and pipx itself (the user installs it from there)
BUILD_BACKEND = ("hatchling>=1.21", "pip", "pipx")
NOBODY = 65534


# --- the lines --------------------------------------------------------------------------------


def _sections(doc: Path, wanted: tuple[str, ...]) -> Iterator[tuple[int, str]]:
    """(line number, line) of the doc's lines inside the wanted sections."""
    current = ""
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        if line.startswith("## "):
            current = line.strip()
        if current in wanted:
            yield number, line


def fenced(doc: Path, lines: Iterator[tuple[int, str]], lang: str = "sh") -> list[tuple[str, str]]:
    """(file:line, line) of every command line inside ```lang fences (comment-only lines left out)."""
    found, fence = [], None  # the open fence's language, None outside one
    for number, line in lines:
        if line.lstrip().startswith("```"):
            fence = line.strip()[3:] if fence is None else None
            continue
        if fence == lang and line.strip() and not line.lstrip().startswith("#"):
            found.append((f"{doc.relative_to(REPO)}:{number}", line.strip()))
    return found


def doc_lines() -> list[tuple[str, str]]:
    return [hit for doc, wanted in SECTIONS for hit in fenced(doc, _sections(doc, wanted))]


def command_words(line: str) -> list[str]:
    return shlex.split(line, comments=True)


def installs_theirs(line: str) -> bool:
    """A line for the engine team's launcher names the distribution `metralectl` itself."""
    return "metralectl" in command_words(line)


def distinct(lines: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """One run per command: a line README and docs/install.md both give (their comments apart) runs once, under
    both places."""
    places: dict[str, list[str]] = {}
    first: dict[str, str] = {}
    for where, line in lines:
        key = shlex.join(command_words(line))
        places.setdefault(key, []).append(where)
        first.setdefault(key, line)
    return [("+".join(places[key]), first[key]) for key in places]


OURS = distinct([(w, c) for w, c in doc_lines() if not installs_theirs(c)])
THEIRS = distinct([(w, c) for w, c in doc_lines() if installs_theirs(c)])


# --- the index --------------------------------------------------------------------------------


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def build_simple_index(root: Path, wheels: list[Path]) -> None:
    by_project: dict[str, list[Path]] = {}
    for wheel in wheels:
        by_project.setdefault(normalized(wheel.name.split("-")[0]), []).append(wheel)
    for project, files in by_project.items():
        page = root / project
        page.mkdir(parents=True)
        links = []
        for wheel in files:
            shutil.copyfile(wheel, page / wheel.name)
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            links.append(f'<a href="{html.escape(wheel.name)}#sha256={digest}">{html.escape(wheel.name)}</a><br>')
        (page / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")
    (root / "index.html").write_text(
        "<!DOCTYPE html><html><body>\n" + "\n".join(f'<a href="{p}/">{p}</a>' for p in sorted(by_project))
        + "\n</body></html>\n")  # fmt: skip


def engine_standin_wheel(directory: Path) -> Path:
    """A wheel shaped like the engine team's: its command a file under .data/scripts/, no Python code."""
    name = f"metralectl-{ENGINE_VERSION}"
    files = {
        f"{name}.data/scripts/metralectl": f'#!/bin/sh\necho "metralectl {ENGINE_VERSION} ({MARK}): $*"\n'.encode(),
        f"{name}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: metralectl\nVersion: {ENGINE_VERSION}\n".encode(),
        f"{name}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for path, data in files.items()) + f"{name}.dist-info/RECORD,,\n"  # fmt: skip
    wheel = directory / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in [*files.items(), (f"{name}.dist-info/RECORD", record.encode())]:
            info = zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if "/scripts/" in path else 0o644) << 16
            zf.writestr(info, data)
    return wheel


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def local_index(wheel_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    key = hashlib.sha256((" ".join(BUILD_BACKEND) + sys.version).encode()).hexdigest()[:16]
    backend = Path.home() / ".cache" / "metralectl-tests" / f"build-backend-{key}"
    if not (backend / ".complete").exists():
        shutil.rmtree(backend, ignore_errors=True)
        got = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:",
                              "-d", str(backend), *BUILD_BACKEND], capture_output=True, text=True)  # fmt: skip
        # (with their dependencies; a name the lock pins as well is served in the lock's version below)
        if got.returncode != 0:
            pytest.fail(f"could not collect hatchling and pip (needs the package index once):\n{got.stderr[-2000:]}")
        (backend / ".complete").touch()
    standin = engine_standin_wheel(tmp_path_factory.mktemp("engine-wheel"))
    root = tmp_path_factory.mktemp("index") / "simple"
    wheels = {w.name: w for w in [*sorted(wheel_cache.glob("*.whl")), *sorted(backend.glob("*.whl")), standin]}
    assert not any(n.startswith("metralectl_cockpit-") for n in wheels)  # not published: not on the index
    build_simple_index(root, list(wheels.values()))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: _Quiet(*a, directory=str(root.parent)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple/"
    finally:
        server.shutdown()
        server.server_close()


# --- a user with a fresh checkout ---------------------------------------------------------------


@dataclass
class User:
    home: Path
    checkout: Path
    env: dict[str, str]
    prefix: list[str]  # runs a command as this user

    def sh(self, line: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.prefix, "/bin/sh", "-c", line], env=self.env, cwd=cwd or self.checkout,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip

    def ours(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.prefix, str(self.home / ".local" / "bin" / "metralectl"), "list"], env=self.env,
                              cwd=self.home, capture_output=True, text=True, timeout=120)  # fmt: skip


def user_python() -> str:
    """The system's Python where it is the tests' Python version (the locked wheels are for that version), else the
    interpreter under the test venv."""
    system = Path("/usr/bin/python3")
    if system.exists():
        got = subprocess.run([str(system), "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                             text=True)  # fmt: skip
        if got.stdout.strip() == str(sys.version_info[:2]):
            return str(system)
    return os.path.realpath(sys.executable)


@pytest.fixture(scope="module")
def toolbox(local_index: str) -> Iterator[tuple[Path, str]]:
    """(a bin directory, the Python): uv and uvx (copies of the test venv's binaries), pipx installed into a venv of
    its own from the local index as a user installs it, and the Python; all readable by any user."""
    for tool in ("uv", "uvx"):
        if not shutil.which(tool):
            if os.environ.get("CI"):
                pytest.fail(f"CI: {tool} is not installed (scripts/bootstrap.sh installs the test extras)")
            pytest.skip(f"{tool} is not installed")
    base = Path(tempfile.mkdtemp(prefix="metralectl-readme-tools-"))
    try:
        base.chmod(0o755)
        bins = base / "bin"
        bins.mkdir()
        for tool in ("uv", "uvx"):
            shutil.copy2(shutil.which(tool) or tool, bins / tool)
        python = user_python()
        (bins / "python3").symlink_to(python)
        venv = base / "pipx-venv"
        env = {"PATH": "/usr/bin:/bin", "HOME": str(base), "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": local_index,
               "PIP_DISABLE_PIP_VERSION_CHECK": "1"}  # fmt: skip
        for step in ([python, "-m", "venv", str(venv)], [str(venv / "bin" / "pip"), "install", "--quiet", "pipx"]):
            done = subprocess.run(step, env=env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"{step}: {done.stderr[-2000:]}"
        (bins / "pipx").symlink_to(venv / "bin" / "pipx")
        yield bins, python
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _reachable_by_nobody(paths: list[Path]) -> bool:
    probe = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "/bin/sh", "-c",
             'for p in "$@"; do [ -x "$p" ] || exit 1; done', "-"]  # fmt: skip
    return bool(shutil.which("setpriv")) and subprocess.run([*probe, *map(str, paths)],
                                                            capture_output=True).returncode == 0


def _copy_checkout(target: Path) -> None:
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")  # fmt: skip
    for rel in filter(None, listed):
        source = REPO / rel
        if source.is_file():
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / rel)


@pytest.fixture
def user(local_index: str, toolbox: tuple[Path, str]) -> Iterator[User]:
    tools, python = toolbox
    base = Path(tempfile.mkdtemp(prefix="metralectl-readme-"))
    try:
        base.chmod(0o755)
        as_root = os.geteuid() == 0
        as_nobody = as_root and _reachable_by_nobody([tools / t for t in ("uv", "uvx", "pipx", "python3")])
        doubles = base / "doubles"
        doubles.mkdir()
        if as_root and not as_nobody:  # the `id` double: the installer sees a normal user (FAKE_UID below)
            shutil.copyfile(FAKES / "id", doubles / "id")
            (doubles / "id").chmod(0o755)
        home, checkout = base / "home", base / "checkout"
        home.mkdir()
        _copy_checkout(checkout)
        prefix: list[str] = []
        if as_nobody:
            subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(home), str(checkout)], check=True)
            prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        env = {
            "PATH": ":".join([str(home / ".local" / "bin"), str(doubles), str(tools), "/usr/bin", "/bin"]),
            "HOME": str(home),
            "SHELL": "/bin/bash", "LANG": "C.UTF-8", "NO_COLOR": "1", "TMPDIR": str(home / "tmp"),
            "METRALECTL_CACHE_DIR": str(home / "mc"), "METRALECTL_CONFIG_DIR": str(home / "cfg"),
            # uv / uvx: this index only; the system Python (no interpreter download)
            "UV_DEFAULT_INDEX": local_index, "UV_PYTHON": python,
            "UV_PYTHON_DOWNLOADS": "never", "UV_CACHE_DIR": str(home / "uv-cache"),
            "UV_TOOL_DIR": str(home / "uv-tools"),
            "UV_TOOL_BIN_DIR": str(home / ".local" / "bin"), "UV_NO_PROGRESS": "1",
            # pip (pipx's, the release build's, the installer's): this index only, no machine-wide configuration
            "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": local_index, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIPX_HOME": str(home / "pipx"), "PIPX_BIN_DIR": str(home / ".local" / "bin"),
            "PIPX_DEFAULT_PYTHON": python,
            # anything but the loopback index goes to a proxy that is not there
            "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "no_proxy": "127.0.0.1,localhost",
        }  # fmt: skip
        if prefix == [] and as_root:
            env["FAKE_UID"] = "1000"  # the `id` double: the installer sees a normal user
        made = subprocess.run([*prefix, "mkdir", str(home / "tmp")], capture_output=True)
        assert made.returncode == 0, made.stderr
        yield User(home, checkout, env, prefix)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _lists_our_catalog(done: subprocess.CompletedProcess[str]) -> bool:
    return done.returncode == 0 and "RECIPE" in done.stdout and "qwen3.5-35b-a3b" in done.stdout


# --- the tests --------------------------------------------------------------------------------


def test_the_docs_give_each_route_from_a_checkout_and_none_from_an_index() -> None:
    ours = [c for _, c in OURS]
    assert any(c.startswith("uv tool install .") for c in ours), ours
    assert any(c.startswith("pipx install .") for c in ours), ours
    assert any("scripts/release.py build" in c and "METRALECTL_DOWNLOAD_URL=" in c and "sh install/install.sh" in c
               for c in ours), ours  # fmt: skip
    theirs = [c for _, c in THEIRS]
    assert any(c.startswith("pipx install --suffix") for c in theirs) and any(c.startswith("uvx ") for c in theirs)
    # nothing is published: no line anywhere in the docs installs metralectl-cockpit from an index or a site
    from_index = re.compile(r"(uv tool install|pipx install|uvx|pip install)\b[^\n`]*metralectl-cockpit"
                            r"|curl[^\n`]*\| *sh")
    for doc in [README, *sorted((REPO / "docs").glob("*.md")), REPO / "images" / "README.md"]:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            assert not from_index.search(line), f"{doc.relative_to(REPO)}:{number}: {line}"


def test_every_install_line_in_the_docs_is_one_this_test_runs() -> None:
    """An install line outside the sections above (a new block, another file) would escape the run below."""
    run = {c for _, c in doc_lines()}
    pattern = re.compile(r"^\s*(?:\S+=\S+\s+)*(uv tool install|pipx install|uvx|pip install|sh install/install\.sh|"
                         r"python3 scripts/release\.py build\b.*&&)")  # fmt: skip
    for doc in [README, INSTALL_MD]:
        for where, line in fenced(doc, enumerate(doc.read_text().splitlines(), 1)):
            if pattern.match(line):
                assert line in run, f"{where}: `{line}` is an install line outside the sections this test runs"


@pytest.mark.parametrize("where,command", OURS, ids=[w for w, _ in OURS])
def test_install_line_runs_as_written(where: str, command: str, user: User) -> None:
    done = user.sh(command)
    assert done.returncode == 0, f"{where}: `{command}` failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    installed = user.home / ".local" / "bin" / "metralectl"
    assert installed.exists(), f"{where}: `{command}` put no `metralectl` command in ~/.local/bin"
    if "install/install.sh" in command:  # the verified installer did the install, from the release just built
        assert "downloading SHA256SUMS" in done.stdout and " installed: " in done.stdout, done.stdout[-3000:]
        assert os.path.realpath(installed).startswith(str(user.home / ".local" / "share" / "metralectl" / "venvs"))
    listing = user.ours()
    assert _lists_our_catalog(listing), (listing.stdout[-2000:], listing.stderr[-2000:])
    # the demo's image builds from the install too: `show` names the build script the install carries
    shown = subprocess.run([*user.prefix, str(installed), "show", "demo-cpu"], env=user.env, cwd=user.home,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    script = re.search(r"\(bash (\S+build-llama-cpp-cpu\.sh)\)", shown.stdout)
    assert script and Path(script.group(1)).is_file(), shown.stdout[-2000:]
    assert Path(script.group(1)).resolve().is_relative_to(user.home.resolve()), script.group(1)
    helped = user.sh(f"bash {script.group(1)} --help", cwd=user.home)
    assert helped.returncode == 0 and "from scratch" in helped.stdout, helped.stderr


@pytest.mark.parametrize("where,command", THEIRS, ids=[w for w, _ in THEIRS])
def test_the_engine_teams_launcher_beside_ours_as_written(where: str, command: str, user: User) -> None:
    [ours_line] = [c for w, c in OURS if c.startswith("uv tool install .") and w.startswith("README")]
    first = user.sh(ours_line)
    assert first.returncode == 0 and _lists_our_catalog(user.ours()), first.stderr[-3000:]
    ours_before = os.readlink(user.home / ".local" / "bin" / "metralectl")

    done = user.sh(command, cwd=user.home)
    assert done.returncode == 0, f"{where}: `{command}` failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    # ours is untouched
    assert os.readlink(user.home / ".local" / "bin" / "metralectl") == ours_before
    assert _lists_our_catalog(user.ours())
    # theirs is reachable: the line ran it, or it left a command of its own somewhere under ~/.local
    reached = [done.stdout] if MARK in done.stdout else []
    for path in sorted((user.home / ".local").rglob("metralectl*")):
        if path.parent.name.endswith("bin") and path != user.home / ".local" / "bin" / "metralectl":
            ran = subprocess.run([*user.prefix, str(path), "--version"], env=user.env, capture_output=True, text=True)
            assert MARK in ran.stdout, (path, ran.stdout, ran.stderr)
            reached.append(str(path))
    assert reached, f"{where}: `{command}` left no way to run the engine team's launcher:\n{done.stdout}{done.stderr}"


def test_uv_refuses_to_put_theirs_over_ours(user: User) -> None:
    """docs/install.md: `uv tool install metralectl` next to ours stops ("Executable already exists") and changes
    nothing, so the docs give the other ways."""
    [ours_line] = [c for w, c in OURS if c.startswith("uv tool install .") and w.startswith("README")]
    assert user.sh(ours_line).returncode == 0
    done = user.sh("uv tool install metralectl", cwd=user.home)
    assert done.returncode != 0 and "Executable already exists: metralectl" in done.stderr, done.stderr
    assert _lists_our_catalog(user.ours())
    assert "Executable already exists: metralectl" in INSTALL_MD.read_text().replace("\n", " ")
