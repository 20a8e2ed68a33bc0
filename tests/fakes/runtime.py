"""One fake container runtime for every test: the whole `ContainerRuntime` contract, no daemon.

Containers go created → running → exited as Docker's do, carry labels, keep their log, and are listed,
inspected, stopped (SIGTERM, then SIGKILL after the timeout), killed and removed with Docker's rules.
What a started container does is a `Boot` script, chosen per container name, else per image, else the
runtime's default: log lines over time, a loopback HTTP server standing in for the engine (/health,
/v1/models, /metrics: readiness is an HTTP matter, polled by lifecycle/readiness.py on the container's
port), /health answers that change, an exit with a code (137 + OOMKilled for the kernel's OOM killer).

    rt = FakeRuntime(images=[image("metrale/x:latest")])
    rt.script("metralectl-a", engine_boot("org/model"))        # boots like the engine, then serves
    rt.script("metralectl-b", Boot((Log("Error: …"), Exit(1))))   # crashes while starting
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from types import TracebackType
from typing import Any

from metralectl.core.labels import LABEL_MANAGED, LABEL_OWNER
from metralectl.core.render import ContainerSpec, owner
from metralectl.seams.docker.containers import ContainerInfo
from metralectl.seams.docker.endpoints import Endpoint
from metralectl.seams.docker.errors import RuntimeCause, RuntimeFailure, refusal_cause
from metralectl.seams.docker.images import ImageState
from tests.fakes.boot import PREFIX, Action, Answer, Boot, Chatter, Exit, Listen, Log, engine_boot, engine_handler

__all__ = ["PREFIX", "Action", "Answer", "Boot", "Chatter", "Exit", "FakeContainer", "FakeRuntime", "Listen", "Log",
           "engine_boot", "image"]


def image(ref: str, platform: str = "linux/amd64", revision: str | None = "r1") -> ImageState:
    return ImageState(ref, True, "sha256:" + "1" * 64, revision, platform, (ref.rsplit(":", 1)[0] + "@sha256:2",))


# --- the containers ----------------------------------------------------------------------------------------------
@dataclass
class FakeContainer:
    id: str
    name: str
    image: str
    labels: dict[str, str]
    boot: Boot
    spec: ContainerSpec | None = None
    status: str = "created"
    exit_code: int | None = None
    oom: bool = False
    started_at: str | None = None
    finished_at: str | None = None
    log: list[str] = field(default_factory=list)
    pids: set[int] = field(default_factory=set)
    health: tuple[int, dict[str, Any]] | None = None  # None: nothing listens
    server: ThreadingHTTPServer | None = None
    halt: threading.Event = field(default_factory=threading.Event)
    command: tuple[str, ...] = ()
    mounts: tuple[str, ...] = ()

    def info(self) -> ContainerInfo:
        command = self.command or (self.spec.command if self.spec else ())
        mounts = self.mounts or (tuple(m.source for m in self.spec.mounts) if self.spec else ())
        return ContainerInfo(self.id, self.name, self.image, self.status,
                             self.exit_code if self.status in ("exited", "dead") else None, self.oom,
                             self.started_at, self.finished_at, dict(self.labels), command=command, mounts=mounts)

    def fill(self, text: str) -> str:
        bind = self.spec.bind if self.spec else "127.0.0.1"
        port = str(self.spec.port) if self.spec else "0"
        return text.replace("{bind}", bind).replace("{port}", port).replace("{model}", self.boot.model)


class FakeRuntime:
    """Implements metralectl.seams.docker.protocol.ContainerRuntime (tests/unit/test_fake_runtime.py checks)."""

    def __init__(self, *, images: Iterable[ImageState] | dict[str, ImageState] = (),
                 pullable: Iterable[ImageState] = (), endpoint: Endpoint | None = None, version: str = "27.3.1",
                 info: dict[str, Any] | None = None, identity: tuple[str, str, str] = ("ID|box|/var/lib/docker", "box",
                                                                                       "x86_64"),
                 default_boot: Boot = Boot(), probe: tuple[int | None, str] = (0, "")) -> None:
        self.endpoint = endpoint or Endpoint("unix:///var/run/docker.sock", "default")
        self.version = version
        self._info = info if info is not None else {"ServerVersion": version, "Runtimes": {"runc": {}}}
        self.identity = identity
        listed = images.values() if isinstance(images, dict) else images
        self.images: dict[str, ImageState] = {i.ref: i for i in listed}
        self.pullable: dict[str, ImageState] = {i.ref: i for i in pullable}
        self.default_boot = default_boot
        self.probe_answer = probe
        self._scripts: dict[str, list[Boot]] = {}
        self._by_id: dict[str, FakeContainer] = {}
        self._cond = threading.Condition()
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []  # every call, in order
        self.created: list[ContainerSpec] = []
        self.removed: list[str] = []  # what remove() was asked to remove, as named
        self.pulls: list[tuple[str, str | None]] = []
        self.probes: list[tuple[str, str]] = []
        self.closed = 0

    # -- scripting ---------------------------------------------------------------------------------------------
    def script(self, name_or_image: str, *boots: Boot) -> None:
        """The next starts of that container name (else image) run these boots in turn; the last one repeats."""
        self._scripts[name_or_image] = list(boots)

    def seed(self, info: ContainerInfo, *, pids: Iterable[int] = (), log: Iterable[str] = ()) -> None:
        """A container that already exists (as the daemon reports it), started before this test."""
        with self._cond:
            self._by_id[info.id] = FakeContainer(info.id, info.name, info.image, dict(info.labels), Boot(),
                                                 status=info.status, exit_code=info.exit_code, oom=info.oom_killed,
                                                 started_at=info.started_at, pids=set(pids), log=list(log),
                                                 command=info.command, mounts=info.mounts)

    def serving(self, recipe: str, *, image_ref: str = "img", owner_name: str | None = None) -> ContainerInfo:
        """Seed one of metralectl's running containers for `recipe` (ours, unless another owner is named)."""
        from metralectl.core.render import LABEL_RECIPE

        labels = {LABEL_MANAGED: "true", LABEL_OWNER: owner_name or owner(), LABEL_RECIPE: recipe}
        info = ContainerInfo(f"id-{recipe}", f"metralectl-{recipe}", image_ref, "running", None, False, None, None,
                             labels)
        self.seed(info)
        return info

    def all(self) -> list[ContainerInfo]:
        """Every container the daemon holds, whoever owns it (for the tests' final assertions)."""
        with self._cond:
            return [c.info() for c in self._by_id.values()]

    def health_of(self, name: str) -> tuple[int, dict[str, Any]] | None:
        with self._cond:
            found = self._find(name)
            return found.health if found else None

    def _boot_for(self, name: str, ref: str) -> Boot:
        for key in (name, ref):
            queue = self._scripts.get(key)
            if queue:
                return queue.pop(0) if len(queue) > 1 else queue[0]
        return self.default_boot

    def _note(self, method: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((method, args, kwargs))

    def _find(self, name_or_id: str) -> FakeContainer | None:
        if name_or_id in self._by_id:
            return self._by_id[name_or_id]
        return next((c for c in self._by_id.values() if c.name == name_or_id), None)

    # -- the daemon ----------------------------------------------------------------------------------------------
    def server_version(self) -> str:
        self._note("server_version")
        return self.version

    def info(self) -> dict[str, Any]:
        self._note("info")
        return dict(self._info)

    def daemon_identity(self) -> tuple[str, str, str]:
        return self.identity

    # -- images ----------------------------------------------------------------------------------------------------
    def image_state(self, ref: str, revision_label: str | None = None) -> ImageState:
        self._note("image_state", ref)
        return self.images.get(ref, ImageState(ref, False))

    def pull_image(self, ref: str, on_progress: Any = None, platform: str | None = None) -> ImageState:
        self._note("pull_image", ref, platform=platform)
        self.pulls.append((ref, platform))
        found = self.pullable.get(ref)
        if found is None:
            raise RuntimeFailure(RuntimeCause.PULL_FAILED, f"pulling {ref} failed: manifest unknown",
                                 "check the image name, your network/registry login (`docker login`)")
        if on_progress is not None:
            on_progress("abc123", "Downloading", 10, 100)
            on_progress("abc123", "Pull complete", None, None)
            on_progress(None, f"Digest: {found.digests[0].split('@')[-1] if found.digests else 'sha256:0'}", None, None)
        self.images[ref] = found
        return found

    # -- containers ----------------------------------------------------------------------------------------------
    def containers(self, *, managed_only: bool = True, all_states: bool = True, mine: bool = True) -> list[ContainerInfo]:
        self._note("containers", managed_only=managed_only, all_states=all_states, mine=mine)
        out = []
        for info in self.all():
            if managed_only and (info.labels.get(LABEL_MANAGED) != "true"
                                 or (mine and info.labels.get(LABEL_OWNER) != owner())):
                continue
            if all_states or info.running:
                out.append(info)
        return out

    def inspect(self, name_or_id: str) -> ContainerInfo | None:
        with self._cond:
            found = self._find(name_or_id)
            return found.info() if found else None

    def create_and_start(self, spec: ContainerSpec, extra_labels: dict[str, str] | None = None) -> ContainerInfo:
        self._note("create_and_start", spec.name)
        self.created.append(spec)
        if spec.image not in self.images:
            raise RuntimeFailure(RuntimeCause.IMAGE_MISSING, f"image not found: No such image: {spec.image}", "pull it first (`metralectl pull RECIPE`)")
        boot = self._boot_for(spec.name, spec.image)
        with self._cond:
            if self._find(spec.name) is not None:
                raise RuntimeFailure(RuntimeCause.CONFLICT, f'conflict: the container name "/{spec.name}" is already in use')
            container = FakeContainer(uuid.uuid4().hex * 2, spec.name, spec.image, {**spec.labels, **(extra_labels or {})},
                                      boot, spec)
            self._by_id[container.id] = container
        if boot.interrupt_in_create:
            raise KeyboardInterrupt  # the daemon made it; we never learnt its id
        if boot.start_error is not None:
            self._drop(container)  # as DockerRuntime does: a failed start leaves nothing behind
            raise RuntimeFailure(refusal_cause(500, boot.start_error), boot.start_error)
        with self._cond:
            container.status, container.started_at = "running", _now()
        threading.Thread(target=self._run, args=(container,), daemon=True, name=f"fake-{spec.name}").start()
        return container.info()

    def remove_if_labelled(self, name: str, labels: dict[str, str]) -> bool:
        self._note("remove_if_labelled", name, labels)
        found = self.inspect(name)
        if found is None or any(found.labels.get(k) != v for k, v in labels.items()):
            return False
        self.remove(found.id, force=True)
        return True

    def stop(self, name_or_id: str, timeout_s: float = 30.0) -> None:
        """SIGTERM; a container that ignores it is killed (137) once timeout_s has passed, as the daemon does."""
        self._note("stop", name_or_id, timeout_s=timeout_s)
        with self._cond:
            found = self._find(name_or_id)
        if found is None or found.status != "running":
            return
        if found.boot.sigterm_exit is not None:
            self._exit(found, found.boot.sigterm_exit)
            return
        with self._cond:
            self._cond.wait_for(lambda: found.status != "running", timeout_s)
        self._exit(found, 137)

    def kill(self, name_or_id: str) -> None:
        self._note("kill", name_or_id)
        with self._cond:
            found = self._find(name_or_id)
        if found is not None:
            self._exit(found, 137)

    def remove(self, name_or_id: str, *, force: bool = False) -> None:
        self._note("remove", name_or_id, force=force)
        self.removed.append(name_or_id)
        with self._cond:
            found = self._find(name_or_id)
        if found is None:
            return
        if found.status == "running" and not force:
            raise RuntimeFailure(RuntimeCause.CONFLICT, f"conflict: You cannot remove a running container {found.id}. Stop the container "
                                 "before attempting removal or force remove")
        self._exit(found, 137)
        self._drop(found)

    def wait_exit(self, name_or_id: str, timeout_s: float) -> int | None:
        with self._cond:
            found = self._find(name_or_id)
            if found is None:
                return 0
            if not self._cond.wait_for(lambda: found.status not in ("running", "created"), timeout_s):
                return None
            return found.exit_code

    def container_pids(self, name_or_id: str) -> set[int]:
        with self._cond:
            found = self._find(name_or_id)
            return set(found.pids) if found and found.status == "running" else set()

    # -- logs and probes -------------------------------------------------------------------------------------------
    def log_tail(self, name_or_id: str, lines: int = 50) -> list[str]:
        with self._cond:
            found = self._find(name_or_id)
            return list(found.log[-lines:]) if found and lines > 0 else []

    def follow_logs(self, name_or_id: str, *, tail: int | str = "all", stop: threading.Event | None = None,
                    since: int | None = None) -> Iterator[str]:
        """Lines as they are written; ends once the container has exited (after its last line) or `stop` is set."""
        with self._cond:
            found = self._find(name_or_id)
            if found is None:
                return
            at = 0 if tail == "all" else max(0, len(found.log) - int(tail))
        while not (stop is not None and stop.is_set()):
            with self._cond:
                self._cond.wait_for(lambda: len(found.log) > at or found.status != "running", 0.05)
                fresh, at = found.log[at:], len(found.log)
                ended = found.status != "running"
            yield from fresh
            if ended and not fresh:
                return

    def run_probe(self, image: str, script: str, *, read_only: dict[str, str] | None = None,
                  timeout_s: float = 60.0) -> tuple[int | None, str]:
        self._note("run_probe", image, script)
        self.probes.append((image, script))
        if image not in self.images:
            raise RuntimeFailure(RuntimeCause.IMAGE_MISSING, f"image not found: No such image: {image}")
        return self.probe_answer

    # -- the connection --------------------------------------------------------------------------------------------
    def close(self) -> None:
        self.closed += 1

    def __enter__(self) -> FakeRuntime:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- a container's life ----------------------------------------------------------------------------------------
    def _run(self, c: FakeContainer) -> None:
        for action in c.boot.actions:
            if isinstance(action, Chatter):
                while not c.halt.wait(action.every_s):
                    self._append(c, c.fill(action.line))
                return
            if c.halt.wait(action.after_s):
                return
            if isinstance(action, Log):
                self._append(c, c.fill(action.line))
            elif isinstance(action, Listen):
                if not self._listen(c, (action.status, action.body)):
                    self._append(c, PREFIX.replace("INFO", "ERROR") + "Error: Address already in use (os error 98)")
                    self._exit(c, 1)
                    return
            elif isinstance(action, Answer):
                with self._cond:
                    if c.server is not None:
                        c.health = (action.status, action.body)
            elif isinstance(action, Exit):
                self._exit(c, action.code, action.oom)
                return

    def _append(self, c: FakeContainer, line: str) -> None:
        with self._cond:
            if c.status == "running":
                c.log.append(line)
                self._cond.notify_all()

    def _listen(self, c: FakeContainer, answer: tuple[int, dict[str, Any]]) -> bool:
        assert c.spec is not None
        host = "127.0.0.1" if c.spec.bind in ("0.0.0.0", "", "::") else c.spec.bind  # loopback only, always
        with self._cond:  # bound only while running: a container removed meanwhile never holds its port after
            if c.status != "running":  # its removal returned (a test's next start on that port would be refused)
                return True
            try:
                server = ThreadingHTTPServer((host, c.spec.port), engine_handler(c))
            except OSError:
                return False
            # serving before _exit can see it (its shutdown() waits for serve_forever to run)
            c.server, c.health = server, answer
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return True

    def _exit(self, c: FakeContainer, code: int, oom: bool = False) -> None:
        with self._cond:
            if c.status not in ("running", "created"):
                return
            c.status, c.exit_code, c.oom, c.finished_at = "exited", code, oom, _now()
            c.halt.set()
            server, c.server, c.health = c.server, None, None
            self._cond.notify_all()
        if server is not None:  # the engine's port is free again once the process is gone
            server.shutdown()
            server.server_close()

    def _drop(self, c: FakeContainer) -> None:
        with self._cond:
            self._by_id.pop(c.id, None)
            self._cond.notify_all()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
