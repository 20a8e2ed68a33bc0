"""Where a running gateway says it is, so `ps` (and the page, the agent) can show it: one small record per
gateway process in `<state>/gateways/<pid>.json`, written when it listens and removed when it stops.

A record is believed only while the process it names still runs (its pid, start time and boot, as host-process
engines are judged: seams/process/group.py), so a gateway killed with -9 leaves a record nobody shows, and the
next gateway to start removes it. What the gateway does now (models, waiting requests) is asked of its own
`/health`, which needs no key. Records are data from a file anyone of this user could have left: each is read
without following a link (O_NOFOLLOW), ours (this uid), capped, its fields checked; its URL only ever a literal
address, and asked only when it is this machine's (loopback, unspecified, or one this host can bind): a record
naming another host is shown as such, never contacted.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import stat
import time
from pathlib import Path
from typing import Any

from metralectl.seams.local_address import holds_address


MAX_RECORDS = 32
HEALTH_LIMIT = 64 * 1024
RECORD_LIMIT = 64 * 1024  # a record is a few hundred bytes
MONITOR_RE = re.compile(r"[A-Za-z0-9_-]{32,128}")
URL_RE = re.compile(r"http://(\[[0-9a-fA-F:]+\]|[0-9.]+):([0-9]{1,5})")


def records_dir() -> Path:
    from metralectl.seams import store

    return store.state_dir() / "gateways"


def record(url: str, keys: int, pid: int | None = None, monitor: str | None = None,
           cpus: str | None = None, busy_poll_ms: float = 0.0) -> Path | None:
    """Say that this process serves a gateway at `url`; the path written (None when this process cannot be
    named, which leaves it out of `ps` but serving). `monitor`: the credential that reads its /metrics when API keys
    are in force (`top`, the dashboard and the agent of this user read it here: the file is 0600 in this user's
    state directory; `ps --json` never prints it). `cpus`: its own CPUs (`--cpus`), as a CPU list; `busy_poll_ms`:
    its loop's window awake after each read (`--busy-poll`, 0: off)."""
    from metralectl.seams import store
    from metralectl.seams.process import group

    pid = pid or os.getpid()
    identity = group.identity_of(pid)
    if identity is None:
        return None
    forget_stale()
    path = records_dir() / f"{pid}.json"
    store.write_json(path, {"schema": 1, "url": url, "keys": keys, "identity": identity, "monitor": monitor,
                            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": cpus,
                            "busy_poll_ms": busy_poll_ms}, mode=0o600)
    return path


def remove(path: Path | None) -> None:
    if path is not None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def _read(path: Path) -> object:
    """The record's JSON, or None: a link (never followed out of the state dir), not a regular file, not this
    user's, larger than RECORD_LIMIT, or not JSON."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_size > RECORD_LIMIT:
            return None
        data = os.read(fd, RECORD_LIMIT + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        return None if len(data) > RECORD_LIMIT else json.loads(data)
    except (ValueError, RecursionError):
        return None


def _checked(path: Path) -> dict[str, Any] | None:
    data = _read(path)
    if not isinstance(data, dict) or data.get("schema") != 1:
        return None
    url, keys, identity, started = (data.get(k) for k in ("url", "keys", "identity", "started"))
    match = URL_RE.fullmatch(url) if isinstance(url, str) else None
    if match is None or not isinstance(identity, dict) or not isinstance(keys, int) or isinstance(keys, bool):
        return None
    try:
        ipaddress.ip_address(match.group(1).strip("[]"))
    except ValueError:
        return None
    if not 0 < int(match.group(2)) < 65536 or not 0 <= keys < 100_000:
        return None
    if path.stem != str(identity.get("pid")):
        return None  # a record under another pid's name: not what the gateway wrote
    monitor = data.get("monitor")
    return {"url": url, "pid": identity["pid"], "keys": keys, "identity": identity, "cpus": _cpus(data.get("cpus")),
            "busy_poll_ms": _busy_poll_ms(data.get("busy_poll_ms")),
            "started": started if isinstance(started, str) and len(started) <= 40 else None,
            "here": holds_address(match.group(1).strip("[]")),
            "monitor": monitor if isinstance(monitor, str) and MONITOR_RE.fullmatch(monitor) else None}


def _cpus(value: object) -> str | None:
    """A record's CPU list, as the gateway would write it (core/cpulist.py), else None: anyone may leave text here."""
    from metralectl.core.cpulist import parse, render

    if not isinstance(value, str) or len(value) > 200:
        return None
    try:
        return render(parse(value))
    except ValueError:
        return None


def _busy_poll_ms(value: object) -> float:
    """A record's --busy-poll window (ms), else 0: a number in --busy-poll's range, nothing else someone left here."""
    from metralectl.lifecycle.budget import BUSY_POLL_MAX_MS

    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= BUSY_POLL_MAX_MS:
        return 0.0  # (nan fails the range too)
    return float(value)


def _paths() -> list[Path]:
    directory = records_dir()
    try:
        return sorted(p for p in directory.iterdir() if p.suffix == ".json" and p.stem.isdigit())[:MAX_RECORDS]
    except OSError:
        return []


def running() -> list[dict[str, Any]]:
    """The gateways whose record names a process that still runs: {url, pid, keys, started, here}."""
    from metralectl.seams.process import group

    out = []
    for path in _paths():
        found = _checked(path)
        if found is not None and group.is_running(found.pop("identity")):
            found.pop("monitor")  # a credential: `ps --json` prints what this returns
            out.append(found)
    return out


def listed() -> list[dict[str, Any]]:
    """Every well-formed record, stale ones included: {url, pid, keys, started, monitor, running} (`top`, the
    dashboard and the page show a stale one as gone, never as serving; `monitor` reads its /metrics)."""
    from metralectl.seams.process import group

    out = []
    for path in _paths():
        found = _checked(path)
        if found is not None:
            out.append({**found, "running": group.is_running(found.pop("identity"))})
    return out


def forget_stale() -> None:
    """Remove the records of gateways that no longer run (this user's own state directory)."""
    from metralectl.seams.process import group

    for path in _paths():
        found = _checked(path)
        if found is None or not group.is_running(found["identity"]):
            if not path.is_symlink():
                remove(path)


def health(url: str, timeout: float = 0.5) -> dict[str, Any] | None:
    """The gateway's own /health answer (models, waiting requests), or None when it does not answer."""
    from metralectl.seams.httpclient import Failed, get_once

    match = URL_RE.fullmatch(url)
    if match is None or not holds_address(match.group(1).strip("[]")):
        return None  # never asked of another host on a record's word
    try:
        reply = get_once(match.group(1).strip("[]"), int(match.group(2)), "/health", timeout, limit=HEALTH_LIMIT + 1)
    except Failed:
        return None
    if reply.status != 200 or len(reply.body) > HEALTH_LIMIT:
        return None
    try:
        data = json.loads(reply.body)
    except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
        return None
    return data if isinstance(data, dict) else None
