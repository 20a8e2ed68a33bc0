"""This machine's engines, whichever way they run: its Docker daemon's containers and its host processes
(`runtime: process`, seams/process), as one ContainerRuntime.

Everything that asks "what serves here?" (ps, logs, stop, swap, run's one-model-per-box rule and --replace,
chat, bench, top, the dashboard, the agent's page) opens this instead of the Docker runtime alone, so a host
process is found, refused, replaced, swapped and stopped by the same code as a container. Calls about one
engine go to the runtime that holds it (a state file of ours names a host process; anything else is Docker's);
a new one starts where its spec says (a `process:` image is a host process); images, probes and the daemon's
facts are Docker's.

Where Docker cannot be reached: the host processes alone, Docker's error kept for whatever needs Docker (a
container's start, an image). Opening refuses with Docker's own error only when Docker is needed to know
anything: no engine ever ran here as a host process (`ps` on a box without Docker says what it always said).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

from metralectl.errors import MetralError

if TYPE_CHECKING:
    from metralectl.core.render import ContainerSpec
    from metralectl.seams.docker.containers import ContainerInfo
    from metralectl.seams.docker.images import ImageState
    from metralectl.seams.docker.protocol import ContainerRuntime

PROCESS_IMAGE_PREFIX = "process:"  # core.render's and seams.process's; repeated so `ps` need not load them


class LocalRuntime:
    """Implements seams.docker.protocol.ContainerRuntime over Docker (None: unreachable, `docker_error` says why)
    and the host-process runtime. Closes both."""

    def __init__(self, docker: ContainerRuntime | None, processes: ContainerRuntime | None,
                 docker_error: MetralError | None = None, *,
                 process_factory: Callable[[], ContainerRuntime] | None = None) -> None:
        self.docker = docker
        self._processes = processes
        self._process_factory = process_factory
        self.docker_error = docker_error
        self.endpoint = docker.endpoint if docker is not None else self.processes.endpoint

    @property
    def processes(self) -> ContainerRuntime:
        """The host-process runtime, made on first use (`ps` where no engine ever ran as a process loads none)."""
        if self._processes is None:
            self._processes = (self._process_factory or process_runtime)()
        return self._processes

    def _any_process(self) -> bool:
        """Whether a host process may be asked about: one was handed in, or one ever ran here."""
        return self._processes is not None or has_process_states()

    def _need_docker(self) -> ContainerRuntime:
        if self.docker is None:
            raise self.docker_error or MetralError("Docker is not reachable")
        return self.docker

    def _holder(self, name_or_id: str) -> ContainerRuntime:
        """The runtime that holds this engine: ours as a host process when its state says so, else Docker."""
        if self._any_process() and self.processes.inspect(name_or_id) is not None:
            return self.processes
        return self._need_docker()

    # the daemon: Docker's
    def server_version(self) -> str:
        return self._need_docker().server_version()

    def info(self) -> dict[str, Any]:
        return self._need_docker().info()

    def daemon_identity(self) -> tuple[str, str, str]:
        return self._need_docker().daemon_identity()

    # images: a `process:` one is the program's file
    def image_state(self, ref: str, revision_label: str | None = None) -> ImageState:
        if ref.startswith(PROCESS_IMAGE_PREFIX):
            return self.processes.image_state(ref, revision_label)
        return self._need_docker().image_state(ref, revision_label)

    def pull_image(self, ref: str, on_progress: Any = None, platform: str | None = None) -> ImageState:
        if ref.startswith(PROCESS_IMAGE_PREFIX):
            return self.processes.pull_image(ref, on_progress, platform)
        return self._need_docker().pull_image(ref, on_progress, platform)

    # engines
    def containers(self, *, managed_only: bool = True, all_states: bool = True,
                   mine: bool = True) -> list[ContainerInfo]:
        found = self.docker.containers(managed_only=managed_only, all_states=all_states, mine=mine) \
            if self.docker is not None else []
        if not self._any_process():
            return found
        return found + self.processes.containers(managed_only=managed_only, all_states=all_states, mine=mine)

    def inspect(self, name_or_id: str) -> ContainerInfo | None:
        found = self.processes.inspect(name_or_id) if self._any_process() else None
        if found is not None or self.docker is None:
            return found
        return self.docker.inspect(name_or_id)

    def create_and_start(self, spec: ContainerSpec, extra_labels: dict[str, str] | None = None) -> ContainerInfo:
        runtime = self.processes if spec.image.startswith(PROCESS_IMAGE_PREFIX) else self._need_docker()
        return runtime.create_and_start(spec, extra_labels)

    def remove_if_labelled(self, name: str, labels: dict[str, str]) -> bool:
        """A start interrupted before its id was known: it may be either (the labels name the run)."""
        removed = self.processes.remove_if_labelled(name, labels) if self._any_process() else False
        if self.docker is not None:
            removed = self.docker.remove_if_labelled(name, labels) or removed
        return removed

    def stop(self, name_or_id: str, timeout_s: float = 30.0) -> None:
        self._holder(name_or_id).stop(name_or_id, timeout_s)

    def kill(self, name_or_id: str) -> None:
        self._holder(name_or_id).kill(name_or_id)

    def remove(self, name_or_id: str, *, force: bool = False) -> None:
        self._holder(name_or_id).remove(name_or_id, force=force)

    def wait_exit(self, name_or_id: str, timeout_s: float) -> int | None:
        return self._holder(name_or_id).wait_exit(name_or_id, timeout_s)

    def container_pids(self, name_or_id: str) -> set[int]:
        return self._holder(name_or_id).container_pids(name_or_id)

    # logs and probes
    def log_tail(self, name_or_id: str, lines: int = 50) -> list[str]:
        return self._holder(name_or_id).log_tail(name_or_id, lines)

    def follow_logs(self, name_or_id: str, *, tail: int | str = "all", stop: threading.Event | None = None,
                    since: int | None = None) -> Iterator[str]:
        return self._holder(name_or_id).follow_logs(name_or_id, tail=tail, stop=stop, since=since)

    def run_probe(self, image: str, script: str, *, read_only: dict[str, str] | None = None,
                  timeout_s: float = 60.0) -> tuple[int | None, str]:
        return self._need_docker().run_probe(image, script, read_only=read_only, timeout_s=timeout_s)

    # the connections
    def close(self) -> None:
        try:
            if self.docker is not None:
                self.docker.close()
        finally:
            if self._processes is not None:
                self._processes.close()

    def __enter__(self) -> LocalRuntime:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def process_runtime() -> ContainerRuntime:
    """The host-process runtime (seams/process; what open_runtime gives for its endpoint, made here directly so a
    test that hands out a fake Docker runtime through open_runtime does not get it twice)."""
    from metralectl.seams.process.runtime import ProcessRuntime

    return ProcessRuntime()


def open_local(*, need_docker: bool = True, timeout: float = 30.0,
               docker: Callable[[], ContainerRuntime] | None = None,
               processes: Callable[[], ContainerRuntime] | None = None) -> LocalRuntime:
    """This machine's runtime. Docker unreachable: the host processes alone, unless `need_docker` and no host
    process of ours is recorded here (then Docker's error, exactly as before host processes existed). A launch of
    a host process passes need_docker=False: it needs no Docker."""
    from metralectl.seams.docker.runtime import open_runtime

    procs = processes() if processes is not None else None
    try:
        daemon = docker() if docker is not None else open_runtime(timeout=timeout)
    except BaseException as exc:
        if not isinstance(exc, MetralError) or (need_docker and not _recorded(procs)):
            if procs is not None:
                procs.close()
            raise
        return LocalRuntime(None, procs, exc)
    return LocalRuntime(daemon, procs)


def has_process_states() -> bool:
    """Whether an engine ever ran here as a host process: the process runtime's state directory exists
    (seams/process/state.states_dir, where it is checked to be; read here without loading that runtime)."""
    import os

    from metralectl import paths

    return os.path.isdir(paths.metrale_home() / "state" / "processes")


def _recorded(procs: ContainerRuntime | None) -> bool:
    """This machine runs engines as host processes (one runs, or one ran)."""
    try:
        return has_process_states() or (procs is not None and bool(procs.containers(managed_only=True, mine=False)))
    except (MetralError, OSError):
        return False
