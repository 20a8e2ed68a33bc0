"""install.sh for real: a clean HOME, a controlled PATH, the release served from loopback.

Each install here builds a real virtual environment from the locked wheels (~15 s each), so the
cases are grouped: one good install (with a fake systemd user manager and --no-start), one
lifecycle (reinstall while the old version runs, pruning, uninstall), one with
METRALECTL_INSTALL_DIR + METRALECTL_NO_AGENT.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.installer.conftest import REPO, Box, tree

PATH_LINE = 'export PATH="$PATH:$HOME/.local/bin"'
MARKER = "# added by the metralectl installer (install.sh --uninstall removes it)"


def generation(box: Box) -> Path:
    """The venv the `metralectl` link currently runs from."""
    return Path(os.path.realpath(box.link)).parent.parent


def test_good_install_then_uninstall(make_box) -> None:
    box: Box = make_box(fakes=["systemctl", "loginctl"])
    log = box.base / "systemctl.log"
    (box.home / ".bashrc").write_text("alias ll='ls -l'\n")   # the user's own profile
    run = box.install("--no-start", env={"FAKE_SYSTEMCTL_LOG": str(log)})
    assert run.returncode == 0, run.output

    # The command works from the installed wheel alone (cwd=/; the catalog data is in the wheel).
    listed = box.run_installed("list")
    assert listed.returncode == 0, listed.stderr
    assert "RECIPE" in listed.stdout and "shipped" in listed.stdout
    version = box.run_installed("--version")
    assert version.stdout.startswith("metralectl ")
    # cwd=/: `python -c` puts the working directory first on sys.path, and the checkout is there.
    where = subprocess.run([str(generation(box) / "bin" / "python"), "-c",
                            "import metralectl.paths as p; print(p.data_root())"],
                           capture_output=True, text=True, env={"HOME": str(box.home)}, cwd="/")  # fmt: skip
    assert where.stdout.strip().startswith(str(box.data / "venvs")), where.stdout + where.stderr

    # The layout: a venv per install, `venv` naming the current one, the link into it.
    assert generation(box).parent == box.data / "venvs"
    assert Path(os.path.realpath(box.data / "venv")) == generation(box)
    receipt = (box.data / "receipt").read_text()
    assert f"bin={box.link}\n" in receipt
    # The man page the wheel carries (docs/metralectl.1, share/man/man1 in the venv), in the user's man path.
    page = box.home / ".local" / "share" / "man" / "man1" / "metralectl.1"
    assert page.read_bytes() == (REPO / "docs" / "metralectl.1").read_bytes() and f"man={page}\n" in receipt

    # PATH: ~/.local/bin is not on the (controlled) PATH: the line is written once to .bashrc and
    # shown to the user.
    bashrc = (box.home / ".bashrc").read_text()
    assert bashrc == f"alias ll='ls -l'\n{MARKER}\n{PATH_LINE}\n"
    assert PATH_LINE in run.stdout

    # The agent: the unit is written and daemon-reload'ed, but --no-start enables nothing.
    unit = box.home / ".config" / "systemd" / "user" / "metralectl-agent.service"
    text = unit.read_text()
    assert f'ExecStart="{box.link}" agent' in text
    assert "WantedBy=default.target" in text
    if shutil.which("systemd-analyze"):   # systemd's own parser (system mode: no user manager here)
        verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
        assert verify.returncode == 0 and "metralectl-agent" not in verify.stderr, verify.stderr
    calls = log.read_text().splitlines()
    assert "--user daemon-reload" in calls
    assert not [c for c in calls if "enable" in c or "start" in c], calls
    assert "--no-start" in run.stdout
    assert "sudo loginctl enable-linger" in run.stdout          # Linger=no in the fake

    # Only the loopback server was asked for anything (proxies point at a dead port anyway).
    assert any(r.endswith("/SHA256SUMS") for r in box.server.requests)

    # --uninstall: the unit (disabled first), the link, the venvs, our PATH line; nothing else.
    (box.home / ".local" / "bin" / "other-tool").write_text("#!/bin/sh\n")
    (box.data / "notes.txt").write_text("the user's\n")
    config = box.home / ".config" / "metralectl"
    config.mkdir(parents=True)
    (config / "identity").write_text("key\n")
    run = box.install("--uninstall", env={"FAKE_SYSTEMCTL_LOG": str(log)})
    assert run.returncode == 0, run.output
    assert "--user disable --now metralectl-agent.service" in log.read_text()
    assert not unit.exists()
    assert not box.link.exists() and not box.link.is_symlink()
    assert not (box.home / ".local" / "share" / "man").exists()
    assert (box.home / ".local" / "bin" / "other-tool").exists()
    assert sorted(p.name for p in box.data.iterdir()) == ["notes.txt"]
    assert (config / "identity").exists()
    assert (box.home / ".bashrc").read_text() == "alias ll='ls -l'\n"


def test_reinstall_while_running_prunes_and_uninstalls(box: Box) -> None:
    first = box.install()
    assert first.returncode == 0, first.output
    assert "no systemd" in first.stdout                 # no systemctl on this PATH: explained
    old = generation(box)

    # A metralectl process from the first install, alive across the reinstall; after it, it still
    # imports modules lazily from its own environment.
    ready, go, out = box.base / "ready", box.base / "go", box.base / "out"
    code = f"""
import pathlib, time, metralectl
pathlib.Path({str(ready)!r}).touch()
deadline = time.time() + 240
while not pathlib.Path({str(go)!r}).exists() and time.time() < deadline:
    time.sleep(0.05)
import metralectl.cli.main, metralectl.paths
pathlib.Path({str(out)!r}).write_text(str(metralectl.paths.data_root()))
"""
    # cwd=/: `python -c` puts the working directory first on sys.path, and the checkout is there.
    proc = subprocess.Popen([str(old / "bin" / "python"), "-c", code], env={"HOME": str(box.home)}, cwd="/")
    try:
        deadline = time.time() + 60
        while not ready.exists():
            assert proc.poll() is None and time.time() < deadline, "the old metralectl did not start"
            time.sleep(0.05)
        stale = box.data / "venvs" / "0.0.1-20200101000000-1"     # an environment two installs old
        stale.mkdir()

        second = box.install()
        assert second.returncode == 0, second.output
        assert "Text file busy" not in second.output
        assert proc.poll() is None, "the running metralectl died during the reinstall"
        new = generation(box)
        assert new != old and new.parent == old.parent
        assert old.is_dir(), "the previous environment must outlive the switch"
        assert not stale.exists(), "environments older than the previous one are pruned"
        assert sorted(p.name for p in (box.data / "venvs").iterdir()) == sorted([old.name, new.name])
        assert box.run_installed("list").returncode == 0

        go.touch()
        assert proc.wait(timeout=120) == 0
        assert out.read_text().startswith(str(old)), "the old process mixed in the new environment"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    # Reinstalling never writes the PATH line twice.
    assert (box.home / ".bashrc").read_text().count(PATH_LINE) == 1
    assert "already puts" in second.stdout

    run = box.install("--uninstall")
    assert run.returncode == 0, run.output
    # Gone: the venvs, the link, the receipt, and .bashrc (the installer created it, and nothing
    # else was written to it). The standard directories stay.
    assert tree(box.home) == {".local": "dir", ".local/bin": "dir", ".local/share": "dir"}


def test_install_dir_tilde_and_no_agent(make_box) -> None:
    box: Box = make_box(fakes=["systemctl"])
    log = box.base / "systemctl.log"
    cwd = box.base / "cwd"
    cwd.mkdir()
    run = box.install(
        cwd=cwd,
        env={
            "METRALECTL_INSTALL_DIR": "~/tools/bin/",          # literal ~, as from a quoted env file
            "METRALECTL_NO_AGENT": "1",
            "SHELL": "/usr/bin/zsh",
            "FAKE_SYSTEMCTL_LOG": str(log),
        },
    )
    assert run.returncode == 0, run.output
    link = box.home / "tools" / "bin" / "metralectl"
    assert link.is_symlink() and subprocess.run([str(link), "--version"], capture_output=True).returncode == 0
    assert not box.link.exists()
    assert not list(cwd.iterdir()) and not (box.home / "~").exists(), "a folder named ~ was created"
    # No agent: no unit, systemctl never asked.
    assert not (box.home / ".config" / "systemd").exists()
    assert not log.exists()
    assert "METRALECTL_NO_AGENT=1" in run.stdout
    # zsh gets its line in .zshrc, naming the chosen directory, once.
    zshrc = (box.home / ".zshrc").read_text()
    completion = "$HOME/.local/share/metralectl/completion/metralectl.zsh"
    assert zshrc == (f'{MARKER}\nexport PATH="$PATH:$HOME/tools/bin"\n'
                     f'{MARKER}\n[ -r "{completion}" ] && (( $+functions[compdef] )) && . "{completion}"\n')
    assert f"bin={link}\n" in (box.data / "receipt").read_text()



def test_uvx_runs_list_from_the_wheel(release_dir: Path, wheel_cache: Path, tmp_path: Path) -> None:
    """SPEC §6: `uvx --from metralectl-cockpit metralectl list` with no install: the wheel alone carries the catalog."""
    uvx = shutil.which("uvx")
    if not uvx:
        pytest.skip("uv is not installed (optional: python3 -m pip install uv)")
    wheel = next(release_dir.glob("*.whl"))
    env = {"PATH": os.path.dirname(uvx) + ":/usr/bin:/bin", "HOME": str(tmp_path), "NO_COLOR": "1",
           "UV_CACHE_DIR": str(tmp_path / "uv"), "METRALECTL_CACHE_DIR": str(tmp_path / "mc")}  # fmt: skip
    done = subprocess.run([uvx, "--offline", "--no-index", "--find-links", str(wheel_cache), "--python", sys.executable,
                           "--from", str(wheel), "metralectl", "list"],
                          env=env, cwd="/", capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "RECIPE" in done.stdout and "shipped" in done.stdout
