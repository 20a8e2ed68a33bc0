"""`metralectl agent logs [-f]`: where the agent's log is, its last lines, and new ones as they come.

An agent from `agent start` writes `$METRALE_HOME/logs/agent.log` (its stderr); one run by the user's
systemd logs to the journal (`journalctl --user -u metralectl-agent`); one in a terminal logs there. The
lines are text from outside metralectl's control (a peer's or a client's words reach the log): the CLI
escapes each one (safetext.clean) before it prints it.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from metralectl import paths
from metralectl.errors import ExitCode, MetralError
from metralectl.seams import agent_files, user_systemd

WINDOW = 4 << 20  # what is read of the file's end for its last lines (the log is rotated at 8 MiB)
POLL_S = 0.25


@dataclass(frozen=True)
class LogSource:
    kind: str  # file | journal
    path: Path | None = None
    command: tuple[str, ...] = ()

    def describe(self) -> str:
        return paths.display(self.path) if self.path is not None else " ".join(self.command[:5])


def source(base: Path | None = None) -> LogSource:
    """The running agent's log; else the last detached agent's file; else the unit's journal."""
    from metralectl.app.agent_control import find

    agent = find(base).agent
    if agent is not None and agent.how == "systemd":
        return _journal()
    if agent is not None and agent.log:
        return LogSource("file", Path(agent.log))
    if agent is not None and agent.how == "foreground":  # an older file is another agent's: not this one's log
        raise MetralError(f"the agent (pid {agent.pid}) runs in a terminal and logs there, not to a file",
                          "stop it there and start it with `metralectl agent start` to keep its log in a file",
                          exit_code=ExitCode.FAILED)
    log = agent_files.log_path()
    if log.is_file():
        return LogSource("file", log)
    if user_systemd.unit_loaded():
        return _journal()
    raise MetralError(f"no agent log yet ({paths.display(log)} does not exist)",
                      "`metralectl agent start` starts the agent and keeps its log there", exit_code=ExitCode.FAILED)


def _journal() -> LogSource:
    command = user_systemd.journal_command(None, False)
    if command is None:
        raise MetralError("the agent runs under systemd, but there is no journalctl to read its log",
                          exit_code=ExitCode.UNAVAILABLE)
    return LogSource("journal", command=tuple(command))


def _tail(path: Path, count: int) -> tuple[list[str], int, int | None]:
    """(the last `count` lines, 0: all that fits in the window; the offset read up to; the file's inode)."""
    try:
        with open(path, "rb") as handle:
            st = os.fstat(handle.fileno())
            handle.seek(max(0, st.st_size - WINDOW))
            data = handle.read(WINDOW)
    except FileNotFoundError:
        return [], 0, None
    except OSError as exc:
        raise MetralError(f"cannot read the agent's log {paths.display(path)}: {exc.strerror or exc}") from None
    end = max(0, st.st_size - WINDOW) + len(data)
    complete = data[: data.rfind(b"\n") + 1]  # a line still being written is left to the follower
    lines = complete.decode("utf-8", errors="replace").splitlines()
    if st.st_size > WINDOW and lines:
        lines = lines[1:]  # the first one is cut
    end -= len(data) - len(complete)
    return (lines[-count:] if count > 0 else lines), end, st.st_ino


def last_lines(path: Path, count: int) -> list[str]:
    return _tail(path, count)[0]


def follow_file(path: Path, count: int) -> Iterator[str]:
    """The last lines, then each new complete line as it is written; a log replaced (rotated by the next
    `agent start`) or truncated is followed from its start. Ends only when the caller stops (Ctrl-C)."""
    lines, position, inode = _tail(path, count)
    yield from lines
    pending = b""
    while True:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            time.sleep(POLL_S)
            continue
        if st.st_ino != inode or st.st_size < position:
            inode, position, pending = st.st_ino, 0, b""
        if st.st_size <= position:
            time.sleep(POLL_S)
            continue
        with open(path, "rb") as handle:
            handle.seek(position)
            chunk = handle.read(1 << 20)
        position += len(chunk)
        *complete, pending = (pending + chunk).split(b"\n")
        if len(pending) > WINDOW:  # a "line" that never ends: shown in pieces rather than held
            complete.append(pending)
            pending = b""
        for line in complete:
            yield line.decode("utf-8", errors="replace")


def journal_lines(source: LogSource, count: int, follow: bool) -> Iterator[str]:
    command = list(source.command)
    command[command.index("all")] = str(count) if count > 0 else "all"
    if follow:
        command.append("-f")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        for raw in proc.stdout:
            yield raw.decode("utf-8", errors="replace").rstrip("\n")
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait()
