"""Static checks: shellcheck, POSIX syntax, the shape that makes truncation safe, install.ps1 mirror."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.installer.conftest import INSTALL_SH, REPO

INSTALL_PS1 = REPO / "install" / "install.ps1"


def test_shellcheck_clean() -> None:
    if not shutil.which("shellcheck"):
        if os.environ.get("CI"):
            pytest.fail("shellcheck is missing in CI (apt-get install shellcheck)")
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    done = subprocess.run(["shellcheck", "--shell=sh", "--severity=style", str(INSTALL_SH)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("shell", [["dash", "-n"], ["bash", "--posix", "-n"], ["busybox", "sh", "-n"]])
def test_parses_in_posix_shells(shell: list[str]) -> None:
    if not shutil.which(shell[0]):
        pytest.skip(f"{shell[0]} not installed")
    done = subprocess.run([*shell, str(INSTALL_SH)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_only_functions_at_top_level() -> None:
    """Outside function bodies there are only comments and blank lines, then the one call.

    This is what makes a truncated download harmless (test_truncated.py checks the behaviour).
    """
    lines = INSTALL_SH.read_text().splitlines()
    assert lines[0] == "#!/bin/sh"
    assert lines[-1] == '{ main "$@"; }'
    depth_zero = []
    inside = False
    for line in lines[1:-1]:
        if not inside:
            if re.match(r"^[a-z0-9_]+\(\) \{$", line):
                inside = True
            elif re.match(r"^[a-z0-9_]+\(\) \{ .* \}$", line):
                pass                                    # one-line function
            elif line.strip() and not line.startswith("#"):
                depth_zero.append(line)
        elif line == "}":
            inside = False
    assert depth_zero == []
    assert not inside


def test_no_bashisms_beyond_posix() -> None:
    """A quick guard where shellcheck is absent (shellcheck --shell=sh reports these too)."""
    # Code only: comments may say "local".
    text = "\n".join(line for line in INSTALL_SH.read_text().splitlines() if not line.lstrip().startswith("#"))
    for bashism in (r"\[\[ ", r"^\s*local ", r"^function ", "<<<", "pipefail", r"\bsource "):
        assert not re.search(bashism, text, re.MULTILINE), bashism


def shell_functions() -> list[str]:
    return re.findall(r"^([a-z0-9_]+)\(\) \{", INSTALL_SH.read_text(), re.MULTILINE)


def test_ps1_mirrors_every_function() -> None:
    """install.ps1 is kept a function-for-function mirror (PowerShell cannot be installed here)."""
    ps1 = INSTALL_PS1.read_text()
    mirrored = set()
    for comment in re.findall(r"mirrors install\.sh: ([^\n]+)", ps1):
        mirrored |= set(re.findall(r"[a-z0-9_]+", comment))
    # The systemd and docker-group steps have no Windows counterpart; the ps1 says so.
    no_counterpart = {"write_unit", "explain_no_user_manager", "suggest_linger", "check_docker_group",
                      "need_cmd", "path_line_for_shell", "remove_path_lines",
                      "setup_completion",  # no PowerShell completion script
                      "setup_man", "uninstall_man"}  # fmt: skip  (no man on Windows)
    for name in no_counterpart:
        assert name in ps1, f"install.ps1 should say what became of {name}"
    missing = [f for f in shell_functions() if f not in mirrored and f not in no_counterpart]
    assert missing == []


def test_ps1_same_settings_and_refusals() -> None:
    sh, ps1 = INSTALL_SH.read_text(), INSTALL_PS1.read_text()
    for var in sorted(set(re.findall(r"METRALECTL_[A-Z_]+", sh))):
        assert var in ps1, var
    for message in ("refusing to install anything unverified", "SHA256SUMS has no (or no unambiguous) entry",
                    "SHA-256 mismatch for", "no SHA-256 tool found", "lists no single metralectl wheel",
                    "nothing was installed or changed", "--require-hashes", "--only-binary", "needs Python 3.10",
                    "cannot expand", "not an absolute path", "only https://"):  # fmt: skip
        assert message in sh and message in ps1, message
    # The last line is the only top-level statement, as in install.sh.
    assert ps1.rstrip().splitlines()[-1] == "& { Main }"


def test_ps1_parses_if_powershell_is_here() -> None:
    pwsh = shutil.which("pwsh") or shutil.which("powershell")
    if not pwsh:
        pytest.skip("PowerShell is not installable here (no Debian, PyPI or npm package ships it)")
    script = (f"$e=$null; [void][System.Management.Automation.Language.Parser]::ParseFile('{INSTALL_PS1}',"
              " [ref]$null, [ref]$e); if ($e) { $e; exit 1 }")  # fmt: skip
    done = subprocess.run([pwsh, "-NoProfile", "-Command", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_file_points_at_the_engine_teams_domain() -> None:
    """Their domain serves THEIR launcher (also named metralectl) and its installer: an install line, a default
    download address or a remedy that names it sends a user to the wrong program. (Spelt apart here so that
    this test does not find itself.)"""
    domain = "metrale" + ".ai"
    found = subprocess.run(["git", "-C", str(REPO), "grep", "--untracked", "-n", "-I", "-i", "-F", domain, "--", "."],
                           capture_output=True, text=True)  # fmt: skip
    assert found.returncode in (0, 1), found.stderr
    assert found.stdout == "", found.stdout
