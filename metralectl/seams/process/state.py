"""The host-process runtime's state: one JSON file per name under <METRALE_HOME>/state/processes, and what a
state says now.

A state is written atomically (ownedfs.Owned.put: temp file, fsync, rename) inside a directory metralectl owns
(no symlink followed on the way), read under a cap (a FIFO or a huge file is refused, not read), and changed
only under the directory's lock (`locked()`), by the CLI (claim, remove) and the launch's supervisor (the
engine's identity, then its exit), so a removal is never undone by a late write. It keeps the recipe's labels,
the spec's hash, the owner (uid), the port, the argv, the names of the environment's variables (never their
values: a token passed to the engine stays out of the file), and the identities of the engine and of its
supervisor (group.identity_of). A file another user owns is skipped: never read as ours, never changed.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import stat
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from metralectl import paths
from metralectl.ownedfs import Owned, OutsideOwned
from metralectl.seams.docker.containers import ContainerInfo
from metralectl.seams.process import group

SCHEMA = 1
STATE_LIMIT = 1 << 20  # a state holds an argv and labels; far more is not ours
# What an engine gets from the caller's environment besides what its spec states (docs/security.md).
ENV_ALLOWED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR")
ENV_ALLOWED_PREFIXES = ("LC_",)
# Docker's rule for a container's name; here it is also a file name.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def states_dir() -> Owned:
    return Owned(paths.metrale_home() / "state" / "processes", "the host-process runtime's state")


def valid_name(name: str) -> bool:
    return bool(_NAME.fullmatch(name))


def engine_environment(spec_env: Mapping[str, str], caller: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the engine gets: the allow-listed variables of the caller's environment, then exactly the spec's."""
    source = os.environ if caller is None else caller
    env = {k: v for k, v in source.items() if k in ENV_ALLOWED or k.startswith(ENV_ALLOWED_PREFIXES)}
    env.update(spec_env)
    return env


def now_iso() -> str:
    """A moment as Docker writes StartedAt / FinishedAt (UTC, nanoseconds, Z)."""
    moment = datetime.now(timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def new_launch_id() -> str:
    """One launch's id: sortable by time (log files are kept by it), unique."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + os.urandom(4).hex()


@contextmanager
def locked(store: Owned | None = None) -> Iterator[Owned]:
    """The state directory, under its lock (flock: released by the kernel if its holder dies)."""
    owned = store or states_dir()
    owned.make_root(0o700)
    fd = owned.open_write(".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield owned
    finally:
        os.close(fd)


def _file(name: str) -> str:
    return f"{name}.json"


def read(name: str, store: Owned | None = None) -> dict[str, Any] | None:
    """The state of `name`, or None: missing, another user's, not JSON, or not a state of this schema."""
    owned = store or states_dir()
    if not valid_name(name):
        return None
    st = owned.lstat(_file(name)) if os.path.isdir(owned.root) else None
    if st is None or st.st_uid != os.geteuid():
        return None
    try:
        value = json.loads(owned.read_bytes(_file(name), STATE_LIMIT))
    except (OSError, ValueError, OutsideOwned, RecursionError):
        return None
    if not isinstance(value, dict) or value.get("schema") != SCHEMA or value.get("name") != name:
        return None
    if value.get("owner_uid") != os.geteuid():
        return None
    return value


def write(state: dict[str, Any], store: Owned) -> None:
    """Replace the state (the caller holds the lock)."""
    store.put(_file(str(state["name"])), json.dumps(state, indent=2, sort_keys=True) + "\n", mode=0o600)


def delete(name: str, launch: str, store: Owned) -> bool:
    """Remove the state of that very launch (the caller holds the lock); whether there was one."""
    found = read(name, store)
    if found is None or found.get("launch") != launch:
        return False
    return store.remove_file(_file(name))


def update(name: str, launch: str, changes: dict[str, Any], store: Owned | None = None) -> bool:
    """Merge `changes` into the state of that very launch, under the lock; False when it is gone (removed)."""
    with locked(store) as owned:
        found = read(name, owned)
        if found is None or found.get("launch") != launch:
            return False
        found.update(changes)
        write(found, owned)
        return True


def names(store: Owned | None = None) -> list[str]:
    owned = store or states_dir()
    if not os.path.isdir(owned.root):
        return []
    return [entry[:-5] for entry in owned.listdir() if entry.endswith(".json") and valid_name(entry[:-5])]


def engine_id(state: dict[str, Any]) -> str:
    """The id a launch is known by: "<pid>-<start tick>" of its engine once it started, else its launch id."""
    engine = state.get("engine")
    if isinstance(engine, dict) and isinstance(engine.get("pid"), int):
        return f"{engine['pid']}-{engine.get('start_ticks')}"
    return str(state.get("launch", ""))


def status(state: dict[str, Any]) -> str:
    """running | created | exited, from the processes themselves (a recorded exit is final).

    running: the engine runs, or something of its group does (the supervisor kills what is left when the leader
    exits; without a supervisor what is left still holds a port or a GPU), or the engine has gone and its
    supervisor is recording that. created: the supervisor runs and has not started the engine yet."""
    if isinstance(state.get("exit"), dict):
        return "exited"
    engine, supervisor = state.get("engine"), state.get("supervisor")
    if isinstance(engine, dict):
        if group.is_running(engine) or group.is_running(supervisor) or group.members(engine):
            return "running"
        return "exited"
    return "created" if group.is_running(supervisor) else "exited"


def info(state: dict[str, Any]) -> ContainerInfo:
    """What a state says now, as a container's inspect would."""
    now = status(state)
    ended = _mapping(state.get("exit"))
    code = ended.get("code") if now == "exited" else None
    argv = state.get("argv") if isinstance(state.get("argv"), list) else []
    labels = _mapping(state.get("labels"))
    return ContainerInfo(
        id=engine_id(state), name=str(state.get("name", "")), image=str(state.get("image", "")), status=now,
        exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        oom_killed=bool(ended.get("oom_killed")), started_at=_text(state.get("started_at")),
        finished_at=_text(ended.get("finished_at")), labels={str(k): str(v) for k, v in labels.items()},
        command=tuple(str(a) for a in argv or ()))


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def find(name_or_id: str, store: Owned | None = None) -> dict[str, Any] | None:
    """The state a name, an engine id or a launch id names."""
    owned = store or states_dir()
    by_name = read(name_or_id, owned)
    if by_name is not None:
        return by_name
    for name in names(owned):
        found = read(name, owned)
        if found is not None and name_or_id in (engine_id(found), found.get("launch")):
            return found
    return None


def claim(state: dict[str, Any], store: Owned) -> dict[str, Any] | None:
    """Write a new launch's state unless the name is taken (the caller holds the lock): the state in the way,
    or None once written."""
    found = read(str(state["name"]), store)
    if found is not None:
        return found
    st = store.lstat(_file(str(state["name"])))
    if st is not None and (st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode)):
        return {"name": state["name"], "foreign": True}  # another user's file, or not a file: never replaced
    write(state, store)
    return None


def state_path(name: str) -> Path:
    return states_dir().path(_file(name))
