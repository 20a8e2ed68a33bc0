"""README's and docs/install.md's install lines, run exactly as written, against a package index.

The distribution is `metralectl-cockpit` (the name `metralectl` on the public index belongs to another
project); the command it installs is `metralectl`. Every `uv tool install …`, `pipx install …` and
`uvx …` line in README.md and docs/install.md is taken from the file and run verbatim by a shell.
The only difference from a user's machine is where the index lives: a PEP 503 "simple" index served
on loopback by a real HTTP server, holding this tree's release wheel and the locked dependency wheels
(the index address is given through the tools' own environment variables, never on the line).

Each installed `metralectl` must then list the shipped catalog. A line that names the wrong
distribution (e.g. `uvx metralectl list`, which would run the other project) fails here: the local
index has no `metralectl` distribution at all.
"""

from __future__ import annotations

import hashlib
import html
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = (REPO / "README.md", REPO / "docs" / "install.md")
INSTALL_LINE = re.compile(r"^\s*((?:uv tool install|pipx install|uvx)\s[^#\n]*?)\s*(?:#.*)?$")
# pipx installs its shared libraries (pip) into a venv of its own: they come from the index too
PIPX_SHARED = ("pip",)


def install_lines() -> list[tuple[str, str]]:
    """(file:line, command) for every install line inside a fenced code block of the docs."""
    found = []
    for doc in DOCS:
        fenced = False
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            hit = INSTALL_LINE.match(line) if fenced else None
            if hit:
                found.append((f"{doc.relative_to(REPO)}:{number}", hit.group(1)))
    return found


def distribution_of(command: str) -> str:
    """The distribution an install line asks for: uvx runs `--from X` (without it: the command's own name)."""
    words = command.split()
    if words[0] == "uvx":
        return words[words.index("--from") + 1] if "--from" in words else words[1]
    return words[-1]


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


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def local_index(release_dir: Path, wheel_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    shared = tmp_path_factory.mktemp("pipx-shared")
    got = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:", "--no-deps",
                          "-d", str(shared), *PIPX_SHARED], capture_output=True, text=True)  # fmt: skip
    if got.returncode != 0:
        pytest.fail(f"could not collect pipx's shared wheels (needs the package index once):\n{got.stderr[-2000:]}")
    root = tmp_path_factory.mktemp("index") / "simple"
    ours = sorted(release_dir.glob("*.whl"))
    assert [w.name.split("-")[0] for w in ours] == ["metralectl_cockpit"], ours
    build_simple_index(root, [*ours, *sorted(wheel_cache.glob("*.whl")), *sorted(shared.glob("*.whl"))])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: _Quiet(*a, directory=str(root.parent)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def user_env(home: Path, index: str) -> dict[str, str]:
    tools = [shutil.which(t) for t in ("uv", "pipx")]
    bins = [os.path.dirname(t) for t in tools if t]
    return {
        "PATH": ":".join([str(home / ".local" / "bin"), *bins, "/usr/bin", "/bin"]), "HOME": str(home),
        "NO_COLOR": "1", "METRALECTL_CACHE_DIR": str(home / "mc"), "METRALECTL_CONFIG_DIR": str(home / "cfg"),
        # uv / uvx: this index only; the Python running the tests (no interpreter download)
        "UV_DEFAULT_INDEX": index + "simple", "UV_PYTHON": sys.executable, "UV_PYTHON_DOWNLOADS": "never",
        "UV_CACHE_DIR": str(home / "uv-cache"), "UV_TOOL_DIR": str(home / "uv-tools"),
        "UV_TOOL_BIN_DIR": str(home / ".local" / "bin"), "UV_NO_PROGRESS": "1",
        # pipx drives pip: this index only, no machine-wide pip configuration
        "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": index + "simple", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIPX_HOME": str(home / "pipx"), "PIPX_BIN_DIR": str(home / ".local" / "bin"),
        "PIPX_DEFAULT_PYTHON": sys.executable,
    }  # fmt: skip


def test_the_docs_give_each_way_to_install_under_the_free_name() -> None:
    lines = [command for _, command in install_lines()]
    assert any(c.startswith("uv tool install ") for c in lines), lines
    assert any(c.startswith("pipx install ") for c in lines), lines
    assert any(c.startswith("uvx ") for c in lines), lines
    for where, command in install_lines():
        assert normalized(distribution_of(command)) == "metralectl-cockpit", f"{where}: {command}"


@pytest.mark.parametrize("where,command", install_lines(), ids=[w for w, _ in install_lines()])
def test_install_line_runs_as_written(where: str, command: str, local_index: str, tmp_path: Path) -> None:
    tool = command.split()[0]
    if not shutil.which(tool):
        if os.environ.get("CI"):
            pytest.fail(f"CI: {tool} is not installed (scripts/bootstrap.sh installs the test extras)")
        pytest.skip(f"{tool} is not installed")
    env = user_env(tmp_path, local_index)
    done = subprocess.run(["/bin/sh", "-c", command], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, f"{where}: `{command}` failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    if tool == "uvx":
        listing = done  # the line itself ran a metralectl command
    else:
        installed = tmp_path / ".local" / "bin" / "metralectl"
        assert installed.exists(), f"{where}: `{command}` put no `metralectl` command in ~/.local/bin"
        listing = subprocess.run([str(installed), "list"], env=env, capture_output=True, text=True, timeout=120)
        assert listing.returncode == 0, listing.stderr
    assert "RECIPE" in listing.stdout and "qwen3.5-35b-a3b" in listing.stdout, listing.stdout[-2000:]
