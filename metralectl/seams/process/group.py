"""An engine's processes: the one a state names (pid, start tick, boot, executable, owner) and its process group,
and signals sent only to processes verified to be them.

A state file outlives its processes: after an exit, a reboot or a long time its pid may belong to another
program, of this user or another. Such a pid is never signalled nor reported as ours: a process is ours only
when its pid, its start time (clock ticks since boot, /proc/PID/stat field 22), the boot, its executable and
its owner (this uid) all match what was recorded. A signal to one process goes through a pidfd opened first
and verified after (the pidfd then names the verified process, whatever happens to the pid meanwhile).

The engine leads a session and a process group of its own (setsid), so its group id is its pid and stays so.
While the leader is verified alive the group exists and is ours: killpg reaches it and every process the
engine started in it. Once the leader is gone, the members left (found in /proc: that group, this uid, started
no earlier than the leader) are signalled one by one, each verified. A member that left the group
(its own setsid) is out of reach, as it would be for `kill -- -PGID`.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from metralectl.seams.hostproc import executable, start_ticks


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (the state) on; None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()


def _uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _same_exe(recorded: object, now: str | None) -> bool:
    """The executable as recorded; one replaced on disk since (a rebuilt binary) reads "PATH (deleted)"."""
    if not isinstance(recorded, str) or now is None:
        return recorded == now
    return now == recorded or now == f"{recorded} (deleted)" or recorded == f"{now} (deleted)"


def identity_of(pid: int) -> dict[str, Any] | None:
    """What names this process for as long as it lives: {pid, start_ticks, boot_id, exe}; None when there is no
    such process of this user."""
    if _uid(pid) != os.geteuid():
        return None
    ticks = start_ticks(pid)
    if ticks is None:
        return None
    return {"pid": pid, "start_ticks": ticks, "boot_id": _boot_id(), "exe": executable(pid)}


def is_running(record: object) -> bool:
    """Whether the process a record names runs (a zombie, exited and not yet reaped, does not)."""
    if not isinstance(record, dict):
        return False
    pid = record.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        return False
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X") or _uid(pid) != os.geteuid():
        return False
    try:
        ticks = int(fields[19])
    except (IndexError, ValueError):
        return False
    if ticks != record.get("start_ticks") or _boot_id() != record.get("boot_id"):
        return False
    return _same_exe(record.get("exe"), executable(pid))


def members(record: object) -> set[int]:
    """The running processes of the group a record's leader leads (the leader included while it runs): this
    uid's, in that group, started no earlier than the leader, in this boot. Empty for a record of another
    boot, and once a process that is not the leader holds the leader's pid (its group is gone then)."""
    if not isinstance(record, dict) or record.get("boot_id") != _boot_id():
        return set()
    pgid, since = record.get("pid"), record.get("start_ticks")
    if not isinstance(pgid, int) or isinstance(pgid, bool) or pgid <= 1 or not isinstance(since, int):
        return set()
    leader = _stat_fields(pgid)
    if leader is not None and not is_running(record) and leader[0] not in ("Z", "X"):
        return set()  # the pid is another process's now: a group id is never reused while its group lives
    found = set()
    uid = os.geteuid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is None or fields[0] in ("Z", "X") or len(fields) < 20:
            continue
        try:
            group, ticks = int(fields[2]), int(fields[19])
        except ValueError:
            continue
        if group == pgid and ticks >= since and _uid(int(entry.name)) == uid:
            found.add(int(entry.name))
    return found


def _member_still(pid: int, pgid: int, since: int) -> bool:
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X") or _uid(pid) != os.geteuid():
        return False
    try:
        return int(fields[2]) == pgid and int(fields[19]) >= since
    except (IndexError, ValueError):
        return False


def send(pid: int, sig: int, verify: Any) -> bool:
    """Signal `pid` only if verify() holds once a pidfd names it (so the signal reaches the verified process,
    never a successor with its pid); whether it was sent."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        fd = None  # no pidfds here (an old kernel): verify, then kill at once
    try:
        if not verify():
            return False
        if fd is None:
            os.kill(pid, sig)
        else:
            signal.pidfd_send_signal(fd, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if fd is not None:
            os.close(fd)


def signal_group(record: object, sig: int) -> bool:
    """`sig` to the group a record's leader leads: killpg while the leader is verified alive, else to each
    verified member left. Whether any process was signalled."""
    if not isinstance(record, dict):
        return False
    pgid = record["pid"] if isinstance(record.get("pid"), int) else 0
    if pgid > 1 and send(pgid, 0, lambda: is_running(record)):
        try:
            os.killpg(pgid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            pass
    since = record.get("start_ticks")
    sent = False
    if isinstance(since, int):
        for pid in members(record):
            sent = send(pid, sig, lambda pid=pid: _member_still(pid, pgid, since)) or sent  # type: ignore[misc]
    return sent


def signal_one(record: object, sig: int) -> bool:
    """`sig` to the one process a record names, if it is verified to be it."""
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
        return False
    return send(record["pid"], sig, lambda: is_running(record))
