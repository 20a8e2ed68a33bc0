"""ProcessRuntime: the ContainerRuntime contract (seams/docker/protocol.py) for engines run as host processes.

What Docker guarantees for a container, this gives a process: it runs detached (its own session and process
group, under a supervisor that survives the CLI: supervise.py), is found again by name or id from its state
file (state.py), is stopped with SIGTERM to its group and SIGKILL after the timeout, leaves no process of its
group behind, never signals a process that merely reuses a recorded pid nor another user's (group.py), logs
to a file per launch (logs.py), and gets exactly its spec's environment plus an allow-list (state.py).

A host process sees the host: a spec's mounts, GPUs, network and IPC modes, devices, capabilities and /dev/shm
size are not applied (its paths are host paths already); its ulimits are, where this user may set them.
"""

from __future__ import annotations

import os
import platform
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from metralectl.core.labels import LABEL_MANAGED, LABEL_OWNER, owner
from metralectl.seams.docker.containers import ContainerInfo
from metralectl.seams.docker.endpoints import Endpoint
from metralectl.seams.docker.errors import RuntimeCause, RuntimeFailure
from metralectl.seams.docker.images import ImageState
from metralectl.seams.process import PROCESS_ENDPOINT_URL, group, images, launch, logs, state

if TYPE_CHECKING:
    from metralectl.core.render import ContainerSpec

KILL_WAIT_S = 10.0  # after SIGKILL: the kernel takes the group down at once; this bounds a stuck wait
RECORD_WAIT_S = 5.0  # after the engine's exit: its supervisor records it (a moment)


def process_endpoint() -> Endpoint:
    return Endpoint(PROCESS_ENDPOINT_URL, "process")


class ProcessRuntime:
    """Engines as host processes on this machine (implements protocol.ContainerRuntime)."""

    def __init__(self, endpoint: Endpoint | None = None, *, log_limit: int = logs.LOG_LIMIT,
                 keep_logs: int = logs.KEEP_LAUNCHES) -> None:
        self.endpoint = endpoint or process_endpoint()
        self.log_limit = log_limit
        self.keep_logs = keep_logs

    # --- "the daemon": this machine ---------------------------------------------------------------------------
    def server_version(self) -> str:
        return f"host processes ({platform.system()} {platform.release()})"

    def info(self) -> dict[str, Any]:
        uname = platform.uname()
        return {"ID": _machine_id(), "Name": socket.gethostname(), "Architecture": uname.machine,
                "OperatingSystem": uname.system, "KernelVersion": uname.release, "OSType": uname.system.lower(),
                "ServerVersion": self.server_version(), "Driver": "process", "Runtimes": {},
                "NCPU": os.cpu_count() or 0, "DockerRootDir": str(state.states_dir().root)}

    def daemon_identity(self) -> tuple[str, str, str]:
        """(identity, host name, CPU architecture) of this machine: its machine id, its name, and where the
        processes' state is kept (two users' states are two "daemons")."""
        info = self.info()
        return f"{info['ID']}|{info['Name']}|{info['DockerRootDir']}", str(info["Name"]), str(info["Architecture"])

    # --- "images": executables ----------------------------------------------------------------------------------
    def image_state(self, ref: str, revision_label: str | None = None) -> ImageState:
        from metralectl.core.images import machine_platform
        from metralectl.seams import machine

        return images.image_state(ref, machine_platform(machine.cpu_arch()))

    def pull_image(self, ref: str, on_progress: Any = None, platform: str | None = None) -> ImageState:
        found = self.image_state(ref)
        if found.present:
            return found
        path = ref.split(":", 1)[1] if ":" in ref else ref
        reason = getattr(found, "reason", None) or f"{path} is missing"
        raise RuntimeFailure(RuntimeCause.PULL_FAILED, f"{ref}: nothing to pull for an engine run as a host process "
                             f"({reason})", images.install_hint(path))

    # --- processes ------------------------------------------------------------------------------------------------
    def containers(self, *, managed_only: bool = True, all_states: bool = True, mine: bool = True) -> list[ContainerInfo]:
        """The launches recorded here; managed_only: metralectl's engines, with mine only this user's (by the
        owner label, as for containers)."""
        out = []
        for name in state.names():
            found = state.read(name)
            if found is None:
                continue
            info = state.info(found)
            if managed_only and (info.labels.get(LABEL_MANAGED) != "true"
                                 or (mine and info.labels.get(LABEL_OWNER) != owner())):
                continue
            if all_states or info.running:
                out.append(info)
        return out

    def inspect(self, name_or_id: str) -> ContainerInfo | None:
        found = state.find(name_or_id)
        return state.info(found) if found is not None else None

    def create_and_start(self, spec: ContainerSpec, extra_labels: dict[str, str] | None = None) -> ContainerInfo:
        """Start spec's engine as a host process; a failed or interrupted start leaves nothing behind."""
        launch.create_and_start(spec, {**spec.labels, **(extra_labels or {})}, self.log_limit, self.keep_logs)
        info = self.inspect(spec.name)
        if info is None:
            raise RuntimeFailure(RuntimeCause.VANISHED, f"{spec.name} vanished right after it started")
        return info

    def remove_if_labelled(self, name: str, labels: dict[str, str]) -> bool:
        found = self.inspect(name)
        if found is None or any(found.labels.get(k) != v for k, v in labels.items()):
            return False
        self.remove(found.id, force=True)
        return True

    def stop(self, name_or_id: str, timeout_s: float = 30.0) -> None:
        """SIGTERM to the engine's group, then SIGKILL once timeout_s has passed; returns once no process of the
        group is left and the exit is recorded."""
        found = state.find(name_or_id)
        if found is None:
            return
        engine = found.get("engine")
        if not isinstance(engine, dict):
            self._end_supervisor(found)  # not started yet: the supervisor ends the launch
            return
        if not (group.is_running(engine) or group.members(engine)):
            self._await_record(found)
            return
        group.signal_group(engine, signal.SIGTERM)
        if not _wait(lambda: not group.members(engine), timeout_s):
            group.signal_group(engine, signal.SIGKILL)
            _wait(lambda: not group.members(engine), KILL_WAIT_S)
        self._await_record(found)

    def kill(self, name_or_id: str) -> None:
        found = state.find(name_or_id)
        if found is None:
            return
        if not isinstance(found.get("engine"), dict):
            self._end_supervisor(found)
            return
        group.signal_group(found["engine"], signal.SIGKILL)

    def remove(self, name_or_id: str, *, force: bool = False) -> None:
        """Forget a launch (its log stays); a running one only with force (killed first), as Docker does."""
        found = state.find(name_or_id)
        if found is None:
            return
        if state.status(found) != "exited":
            if not force:
                raise RuntimeFailure(RuntimeCause.CONFLICT,
                                     f"conflict: You cannot remove a running process {found['name']} "
                                     f"({state.engine_id(found)}). Stop it before attempting removal or force remove")
            self.kill(found["name"])
            _wait(lambda: not group.members(found.get("engine")), KILL_WAIT_S)
        self._end_supervisor(found)
        with state.locked() as owned:
            state.delete(str(found["name"]), str(found["launch"]), owned)

    def wait_exit(self, name_or_id: str, timeout_s: float) -> int | None:
        """The exit code once the engine has stopped (None if it still runs after timeout_s); -1 when it ended but
        nobody recorded how (its supervisor was killed): ended, the code unknown (ContainerInfo.exit_code None)."""
        found = state.find(name_or_id)
        if found is None:
            return 0
        name, launch_id = str(found["name"]), found.get("launch")

        def ended() -> dict[str, Any] | None:
            now = state.read(name)
            if now is None or now.get("launch") != launch_id:
                return {"exit": {"code": 0}}  # removed meanwhile: as Docker answers for a container gone
            return now if state.status(now) == "exited" else None

        deadline = time.monotonic() + timeout_s
        while (now := ended()) is None:
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
        code = (now.get("exit") or {}).get("code")
        return code if isinstance(code, int) else -1

    def container_pids(self, name_or_id: str) -> set[int]:
        """The engine's group: its running processes (empty when nothing of it runs)."""
        found = state.find(name_or_id)
        return group.members(found.get("engine")) if found is not None else set()

    # --- logs and probes ------------------------------------------------------------------------------------------
    def log_tail(self, name_or_id: str, lines: int = 50) -> list[str]:
        found = state.find(name_or_id)
        if found is None or lines <= 0:
            return []
        return logs.tail(str(found.get("log", "")), lines)

    def follow_logs(self, name_or_id: str, *, tail: int | str = "all", stop: threading.Event | None = None,
                    since: int | None = None) -> Iterator[str]:
        """Lines as they are written; ends once the engine's group is gone (after its last line) or `stop` is set."""
        found = state.find(name_or_id)
        if found is None:
            return
        name, launch_id = str(found["name"]), found.get("launch")

        def alive() -> bool:
            now = state.read(name)
            return now is not None and now.get("launch") == launch_id and state.status(now) != "exited"

        yield from logs.follow(str(found.get("log", "")), tail_lines=tail, alive=alive, stop=stop, since=since)

    def run_probe(self, image: str, script: str, *, read_only: dict[str, str] | None = None,
                  timeout_s: float = 60.0) -> tuple[int | None, str]:
        """`sh -c script` on this machine (a host process sees the host's network and files). Refused with
        mounts: the one caller (an EP=2 launch's node probe) reads the HF cache where it would have mounted it,
        so on the host it would report the cache absent, a wrong answer."""
        if read_only:
            raise RuntimeFailure(RuntimeCause.REFUSED,
                                 "the host-process runtime runs no probe container (an EP=2 launch's node probe "
                                 "reads the HF cache where a container would mount it)",
                                 "run multi-node (EP=2) launches with Docker on each node")
        try:
            done = subprocess.run(["/bin/sh", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, timeout=timeout_s, start_new_session=True,
                                  env=state.engine_environment({}))
        except subprocess.TimeoutExpired as exc:
            out = exc.output or b""
            return None, (out if isinstance(out, bytes) else out.encode()).decode("utf-8", "replace")
        return done.returncode, done.stdout.decode("utf-8", "replace")

    # --- helpers --------------------------------------------------------------------------------------------------
    def _end_supervisor(self, found: dict[str, Any]) -> None:
        """Tell a launch's supervisor to end it (SIGTERM: it kills the engine's group) and wait for it; SIGKILL
        if it does not. Only the supervisor the state names, verified."""
        supervisor = found.get("supervisor")
        if not group.is_running(supervisor):
            return
        group.signal_one(supervisor, signal.SIGTERM)
        if not _wait(lambda: not group.is_running(supervisor), RECORD_WAIT_S):
            group.signal_one(supervisor, signal.SIGKILL)
            _wait(lambda: not group.is_running(supervisor), KILL_WAIT_S)

    def _await_record(self, found: dict[str, Any]) -> None:
        """Once the engine is gone, its supervisor (if it runs) records the exit: wait for that, briefly."""
        name, launch_id = str(found["name"]), found.get("launch")

        def recorded() -> bool:
            now = state.read(name)
            return now is None or now.get("launch") != launch_id or state.status(now) == "exited"

        _wait(recorded, RECORD_WAIT_S)

    # --- the connection: none to close ----------------------------------------------------------------------------
    def close(self) -> None:
        pass

    def __enter__(self) -> ProcessRuntime:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _wait(condition: Any, timeout_s: float, poll_s: float = 0.05) -> bool:
    """Whether condition() held within timeout_s (polled)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def _machine_id() -> str:
    for candidate in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            text = Path(candidate).read_text().strip()
        except OSError:
            continue
        if text:
            return text
    return socket.gethostname()
