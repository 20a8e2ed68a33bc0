"""Containers on a Docker daemon: metralectl's own (listed by label, inspected, created and started so that a
failed or interrupted start leaves nothing behind, stopped, killed, removed, waited for, their PIDs), and the
short-lived probe containers (network and HF-cache probes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from metralectl.core.labels import LABEL_MANAGED, LABEL_OWNER, LABEL_PROBE, owner
from metralectl.errors import MetralError
from metralectl.seams.docker.client import Resource
from metralectl.seams.docker.errors import DockerUnavailable, Refused, RuntimeCause, RuntimeFailure, refused_failure

if TYPE_CHECKING:
    from metralectl.core.render import ContainerSpec

CREATE_DRAIN_S = 60.0  # after Ctrl-C: how long to wait for the daemon's answer to a create it received


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    image: str
    status: str  # created | running | exited | dead | ...
    exit_code: int | None
    oom_killed: bool
    started_at: str | None
    finished_at: str | None
    labels: dict[str, str] = field(default_factory=dict)
    health: str | None = None
    command: tuple[str, ...] = ()  # what runs: the entrypoint's path and its arguments (`rm`/`prune` read them)
    mounts: tuple[str, ...] = ()  # the host paths mounted into it

    @property
    def running(self) -> bool:
        return self.status in ("running", "restarting")

    @property
    def managed(self) -> bool:
        return self.labels.get(LABEL_MANAGED) == "true"

    @property
    def owner(self) -> str | None:
        return self.labels.get(LABEL_OWNER)


class ContainersMixin(Resource):
    """The runtime's container calls (runtime.DockerRuntime)."""

    def containers(self, *, managed_only: bool = True, all_states: bool = True, mine: bool = True) -> list[ContainerInfo]:
        """metralectl's containers; with mine (the default) only this user's — never another owner's."""
        filters: dict[str, Any] | None = None
        if managed_only:
            labels = [f"{LABEL_MANAGED}=true"] + ([f"{LABEL_OWNER}={owner()}"] if mine else [])
            filters = {"label": labels}
        listed = self._call(self.api.containers, all=all_states, filters=filters)
        out = []
        for item in listed:
            info = self.inspect(item["Id"])
            if info is not None:
                out.append(info)
        return out

    def inspect(self, name_or_id: str) -> ContainerInfo | None:
        try:
            data = self.api.inspect_container(name_or_id)
        except Refused as exc:
            if exc.not_found:
                return None
            raise refused_failure(exc) from None
        state = data.get("State") or {}
        config = data.get("Config") or {}
        health = (state.get("Health") or {}).get("Status")
        return ContainerInfo(
            id=data["Id"], name=str(data.get("Name", "")).lstrip("/"), image=str(config.get("Image", "")),
            status=str(state.get("Status", "unknown")),
            exit_code=state.get("ExitCode") if state.get("Status") in ("exited", "dead") else None,
            oom_killed=bool(state.get("OOMKilled")), started_at=state.get("StartedAt"),
            finished_at=state.get("FinishedAt"), labels=dict(config.get("Labels") or {}), health=health,
            command=tuple(str(a) for a in [data.get("Path") or "", *(data.get("Args") or [])] if a),
            mounts=tuple(str(m.get("Source")) for m in data.get("Mounts") or [] if isinstance(m, dict) and m.get("Source")),
        )

    def create_and_start(self, spec: ContainerSpec, extra_labels: dict[str, str] | None = None) -> ContainerInfo:
        """Create and start spec's container; a failed start leaves nothing behind."""
        from docker.types import DeviceRequest

        device_requests = None
        if spec.gpu_ids is not None:  # placed on a box of several GPUs (core/placement.py)
            device_requests = [DeviceRequest(device_ids=[str(i) for i in spec.gpu_ids], capabilities=[["gpu"]])]
        elif spec.gpus == "all":
            device_requests = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
        elif isinstance(spec.gpus, int):
            device_requests = [DeviceRequest(count=spec.gpus, capabilities=[["gpu"]])]
        binds = {m.source: {"bind": m.target, "mode": "ro" if m.read_only else "rw"} for m in spec.mounts}
        cpuset: dict[str, Any] = {}
        if spec.cpu_ids is not None:  # kept off the gateway's own CPUs (seams/affinity.py)
            from metralectl.core.cpulist import render

            cpuset["cpuset_cpus"] = render(spec.cpu_ids)
        host_config = self._call(self.api.create_host_config, network_mode=spec.network_mode,
                                 ipc_mode=spec.ipc_mode, binds=binds, device_requests=device_requests, init=False,
                                 **profile_kwargs(spec), **cpuset)
        labels = {**spec.labels, **(extra_labels or {})}
        created = self._create_uninterruptibly(spec, labels, host_config)
        container_id = created["Id"]
        try:
            self._call(self.api.start, container_id)
            info = self.inspect(container_id)
        except BaseException:
            self.remove(container_id, force=True)
            raise
        if info is None:
            raise RuntimeFailure(RuntimeCause.VANISHED,
                                 f"container {spec.name} vanished right after it started")
        return info

    def _create_uninterruptibly(self, spec: ContainerSpec, labels: dict[str, str], host_config: Any) -> dict[str, Any]:
        """The create request, in a thread of its own: a Ctrl-C that lands while the daemon is still creating
        waits for its answer (bounded), so the container it makes — however late — is removed, never left
        `created`. Looking it up at once is not enough: a slow daemon creates it after the lookup."""
        import threading

        outcome: dict[str, Any] = {}
        done = threading.Event()  # not Thread.join: a join that Ctrl-C interrupts can report a live thread dead

        def create() -> None:
            try:
                outcome["created"] = self._call(self.api.create_container, image=spec.image,
                                                command=list(spec.command), name=spec.name,
                                                environment=dict(spec.env), labels=labels, host_config=host_config,
                                                detach=True)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
                outcome["error"] = exc
            finally:
                done.set()

        threading.Thread(target=create, name="docker-create", daemon=True).start()
        try:
            while not done.wait(0.1):
                pass
        except BaseException:
            done.wait(CREATE_DRAIN_S)  # the daemon answers the create it received; then it can be removed
            made = outcome.get("created")
            try:
                if made is not None:
                    self.remove(made["Id"], force=True)
                else:
                    self.remove_if_labelled(spec.name, labels)
            except MetralError:
                pass  # the daemon went away meanwhile: the launch's own cleanup looks again by name and run id
            raise
        if "error" in outcome:
            # A create that failed may still have made the container (an answer lost on the way back):
            # this very launch's, found by name and labels, goes.
            try:
                self.remove_if_labelled(spec.name, labels)
            except MetralError:
                pass
            raise outcome["error"]
        created: dict[str, Any] = outcome["created"]
        return created

    def remove_if_labelled(self, name: str, labels: dict[str, str]) -> bool:
        """Remove the container called name only if it carries exactly these labels (this very launch's)."""
        try:
            found = self.inspect(name)
        except MetralError:
            return False
        if found is None or any(found.labels.get(k) != v for k, v in labels.items()):
            return False
        self.remove(found.id, force=True)
        return True

    def stop(self, name_or_id: str, timeout_s: float = 30.0) -> None:
        """SIGTERM, then SIGKILL after timeout_s (the daemon's own escalation)."""
        previous = self.api.timeout
        self.api.timeout = timeout_s + 30
        try:
            self.api.stop(name_or_id, timeout=int(max(1, timeout_s)))
        except Refused as exc:
            if exc.not_found:
                return
            raise refused_failure(exc) from None
        finally:
            self.api.timeout = previous

    def kill(self, name_or_id: str) -> None:
        try:
            self.api.kill(name_or_id)
        except Refused as exc:
            if not exc.not_found and "is not running" not in str(exc):
                raise refused_failure(exc) from None

    def remove(self, name_or_id: str, *, force: bool = False) -> None:
        try:
            self.api.remove_container(name_or_id, force=force, v=False)
        except Refused as exc:
            if not exc.not_found and "already in progress" not in str(exc):
                raise refused_failure(exc) from None

    def wait_exit(self, name_or_id: str, timeout_s: float) -> int | None:
        """The exit code once the container has stopped, or None if it still runs after timeout_s."""
        previous = self.api.timeout
        self.api.timeout = timeout_s
        try:
            answer = self.api.wait(name_or_id)  # None: no answer within timeout_s
        except Refused as exc:
            if exc.not_found:
                return 0
            raise refused_failure(exc) from None
        finally:
            self.api.timeout = previous
        return None if answer is None else int(answer["StatusCode"])

    def container_pids(self, name_or_id: str) -> set[int]:
        """Host PIDs of a running container's processes (empty when it is not running)."""
        try:
            top = self.api.top(name_or_id, ps_args="-eo pid")
        except (Refused, DockerUnavailable):  # gone, or the daemon with it: no processes to count
            return set()
        titles = [t.upper() for t in top.get("Titles") or []]
        column = titles.index("PID") if "PID" in titles else 0
        out = set()
        for row in top.get("Processes") or []:
            try:
                out.add(int(row[column]))
            except (ValueError, IndexError):
                continue
        return out

    def run_probe(self, image: str, script: str, *, read_only: dict[str, str] | None = None,
                  timeout_s: float = 60.0) -> tuple[int | None, str]:
        """Run `sh -c script` in a short-lived container of `image` on the host network; (exit code, output).

        Bind sources must exist (Docker's Mounts API refuses a missing one instead of creating it as
        root on that node). The container carries no metralectl-managed label (`ps` never shows it)
        and is removed whatever happens.
        """
        import uuid

        from docker.types import Mount as DockerMount

        mounts = [DockerMount(target, source, type="bind", read_only=True) for source, target in (read_only or {}).items()]
        host_config = self._call(self.api.create_host_config, network_mode="host", mounts=mounts or None)
        name = f"metralectl-probe-{uuid.uuid4().hex[:8]}"
        created = self._call(self.api.create_container, image=image, entrypoint=["sh", "-c"], command=[script],
                             name=name, labels={LABEL_PROBE: "true", LABEL_OWNER: owner()}, host_config=host_config,
                             detach=True)
        try:
            self._call(self.api.start, created["Id"])
            code = self.wait_exit(created["Id"], timeout_s)
            raw = self._call(self.api.logs, created["Id"], stdout=True, stderr=True)
            return code, raw.decode("utf-8", "replace")
        finally:
            try:
                self.remove(created["Id"], force=True)
            except MetralError:
                pass


def profile_kwargs(spec: ContainerSpec) -> dict[str, Any]:
    """A multi-rank spec's devices, capabilities, ulimits and /dev/shm size as create_host_config takes them
    (exactly what `run --print` shows as --device/--cap-add/--ulimit/--shm-size); nothing for a single node."""
    from docker.types import Ulimit

    kwargs: dict[str, Any] = {}
    if spec.devices:
        kwargs["devices"] = [f"{d}:{d}:rwm" for d in spec.devices]
    if spec.cap_add:
        kwargs["cap_add"] = list(spec.cap_add)
    if spec.ulimits:
        kwargs["ulimits"] = [Ulimit(name=n, soft=soft, hard=hard) for n, soft, hard in spec.ulimits]
    if spec.shm_size:
        kwargs["shm_size"] = spec.shm_size
    return kwargs
