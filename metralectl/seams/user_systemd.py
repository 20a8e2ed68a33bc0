"""The user's systemd, for the agent's unit (`metralectl-agent.service`, written by install/install.sh).

`agent start` / `stop` go through `systemctl --user` when the unit is loaded there, so systemd keeps
owning the process it starts at login; everywhere else (no systemd, a container, WSL, a checkout with no
unit) the agent is started detached by metralectl itself. `systemctl` and `journalctl` are looked up on
PATH at each call and given a timeout: a user manager that does not answer is "no user systemd".
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

UNIT = "metralectl-agent.service"
TIMEOUT_S = 5.0
SHOW_TIMEOUT_S = 1.5  # `show` answers in milliseconds or fails at once (no bus); doctor's checks have 2.8 s


def _run(tool: str, *args: str, timeout_s: float = TIMEOUT_S) -> subprocess.CompletedProcess[str] | None:
    """The tool's answer, or None when it is not installed or did not answer in time."""
    found = shutil.which(tool)
    if found is None:
        return None
    try:
        return subprocess.run([found, *args], capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL, env={**os.environ, "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"})
    except (OSError, subprocess.TimeoutExpired):
        return None


def unit_file() -> Path | None:
    """The unit file where the installer puts it (or another user-unit directory), whether or not a user
    systemd runs here to load it."""
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    data = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    for directory in (config / "systemd" / "user", data / "systemd" / "user", Path("/etc/systemd/user"),
                      Path("/usr/lib/systemd/user")):
        if (directory / UNIT).is_file():
            return directory / UNIT
    return None


def unit_loaded() -> bool:
    """Whether `systemctl --user` answers here and knows the agent's unit."""
    answer = _run("systemctl", "--user", "show", "--property=LoadState", "--value", UNIT, timeout_s=SHOW_TIMEOUT_S)
    return answer is not None and answer.returncode == 0 and answer.stdout.strip() == "loaded"


def state() -> str | None:
    """The unit's ActiveState (active, activating, failed, inactive, …), or None when systemd does not answer."""
    answer = _run("systemctl", "--user", "show", "--property=ActiveState", "--value", UNIT, timeout_s=SHOW_TIMEOUT_S)
    if answer is None or answer.returncode != 0:
        return None
    return answer.stdout.strip() or None


def control(action: str, timeout_s: float = 90.0) -> tuple[bool, str]:
    """`systemctl --user ACTION metralectl-agent.service`: (succeeded, what it said)."""
    answer = _run("systemctl", "--user", action, UNIT, timeout_s=timeout_s)
    if answer is None:
        return False, f"systemctl --user {action} {UNIT} did not answer within {timeout_s:g} s"
    return answer.returncode == 0, (answer.stderr or answer.stdout).strip()


def journal_command(lines: int | None, follow: bool) -> list[str] | None:
    """The journalctl command line for the unit's log (None: no journalctl)."""
    found = shutil.which("journalctl")
    if found is None:
        return None
    command = [found, "--user", "-u", UNIT, "--no-pager", "-o", "short-iso"]
    command += ["-n", str(lines) if lines else "all"]
    if follow:
        command.append("-f")
    return command


def journal_tail(lines: int) -> list[str]:
    """The unit's last lines (empty when there is no journal to ask)."""
    command = journal_command(lines, False)
    if command is None:
        return []
    answer = _run(command[0], *command[1:])
    return answer.stdout.splitlines()[-lines:] if answer is not None else []


def started_by_systemd() -> bool:
    """Whether this process runs as the agent's unit (its cgroup is the unit's)."""
    try:
        return f"/{UNIT}" in Path("/proc/self/cgroup").read_text()
    except OSError:
        return False
