"""This host's processes and signals: whether a recorded pid still runs, and SIGTERM handled like Ctrl-C.

Two pid questions, because `kill(pid, 0)` answers three ways (runs and ours, runs but another user's,
gone) and callers need different halves of it:

  pid_alive(pid)    some process has that pid now (EPERM counts: it runs, we may not signal it).
                    For "did the process that wrote this record die?": a record's writer under
                    another account is still running.
  pid_is_ours(pid)  a process of this user has that pid. For "is OUR agent (or helper) still
                    there?": after a reboot or a long time the pid can belong to another user's
                    process, and EPERM must then read as "not our agent" (never send it our token).
                    "This user's" is the process's owner (/proc/PID), not whether kill() may
                    signal it: root may signal every process, and every process is not root's.

Neither can tell a recycled pid of this same user from the original process. identity(pid) can: the
process's start time (in clock ticks since boot, /proc/PID/stat), the boot it belongs to and its
executable; a record that keeps them (the agent's pidfile) names one process, never its pid's next
owner. Callers that hand a secret over also confirm with the process itself (the CLI asks the agent to
prove it holds the token before it sends it: app/agent_client.py).

raise_fd_limit() lifts the soft descriptor limit to the hard one for a server that many clients
may connect to (the agent: its peer listener caps connections, but the process has other uses).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import FrameType
from typing import Any


def _probe(pid: int) -> str:
    """'ours', 'foreign' (exists, another user's) or 'gone'."""
    if pid <= 0:
        return "gone"  # 0 and negatives address process groups, never one recorded process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "foreign"
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        return "gone"  # exited between the two looks
    except OSError:
        return "ours"  # no /proc to ask: kill() permitted it, which is all that is known
    return "ours" if owner == os.geteuid() else "foreign"


def pid_alive(pid: int | None) -> bool:
    """Whether any process, of any user, has this pid now."""
    return pid is not None and _probe(pid) != "gone"


def pid_is_ours(pid: int | None) -> bool:
    """Whether a process this user may signal has this pid now (another user's process is not ours)."""
    return pid is not None and _probe(pid) == "ours"


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # the name, in parentheses, may hold spaces and ')'
    try:
        return int(fields[19])  # field 22 counted from the state, which is field 3
    except (IndexError, ValueError):
        return None


def executable(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def command_name(pid: int) -> str | None:
    """The process's name (/proc/PID/comm), or None when it is gone or hidden."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() or None
    except OSError:
        return None


def command_line(pid: int, limit: int = 4096) -> str | None:
    """The process's arguments joined by spaces (/proc/PID/cmdline), or None when gone or hidden. Text from
    another program: escape it before showing it (safetext)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read(limit)
    except OSError:
        return None
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", errors="replace")
    return text or None


def identity(pid: int) -> dict[str, Any] | None:
    """What names this one process for as long as it lives: {pid, start_ticks, boot_id, exe}; None when
    there is no such process of ours (gone, another user's) or no /proc to ask."""
    if not pid_is_ours(pid):
        return None
    ticks = start_ticks(pid)
    if ticks is None:
        return None
    return {"pid": pid, "start_ticks": ticks, "boot_id": _boot_id(), "exe": executable(pid)}


def same_process(record: dict[str, Any]) -> bool:
    """Whether the process a record names (identity()'s fields) is still running: its pid is ours, and it
    started at the recorded tick of the recorded boot, from the recorded executable. A pid now used by
    another process, of ours or not, is not it (and must never be signalled for it)."""
    pid = record.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool):
        return False
    now = identity(pid)
    if now is None:
        # no /proc here (macOS): nothing beyond the pid was recorded, nor can be checked
        return "start_ticks" not in record and not Path("/proc/self").exists() and pid_is_ours(pid)
    return all(record.get(key) == now[key] for key in ("start_ticks", "boot_id", "exe"))


def wait_gone(pid: int, timeout_s: float, record: dict[str, Any] | None = None) -> bool:
    """Wait until the process (the one `record` names, when given) is gone; whether it went in time. A child
    of ours is reaped, so it does not linger as a zombie."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass  # not our child: someone else reaps it
        alive = same_process(record) if record is not None else pid_alive(pid)
        if not alive or _zombie(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] == "Z"


def raise_fd_limit(ceiling: int = 1 << 20) -> tuple[int, int]:
    """Lift the soft RLIMIT_NOFILE to the hard limit (at most `ceiling`); (before, after). Never lowers it,
    and a refusal leaves it as it was."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):
            return soft, soft
        return soft, wanted
    return soft, soft


# -- signals ------------------------------------------------------------------------------------------
def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextmanager
def _handling(signals: tuple[signal.Signals, ...],
              handler: Callable[[int, FrameType | None], None]) -> Iterator[bool]:
    """Install handler for signals, restore the previous handlers afterwards. Python delivers signals
    to the main thread only and refuses signal.signal() elsewhere: off it this does nothing, and
    yields False so a caller can tell."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = {sig: signal.getsignal(sig) for sig in signals}
    try:
        for sig in signals:
            signal.signal(sig, handler)
        yield True
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)  # None: set outside Python


def sigterm_as_interrupt() -> AbstractContextManager[bool]:
    """For the duration, SIGTERM (a service manager, `kill`) raises KeyboardInterrupt as Ctrl-C does, so
    the same cleanup runs; the previous handler is back afterwards."""
    return _handling((signal.SIGTERM,), _raise_interrupt)


def on_stop_signals(callback: Callable[[], None]) -> AbstractContextManager[bool]:
    """For the duration, SIGTERM and SIGINT call callback() instead (a server's graceful stop: it
    sets a flag its main loop watches); the previous handlers are back afterwards."""

    def handler(signum: int, frame: FrameType | None) -> None:
        callback()

    return _handling((signal.SIGTERM, signal.SIGINT), handler)


def sigterm_as_interrupt_until_exit() -> None:
    """SIGTERM raises KeyboardInterrupt from now until the process exits: for a one-shot CLI command
    whose body is not one `with` block. Prefer `with sigterm_as_interrupt():`."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_interrupt)
