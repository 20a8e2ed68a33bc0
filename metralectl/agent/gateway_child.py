"""The agent runs the gateway when it is enabled (`metralectl gateway enable`): a `metralectl gateway` child
process, started when the agent starts or the setting turns on, restarted with a growing pause when it exits
(1 s doubling to 60 s, so a port another program holds is not retried in a tight loop), stopped when the setting
turns off or the agent stops. The setting is `<config>/gateway.json`, read again every few seconds; the child's
stderr goes to `<agent dir>/gateway.log` (capped: cut to its last half past 1 MiB at each start).

A child, not a thread of the agent: the gateway is an asyncio process of its own whose relay must not share a
GIL with the agent's HTTP servers, and `ps` finds it by its own state record (gateway/state.py).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from metralectl import atomicfile, filecap, paths
from metralectl.errors import MetralError

log = logging.getLogger("metralectl.agent")
SETTING = "gateway.json"
LISTEN_RE = re.compile(r"(\[[0-9a-fA-F:]+\]|[0-9.]+|localhost):[0-9]{1,5}")
LOG_LIMIT = 1024 * 1024
MAX_PAUSE_S = 60.0


def setting_path() -> Path:
    return paths.config_dir() / SETTING


def load_setting(path: Path | None = None) -> dict[str, Any]:
    """{"enabled": bool, "listen": str | None}; a missing, unreadable or malformed file is "disabled" (and said)."""
    path = path or setting_path()
    try:
        data = json.loads(filecap.read_text(path, 64 * 1024, "the gateway setting"))
    except FileNotFoundError:
        return {"enabled": False, "listen": None}
    except (OSError, ValueError, RecursionError, MetralError) as exc:  # a bad setting must not stop the agent
        return {"enabled": False, "listen": None, "error": f"{path}: {exc}"}
    enabled, listen = (data.get("enabled"), data.get("listen")) if isinstance(data, dict) else (None, None)
    if enabled is not True or (listen is not None and not (isinstance(listen, str) and LISTEN_RE.fullmatch(listen))):
        return {"enabled": False, "listen": None,
                "error": None if enabled is False else f"{path}: not {{\"enabled\": true|false, \"listen\": HOST:PORT}}"}
    return {"enabled": True, "listen": listen}


def save_setting(enabled: bool, listen: str | None, path: Path | None = None) -> Path:
    path = path or setting_path()
    atomicfile.write_atomic(path, json.dumps({"enabled": enabled, "listen": listen}, indent=2) + "\n", mode=0o600)
    return path


class GatewayChild:
    def __init__(self, log_dir: Path) -> None:
        self.log_path = log_dir / "gateway.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.listen: str | None = None
        self.failures = 0
        self.next_start = 0.0
        self.last_exit: str | None = None
        self.said_error: str | None = None

    def tick(self) -> None:
        """Bring the child in line with the setting: start, restart after a pause, or stop."""
        setting = load_setting()
        if setting.get("error") and setting["error"] != self.said_error:
            self.said_error = setting["error"]
            log.warning("the gateway setting is not read: %s", setting["error"])
        if not setting["enabled"]:
            self.stop()
            self.failures, self.next_start = 0, 0.0
            return
        listen = setting["listen"]
        if self.proc is not None and self.proc.poll() is None:
            if listen == self.listen:
                return
            self.stop()  # another address: a new child there
        elif self.proc is not None:
            self.failures += 1
            pause = min(MAX_PAUSE_S, 2.0 ** (self.failures - 1))
            self.last_exit = f"exited {self.proc.returncode}; starting again in {pause:g} s (see {self.log_path})"
            log.warning("the gateway %s", self.last_exit)
            self.proc, self.next_start = None, time.monotonic() + pause
        if time.monotonic() >= self.next_start:
            self._start(listen)

    def _start(self, listen: str | None) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._cap_log()
        argv = [sys.executable, "-m", "metralectl", "gateway", *(["--listen", listen] if listen else [])]
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=out,
                                         start_new_session=True)
        self.listen = listen
        log.info("gateway started (pid %d%s)", self.proc.pid, f", --listen {listen}" if listen else "")

    def _cap_log(self) -> None:
        try:
            if self.log_path.is_symlink() or self.log_path.stat().st_size <= LOG_LIMIT:
                return
        except FileNotFoundError:
            return
        with open(self.log_path, "rb") as old:
            old.seek(-LOG_LIMIT // 2, os.SEEK_END)
            tail = old.read()
        atomicfile.write_atomic(self.log_path, tail)

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)  # the gateway stops serving and removes its state record
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.info("gateway stopped (pid %d)", proc.pid)

    def info(self) -> dict[str, Any]:
        running = self.proc is not None and self.proc.poll() is None
        return {"running": running, "pid": self.proc.pid if running and self.proc else None,
                "listen": self.listen if running else None, "last_exit": self.last_exit}
