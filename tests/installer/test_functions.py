"""install.sh's functions one by one, fast: the script minus its last line is a library.

Everything in install.sh is a function and only the last line calls main, so sourcing all but that
line defines the functions and runs nothing; each test then calls the ones it is about, under dash,
with a controlled PATH (fakes for systemctl, loginctl, getent, id).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.installer.conftest import INSTALL_SH, TOOLS, make_bin

MARKER = "# added by the metralectl installer (install.sh --uninstall removes it)"


@pytest.fixture
def sh(tmp_path: Path):
    lib = tmp_path / "install-lib.sh"
    lines = INSTALL_SH.read_text().splitlines(keepends=True)
    assert lines[-1].strip() == '{ main "$@"; }'
    lib.write_text("".join(lines[:-1]))
    home = tmp_path / "home"
    home.mkdir()
    bindir = make_bin(tmp_path / "bin", TOOLS, ["systemctl", "loginctl", "getent", "id", "docker"])

    def run(script: str, env: dict[str, str] | None = None, *, shell: str = "dash") -> subprocess.CompletedProcess:
        full_env = {"HOME": str(home), "PATH": str(bindir), "SHELL": "/bin/bash",
                    "FAKE_SYSTEMCTL_LOG": str(tmp_path / "systemctl.log"), **(env or {})}  # fmt: skip
        prologue = '. "$LIB"; parse_args; set_paths; '
        return subprocess.run([shutil.which(shell) or shell, "-c", prologue + script],
                              env={**full_env, "LIB": str(lib)}, capture_output=True, text=True, timeout=60)  # fmt: skip

    run.home = home  # type: ignore[attr-defined]
    run.tmp = tmp_path  # type: ignore[attr-defined]
    return run


# --- SHA256SUMS parsing ---------------------------------------------------------------------------

DIGEST = "ab" * 32


@pytest.mark.parametrize(
    "sums, expected",
    [
        (f"{DIGEST}  a.whl\n", DIGEST),
        (f"{DIGEST} *a.whl\n", DIGEST),                        # binary-mode entry
        (f"{DIGEST.upper()}  a.whl\r\n", DIGEST),              # upper-case hex, CRLF
        (f"{DIGEST}  ./a.whl\n", DIGEST),
        (f"{'cd' * 32}  b.whl\n{DIGEST}  a.whl", DIGEST),      # no final newline
        (f"{DIGEST}  a.whl.asc\n", ""),                        # another file's entry
        (f"{DIGEST}  xa.whl\n", ""),
        (f"{DIGEST[:-2]}  a.whl\n", ""),                       # not 64 hex digits
        (f"{DIGEST}  a.whl\n{'cd' * 32}  a.whl\n", ""),        # two different hashes: ambiguous
        (f"{DIGEST}  a.whl\n{DIGEST}  a.whl\n", DIGEST),       # the same twice is fine
        ("<html><body>404 Not Found</body></html>\n", ""),
        ("", ""),
    ],
)
def test_sums_lookup(sh, sums: str, expected: str) -> None:
    Path(sh.tmp / "SHA256SUMS").write_bytes(sums.encode())
    done = sh(f'TMP_DIR="{sh.tmp}"; sums_lookup a.whl')
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected


def test_sums_wheel_name(sh) -> None:
    (sh.tmp / "SHA256SUMS").write_text(
        f"{DIGEST}  install.sh\r\n{DIGEST.upper()} *metralectl_cockpit-1.2.3-py3-none-any.whl\r\n"
        f"{DIGEST}  metralectl-1.2.3-linux-x86_64.lock.txt\r\n"
    )
    assert sh(f'TMP_DIR="{sh.tmp}"; sums_wheel_name').stdout == "metralectl_cockpit-1.2.3-py3-none-any.whl\n"
    (sh.tmp / "SHA256SUMS").write_text(f"{DIGEST}  metralectl_cockpit-1.2.3-py3-none-any.whl\n{DIGEST}  metralectl_cockpit-1.2.4-py3-none-any.whl\n")
    assert sh(f'TMP_DIR="{sh.tmp}"; sums_wheel_name').stdout == ""


@pytest.mark.parametrize("hasher", ["sha256sum", "shasum", "openssl"])
def test_file_sha256_with_each_tool(sh, hasher: str) -> None:
    if not shutil.which(hasher):
        pytest.skip(f"{hasher} not here")
    (sh.tmp / "f").write_bytes(b"metralectl\n")
    import hashlib

    done = sh(f'HASHER={hasher}; file_sha256 "{sh.tmp}/f"', env={"PATH": os.environ["PATH"]})
    assert done.stdout.strip() == hashlib.sha256(b"metralectl\n").hexdigest()


# --- Python -------------------------------------------------------------------------------------


def test_pick_python_takes_a_path_with_spaces(sh) -> None:
    spaced = sh.tmp / "py dir"
    spaced.mkdir()
    (spaced / "python").symlink_to(os.path.realpath(sys.executable))
    done = sh('pick_python; printf "%s|%s\n" "$PYTHON" "$PY_VERSION"', env={"METRALECTL_PYTHON": str(spaced / "python")})
    assert done.stdout.strip() == f"{spaced / 'python'}|{sys.version_info[0]}.{sys.version_info[1]}", done.stderr


def test_pick_python_refuses_old_pythons(sh) -> None:
    old = sh.tmp / "old"
    old.mkdir()
    (old / "python3").write_text("#!/bin/sh\n[ \"$2\" = 'import sys; sys.exit(sys.version_info < (3, 10))' ] && exit 1\necho 3.8\n")
    (old / "python3").chmod(0o755)
    done = sh("pick_python", env={"PATH": f"{old}:{sh.tmp / 'bin'}", "METRALECTL_PYTHON": str(old / "python3")})
    assert done.returncode != 0
    assert f"needs Python 3.10 or newer; found {old / 'python3'} (3.8)" in done.stderr


# --- PATH -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("path_value", ["/a:{bin}:/b", "/a:{bin}/", "{bin}//", "{bin}"])
def test_on_path(sh, path_value: str) -> None:
    b = f"{sh.home}/.local/bin"
    done = sh(f'PATH="{path_value.format(bin=b)}"; on_path "{b}" && echo yes || echo no; PATH=/usr/bin; on_path "{b}" || echo not')
    assert done.stdout.split() == ["yes", "not"]


SETUP = 'RECEIPT="$HOME/receipt"; : >"$RECEIPT"; setup_path'


@pytest.mark.parametrize(
    "shell, profile, line, now",
    [
        ("/bin/bash", ".bashrc", 'export PATH="$PATH:$HOME/.local/bin"', 'export PATH="$PATH:$HOME/.local/bin"'),
        ("/usr/bin/zsh", ".zshrc", 'export PATH="$PATH:$HOME/.local/bin"', 'export PATH="$PATH:$HOME/.local/bin"'),
        ("/bin/sh", ".profile", 'export PATH="$PATH:$HOME/.local/bin"', 'export PATH="$PATH:$HOME/.local/bin"'),
        ("/usr/bin/fish", ".config/fish/conf.d/metralectl.fish",
         'contains -- "$HOME/.local/bin" $PATH; or set -gx PATH $PATH "$HOME/.local/bin"',
         'set -gx PATH $PATH "$HOME/.local/bin"'),
    ],
)  # fmt: skip
def test_path_line_added_once_per_shell(sh, shell: str, profile: str, line: str, now: str) -> None:
    first = sh(SETUP, env={"SHELL": shell})
    second = sh('RECEIPT="$HOME/receipt"; setup_path', env={"SHELL": shell})
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    text = (sh.home / profile).read_text()
    assert text == f"{MARKER}\n{line}\n", "written once, never twice"
    assert f"    {now}\n" in first.stdout and f"    {now}\n" in second.stdout
    receipt = (sh.home / "receipt").read_text()
    assert receipt.count(f"profile={sh.home}/{profile}\n") == 1
    assert f"created={sh.home}/{profile}\n" in receipt
    # The line is valid in its shell, and puts the directory on PATH there.
    interpreter = shutil.which(os.path.basename(shell))
    if interpreter and os.path.basename(shell) in ("bash", "zsh", "fish"):
        cmd = [interpreter, "-c", f"source {sh.home / profile}; echo $PATH"]
        out = subprocess.run(cmd, env={"HOME": str(sh.home), "PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True)  # fmt: skip
        assert f"{sh.home}/.local/bin" in out.stdout, out.stderr


def test_path_line_appended_after_unterminated_last_line(sh) -> None:
    (sh.home / ".bashrc").write_text("alias ll='ls -l'")   # no final newline
    sh(SETUP)
    assert (sh.home / ".bashrc").read_text() == f"alias ll='ls -l'\n{MARKER}\nexport PATH=\"$PATH:$HOME/.local/bin\"\n"
    assert "created=" not in (sh.home / "receipt").read_text()   # the user's file: never deleted


def test_path_line_already_written_by_user(sh) -> None:
    (sh.home / ".bashrc").write_text('export PATH="$PATH:$HOME/.local/bin"\n')
    done = sh(SETUP)
    assert (sh.home / ".bashrc").read_text() == 'export PATH="$PATH:$HOME/.local/bin"\n'
    assert "already puts" in done.stdout
    assert "profile=" not in (sh.home / "receipt").read_text()   # not ours to remove


@pytest.mark.parametrize("how", [{"METRALECTL_NO_MODIFY_PATH": "1"}, {"ARGS": "--no-modify-path"}])
def test_no_modify_path_prints_the_exact_line(sh, how: dict[str, str]) -> None:
    env = dict(how)
    args = env.pop("ARGS", "")
    done = sh(f'parse_args {args}; {SETUP}', env=env)
    assert not (sh.home / ".bashrc").exists()
    assert f"Add this line to {sh.home}/.bashrc:" in done.stdout
    assert '    export PATH="$PATH:$HOME/.local/bin"\n' in done.stdout


def test_custom_dir_outside_home_is_written_absolute(sh) -> None:
    done = sh(SETUP, env={"METRALECTL_INSTALL_DIR": "/opt/tools/bin"})
    assert 'export PATH="$PATH:/opt/tools/bin"' in (sh.home / ".bashrc").read_text(), done.stderr


def test_dir_with_shell_metacharacters_is_not_written(sh) -> None:
    done = sh(SETUP, env={"METRALECTL_INSTALL_DIR": "/opt/$x/bin"})
    assert not (sh.home / ".bashrc").exists()
    assert "Add it to PATH yourself" in done.stdout


def test_remove_path_lines_keeps_everything_else(sh) -> None:
    rc = sh.home / ".bashrc"
    rc.write_text(f"a\n{MARKER}\nexport PATH=\"$PATH:$HOME/.local/bin\"\nb\n")
    real = sh.home / "dotfiles-bashrc"
    rc.rename(real)
    rc.symlink_to(real)                      # a dotfile manager's symlink stays a symlink
    assert sh(f'remove_path_lines "{rc}"').returncode == 0
    assert rc.is_symlink() and real.read_text() == "a\nb\n"
    assert sh(f'remove_path_lines "{rc}"').returncode == 1   # nothing of ours left: no rewrite


# --- directories ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [("~", "{home}"), ("~/", "{home}"), ("~/x/bin", "{home}/x/bin"), ("/x/bin/", "/x/bin"), ("/", "/")],
)
def test_install_dir_expansion(sh, value: str, expected: str) -> None:
    done = sh('printf "%s\\n" "$BIN_DIR"', env={"METRALECTL_INSTALL_DIR": value})
    assert done.stdout.strip() == expected.format(home=sh.home)


def test_xdg_dirs(sh) -> None:
    done = sh('printf "%s\\n%s\\n" "$DATA_DIR" "$UNIT_FILE"',
              env={"XDG_DATA_HOME": "/d/", "XDG_CONFIG_HOME": "relative/ignored"})  # fmt: skip
    assert done.stdout.split() == ["/d/metralectl", f"{sh.home}/.config/systemd/user/metralectl-agent.service"]


def test_first_missing_dir(sh) -> None:
    (sh.home / "a").mkdir()
    done = sh(f'first_missing_dir "{sh.home}/a/b/c"; first_missing_dir "{sh.home}/a"')
    assert done.stdout.split("\n")[:2] == [f"{sh.home}/a/b", ""]


# --- the agent ------------------------------------------------------------------------------------

AGENT = 'VERSION=9.9; RECEIPT="$HOME/receipt"; : >"$RECEIPT"; BIN_LINK="$HOME/fake-metralectl"; setup_agent'


def fake_cli(sh, has_agent: bool) -> None:
    cli = sh.home / "fake-metralectl"
    cli.write_text("#!/bin/sh\n" + ('[ "$1" = agent ] && exit 0\n' if has_agent else "") + "exit 2\n")
    cli.chmod(0o755)


def calls(sh) -> list[str]:
    log = sh.tmp / "systemctl.log"
    return log.read_text().splitlines() if log.exists() else []


def test_agent_without_the_agent_command_is_not_enabled(sh) -> None:
    fake_cli(sh, has_agent=False)
    done = sh(AGENT)
    assert done.returncode == 0, done.stderr
    assert (sh.home / ".config/systemd/user/metralectl-agent.service").is_file()
    assert "has no\n'agent' command yet" in done.stdout
    assert "--user daemon-reload" in calls(sh)
    assert not [c for c in calls(sh) if "enable" in c or "restart" in c]


def test_agent_enabled_and_restarted_when_the_command_exists(sh) -> None:
    fake_cli(sh, has_agent=True)
    done = sh(AGENT, env={"FAKE_LINGER": "yes"})
    assert done.returncode == 0, done.stderr
    assert "--user enable metralectl-agent.service" in calls(sh)
    assert "--user restart metralectl-agent.service" in calls(sh)
    assert "Background agent: running" in done.stdout
    assert "enable-linger" not in done.stdout              # lingering already on


@pytest.mark.parametrize("how", [{"METRALECTL_NO_START": "1"}, {"ARGS": "--no-start"}])
def test_agent_no_start(sh, how: dict[str, str]) -> None:
    fake_cli(sh, has_agent=True)
    env = dict(how)
    args = env.pop("ARGS", "")
    done = sh(f"parse_args {args}; {AGENT}", env=env)
    unit = (sh.home / ".config/systemd/user/metralectl-agent.service").read_text()
    assert f'ExecStart="{sh.home}/fake-metralectl" agent' in unit
    assert calls(sh) == ["--user show-environment", "--user daemon-reload"]   # nothing enabled or started
    assert "systemctl --user enable --now metralectl-agent.service" in done.stdout
    assert "sudo loginctl enable-linger" in done.stdout


def test_agent_skipped_with_no_agent(sh) -> None:
    done = sh(AGENT, env={"METRALECTL_NO_AGENT": "1"})
    assert "skipped (METRALECTL_NO_AGENT=1)" in done.stdout
    assert not (sh.home / ".config").exists() and calls(sh) == []


def test_agent_without_a_user_session_explains(sh) -> None:
    """Under `sudo su -` systemctl --user cannot reach a user manager: say why, and what to do."""
    fake_cli(sh, has_agent=True)
    done = sh(AGENT, env={"FAKE_NO_USER_SESSION": "1"})
    assert done.returncode == 0
    assert (sh.home / ".config/systemd/user/metralectl-agent.service").is_file()
    if os.path.isdir("/run/systemd/system"):
        assert "sudo su -" in done.stdout and "systemctl --user daemon-reload && systemctl --user enable --now" in done.stdout
    else:
        assert "systemd is not running on this machine" in done.stdout
    assert calls(sh) == ["--user show-environment"]


def test_agent_without_systemd_at_all(sh) -> None:
    (sh.tmp / "bin" / "systemctl").unlink()
    done = sh(AGENT)
    assert "has no systemd" in done.stdout and "metralectl agent" in done.stdout
    assert not (sh.home / ".config").exists()


def test_unit_passes_the_config_dir(sh) -> None:
    fake_cli(sh, has_agent=False)
    sh(AGENT, env={"METRALECTL_CONFIG_DIR": "/srv/mctl"})
    unit = (sh.home / ".config/systemd/user/metralectl-agent.service").read_text()
    assert 'Environment="METRALECTL_CONFIG_DIR=/srv/mctl"' in unit


# --- the docker group -----------------------------------------------------------------------------

USER = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()


def test_docker_group_added_after_the_user_manager_started(sh) -> None:
    """In /etc/group, but neither this shell nor the user manager (pid = pytest's) has the group."""
    done = sh("check_docker_group", env={"FAKE_UID": "1000", "FAKE_DOCKER_GROUP": f"docker:x:4242:someone,{USER}",
                                         "FAKE_MANAGER_PID": str(os.getpid())})  # fmt: skip
    assert "added to the 'docker' group after this shell started" in done.stderr
    assert "newgrp docker" in done.stderr
    assert f"user manager (pid {os.getpid()}) started before you were added" in done.stderr
    assert "permission denied" in done.stderr
    assert "systemctl restart user@1000.service" in done.stderr


def test_docker_group_by_start_time_when_groups_are_unreadable(sh) -> None:
    done = sh("check_docker_group", env={"FAKE_UID": "1000", "FAKE_DOCKER_GROUP": f"docker:x:4242:{USER}",
                                         "FAKE_GROUPS": f"{USER} docker", "FAKE_MANAGER_PID": "999999999",
                                         "FAKE_MANAGER_START": "@1"})  # fmt: skip
    assert "this shell" not in done.stderr
    assert "/etc/group changed after your systemd user manager started" in done.stderr


def test_docker_group_all_good_is_silent(sh) -> None:
    done = sh("check_docker_group", env={"FAKE_UID": "1000", "FAKE_DOCKER_GROUP": f"docker:x:4242:{USER}",
                                         "FAKE_GROUPS": f"{USER} docker", "FAKE_MANAGER_PID": "0"})  # fmt: skip
    assert done.stdout == "" and done.stderr == ""


def test_not_in_docker_group_says_how(sh) -> None:
    done = sh("check_docker_group", env={"FAKE_UID": "1000", "FAKE_DOCKER_GROUP": "docker:x:4242:someone"})
    assert f"sudo usermod -aG docker {USER}" in done.stdout


def test_root_needs_no_docker_group(sh) -> None:
    done = sh("check_docker_group", env={"FAKE_UID": "0", "FAKE_DOCKER_GROUP": "docker:x:4242:someone"})
    assert done.stdout == "" and done.stderr == ""
