"""The container runtime seam. The only module that imports `docker` (lazily; docker_local.py reads a
local daemon without it, for `ps`).

Every docker-py exception is translated here into a MetralError an operator can act on; the
four ways Docker is unusable (not installed, not running, permission denied, rootless socket not
exported) are told apart, each with its remedy (SPEC §5).
"""

from __future__ import annotations

import grp
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast

from metralectl.errors import ExitCode, MetralError
from metralectl.core.labels import LABEL_MANAGED, LABEL_OWNER, LABEL_PROBE, owner

if TYPE_CHECKING:  # the SDK is imported lazily at run time (cold start); these are for the checker only
    from docker import APIClient
    from docker.tls import TLSConfig

    from metralectl.core.render import ContainerSpec

T = TypeVar("T")

if TYPE_CHECKING:
    from metralectl.seams.container_runtime import ContainerRuntime

DEFAULT_SOCKET = "/var/run/docker.sock"
RDMA_HINT = ("an EP=2 rank gets the node's RDMA devices (/dev/infiniband) for NCCL over RoCE: load the ConnectX "
             "RDMA drivers on that node (`sudo modprobe mlx5_ib ib_uverbs rdma_ucm`; `ls /dev/infiniband` then lists "
             "uverbs0 and rdma_cm), or run with `--no-rdma` (NCCL over TCP sockets on the RoCE interface, slower)")
MEMLOCK_HINT = ("an EP=2 rank gets `--ulimit memlock=-1:-1` for RDMA memory registration, and this daemon lacks "
                "CAP_SYS_RESOURCE to raise it (rootless Docker, or Docker inside a container): run the node's "
                "dockerd as root on the host, or run with `--no-rdma` (no memory registration, no memlock)")
CONNECT_TIMEOUT_S = 3.0
CREATE_DRAIN_S = 60.0  # after Ctrl-C: how long to wait for the daemon's answer to a create it received


class DockerUnavailable(MetralError):
    """Docker cannot be used; `cause` says which of the known reasons."""

    exit_code = ExitCode.UNAVAILABLE

    def __init__(self, cause: str, message: str, hint: str) -> None:
        super().__init__(message, hint)
        self.cause = cause


class RuntimeCause(str, Enum):
    """Why the daemon refused: read here from docker-py's exception and the daemon's text, once, so that
    callers test `failure.cause` and never the message."""

    IMAGE_MISSING = "image-missing"  # the image is not on that daemon
    PULL_FAILED = "pull-failed"  # the registry or the pull stream said no
    DEVICE_MISSING = "device-missing"  # a --device path the launch passes is not on that node
    MEMLOCK_REFUSED = "memlock-refused"  # the kernel refused an unlimited RLIMIT_MEMLOCK
    GPU_RUNTIME_MISSING = "gpu-runtime-missing"  # the daemon has no NVIDIA runtime to give a container a GPU
    GPU_HOOK_FAILED = "gpu-hook-failed"  # the NVIDIA runtime's hook failed (driver not loaded, CUDA too old)
    MOUNT_SOURCE_MISSING = "mount-source-missing"  # a bind mount's source path does not exist there
    CONFLICT = "conflict"  # 409: the name is taken, or the object is in use
    VANISHED = "vanished"  # the container was gone right after it started
    REFUSED = "refused"  # any other refusal (the daemon's text says why)


class RuntimeFailure(MetralError):
    """The daemon refused or failed an operation; `cause` says which of the known ways."""

    exit_code = ExitCode.FAILED

    def __init__(self, cause: RuntimeCause, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.cause = cause


GPU_CAUSES = frozenset({RuntimeCause.GPU_RUNTIME_MISSING, RuntimeCause.GPU_HOOK_FAILED})  # refused its GPUs
GPU_RUNTIME_HINT = ("install the NVIDIA container toolkit, then `sudo nvidia-ctk runtime configure "
                    "--runtime=docker && sudo systemctl restart docker`")


def refusal_cause(status: int | None, text: str) -> RuntimeCause:
    """The cause of a daemon's refusal (an API error's status and text). The daemon's words are matched
    here, in the seam, and nowhere else."""
    if "error gathering device information while adding custom device" in text:
        return RuntimeCause.DEVICE_MISSING
    if "error setting rlimit type 8" in text:  # RLIMIT_MEMLOCK, refused by the kernel
        return RuntimeCause.MEMLOCK_REFUSED
    if "could not select device driver" in text:
        return RuntimeCause.GPU_RUNTIME_MISSING
    if "nvidia-container-cli" in text:
        return RuntimeCause.GPU_HOOK_FAILED
    if "bind source path does not exist" in text:
        return RuntimeCause.MOUNT_SOURCE_MISSING
    if status == 409:
        return RuntimeCause.CONFLICT
    return RuntimeCause.REFUSED


@dataclass(frozen=True)
class Endpoint:
    url: str  # unix:///..., tcp://..., ssh://...
    source: str  # "DOCKER_HOST", "context <name>", "default", "--worker", ...
    tls: TLSConfig | None = None
    spec: str = ""  # what the operator named (a context or a URL); "" for the current endpoint

    @property
    def is_local(self) -> bool:
        """A daemon on this machine (a unix socket, or TCP on loopback)."""
        if self.url.startswith(("unix://", "npipe://")):
            return True
        host = self.host
        return host in ("localhost", "127.0.0.1", "::1")

    @property
    def host(self) -> str:
        """The node's host name or address as the URL names it ("" for a unix socket)."""
        if "://" not in self.url or self.url.startswith(("unix://", "npipe://")):
            return ""
        from urllib.parse import urlsplit

        return urlsplit(self.url).hostname or ""

    def describe(self) -> str:
        named = self.spec if self.spec and self.spec != self.url else ""
        return f"{self.url} (context {named})" if named else self.url


@dataclass(frozen=True)
class ImageRecord:
    """One local image, for disk accounting: its id, every tag naming it, its size in bytes."""

    id: str
    tags: tuple[str, ...]
    size: int


# OCI's two labels for what an image holds: the source revision it was built from, else the version of what it
# packages (the llama.cpp images carry llama.cpp's build number there). An image entry names the one it uses.
IMAGE_REVISION_LABELS = ("org.opencontainers.image.revision", "org.opencontainers.image.version")


def image_revision(labels: dict[str, str], revision_label: str | None = None) -> str | None:
    """The image's revision: the named label's value, else (no name) the first IMAGE_REVISION_LABELS it carries."""
    if revision_label is not None:
        return labels.get(revision_label)
    return next((labels[name] for name in IMAGE_REVISION_LABELS if labels.get(name)), None)


@dataclass(frozen=True)
class ImageState:
    ref: str
    present: bool
    image_id: str | None = None
    revision: str | None = None
    platform: str | None = None  # os/arch, e.g. linux/arm64
    digests: tuple[str, ...] = ()


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


def resolve_endpoint() -> Endpoint:
    """DOCKER_HOST, else the Docker CLI's current context, else the default socket."""
    host = os.environ.get("DOCKER_HOST")
    if host:
        return Endpoint(host, "DOCKER_HOST")
    name = _current_context_name()
    if name != "default":
        try:
            context_host, tls = _read_context(name)
        except Exception:  # noqa: BLE001 - a broken CLI config must not hide the default socket
            context_host, tls = None, None
        if context_host:
            return Endpoint(context_host, f"context {name}", tls)
    return Endpoint(f"unix://{DEFAULT_SOCKET}", "default")


def _current_context_name() -> str:
    """The Docker CLI's current context as docker-py's ContextAPI reads it (the first config file that
    exists: $DOCKER_CONFIG/config.json, ~/.docker/config.json, ~/.dockercfg; its currentContext), read
    here so that finding the default socket does not import docker-py."""
    import json

    config_dir = os.environ.get("DOCKER_CONFIG")
    home = os.path.expanduser("~")
    candidates = ([os.path.join(config_dir, "config.json")] if config_dir else []) + [
        os.path.join(home, ".docker", "config.json"), os.path.join(home, ".dockercfg")]
    found = next((path for path in candidates if os.path.exists(path)), None)
    if found is None:
        return "default"
    try:
        with open(found) as handle:
            return str(json.load(handle).get("currentContext", "default"))
    except Exception:  # noqa: BLE001 - unreadable or not a mapping: docker-py falls back the same way
        return "default"


URL_SCHEMES = ("unix://", "tcp://", "ssh://", "npipe://", "http://", "https://")


def endpoint_for(spec: str, role: str = "worker") -> Endpoint:
    """A node's Docker endpoint from what the operator named: a URL, or a Docker CLI context.

    tcp:// URLs use TLS when DOCKER_TLS_VERIFY is set (certificates from DOCKER_CERT_PATH, else
    ~/.docker), as the Docker CLI does; a context carries its own TLS material.
    """
    spec = spec.strip()
    source = f"--{role}"
    if not spec:
        raise MetralError(f"--{role} needs a Docker context name or an endpoint URL")
    if spec.startswith(URL_SCHEMES):
        if spec.startswith(("http://", "https://")):
            spec_url = "tcp://" + spec.split("://", 1)[1]
        else:
            spec_url = spec
        tls = _tls_from_env() if spec_url.startswith("tcp://") else None
        return Endpoint(spec_url, source, tls, spec)
    if "/" in spec or ":" in spec:
        raise MetralError(f"--{role} {spec}: not a Docker context name nor an endpoint URL",
                          "write a context name (`docker context ls`) or a URL: ssh://user@host, tcp://host:2376")
    if spec == "default":
        return Endpoint(f"unix://{DEFAULT_SOCKET}", "context default", None, spec)
    host, tls = _read_context(spec)
    if host is None:
        raise MetralError(f"no Docker context named {spec!r}",
                          f"create it (`docker context create {spec} --docker host=ssh://USER@{spec}`), or pass a URL "
                          f"(--{role} ssh://USER@{spec}); `docker context ls` lists the existing ones")
    return Endpoint(host, f"context {spec}", tls, spec)


def _read_context(name: str) -> tuple[str | None, Any]:
    """(docker host, TLS config) of a Docker CLI context, read from the CLI's own store.

    Layout: $DOCKER_CONFIG (default ~/.docker)/contexts/meta/<sha256(name)>/meta.json and
    .../contexts/tls/<sha256(name)>/docker/{ca,cert,key}.pem. Read directly: docker-py's
    ContextAPI finds the store only when a config.json sits next to it.
    """
    import hashlib
    import json

    base = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "contexts"
    digest = hashlib.sha256(name.encode()).hexdigest()
    try:
        meta = json.loads((base / "meta" / digest / "meta.json").read_text())
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        raise MetralError(f"cannot read the Docker context {name!r}: {exc}", "check `docker context ls`") from None
    endpoint = ((meta.get("Endpoints") or {}).get("docker") or {}) if isinstance(meta, dict) else {}
    host = endpoint.get("Host")
    if not host:
        raise MetralError(f"the Docker context {name!r} names no Docker host", f"check `docker context inspect {name}`")
    tls_dir = base / "tls" / digest / "docker"
    tls = None
    if host.startswith("tcp://") and tls_dir.is_dir():
        from docker.tls import TLSConfig

        cert, key, ca = tls_dir / "cert.pem", tls_dir / "key.pem", tls_dir / "ca.pem"
        tls = TLSConfig(client_cert=(str(cert), str(key)) if cert.exists() and key.exists() else None,
                        ca_cert=str(ca) if ca.exists() else None, verify=not endpoint.get("SkipTLSVerify", False))
    return str(host), tls


def _tls_from_env() -> TLSConfig | None:
    if not os.environ.get("DOCKER_TLS_VERIFY"):
        return None
    from docker.tls import TLSConfig

    certs = Path(os.environ.get("DOCKER_CERT_PATH") or Path.home() / ".docker")
    return TLSConfig(client_cert=(str(certs / "cert.pem"), str(certs / "key.pem")), ca_cert=str(certs / "ca.pem"),
                     verify=True)


def _rootless_socket() -> Path | None:
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR") or (f"/run/user/{os.getuid()}" if hasattr(os, "getuid") else "")
    candidate = Path(runtime_dir) / "docker.sock" if runtime_dir else None
    return candidate if candidate and candidate.exists() else None


def _user_in_docker_group() -> tuple[bool, bool]:
    """(listed in /etc/group's docker entry, this process actually has the group)."""
    try:
        group = grp.getgrnam("docker")
    except KeyError:
        return False, False
    try:
        import pwd

        user = pwd.getpwuid(os.getuid()).pw_name
        primary = pwd.getpwuid(os.getuid()).pw_gid == group.gr_gid
    except KeyError:
        user, primary = "", False
    listed = user in group.gr_mem or primary
    return listed, group.gr_gid in os.getgroups()


def classify_connect_error(endpoint: Endpoint, exc: BaseException) -> DockerUnavailable:
    """Tell apart the ways Docker can be unreachable, from the exception chain and the filesystem."""
    chain: list[BaseException] = []
    cursor: BaseException | None = exc
    while cursor is not None and cursor not in chain:
        chain.append(cursor)
        cursor = cursor.__cause__ or cursor.__context__
    text = " ".join(str(e) for e in chain)
    args = [a for e in chain for a in getattr(e, "args", ()) if isinstance(a, BaseException)]
    kinds = {type(e) for e in chain + args}
    socket = endpoint.url[len("unix://"):] if endpoint.url.startswith("unix://") else None
    where = f"{endpoint.url} ({endpoint.source})"
    if "paramiko" in text:
        return DockerUnavailable("ssh-unsupported", f"cannot reach {where}: ssh:// endpoints need the paramiko "
                                 "package next to metralectl (docker-py's ssh transport imports it)",
                                 "install it into metralectl's environment (`pipx inject metralectl paramiko`, or "
                                 "`pip install 'docker[ssh]'`); metralectl then connects through your own `ssh` "
                                 "(keys, agent, ~/.ssh/config), as the Docker CLI does")
    if not endpoint.is_local:
        return _remote_error(endpoint, where, text, kinds)
    if PermissionError in kinds or "Permission denied" in text:
        listed, active = _user_in_docker_group()
        if listed and not active:
            return DockerUnavailable(
                "permission-denied", f"permission denied on {where}: you are in the docker group, but this "
                "session started before you were added",
                "log out and back in (or run `newgrp docker` in this shell); a background service (the agent) "
                "keeps its old groups until its user manager restarts: `sudo systemctl restart user@$(id -u).service` "
                "or a re-login")
        return DockerUnavailable(
            "permission-denied", f"permission denied on {where}: your user is not in the docker group",
            "sudo usermod -aG docker $USER && newgrp docker   (then check: docker info --format '{{.ServerVersion}}')")
    if socket is not None and not Path(socket).exists():
        rootless = _rootless_socket()
        if rootless is not None and endpoint.source == "default":
            return DockerUnavailable(
                "rootless-not-exported", f"no Docker socket at {socket}, but a rootless daemon listens on {rootless}",
                f"export DOCKER_HOST=unix://{rootless}   (add it to your shell profile)")
        if endpoint.source == "DOCKER_HOST":
            return DockerUnavailable(
                "not-running", f"nothing listens at DOCKER_HOST={endpoint.url} (no socket at {socket})",
                "`unset DOCKER_HOST` to use the default socket, or start the daemon it names")
        if shutil.which("dockerd") or shutil.which("docker") or Path("/usr/bin/dockerd").exists():
            return DockerUnavailable(
                "not-running", f"the Docker daemon is not running (no socket at {socket})",
                "sudo systemctl start docker && sudo systemctl enable docker")
        return DockerUnavailable(
            "not-installed", "Docker is not installed (no docker CLI, no daemon, no socket)",
            "install Docker Engine (e.g. `sudo apt-get install docker.io`) and the NVIDIA container toolkit; "
            "`list`, `show` and `run --print` work without it")
    if ConnectionRefusedError in kinds or "Connection refused" in text:
        return DockerUnavailable("not-running", f"the Docker daemon at {where} refuses connections (not running)",
                                 "sudo systemctl start docker && sudo systemctl enable docker")
    if "timed out" in text.lower() or "timeout" in text.lower():
        return DockerUnavailable("unreachable", f"the Docker daemon at {where} did not answer within "
                                 f"{CONNECT_TIMEOUT_S:g} s", "check `docker info`; restart the daemon if it hangs")
    return DockerUnavailable("unreachable", f"cannot talk to the Docker daemon at {where}: {exc}",
                             "check DOCKER_HOST / `docker context ls` and `docker info`")


def _remote_error(endpoint: Endpoint, where: str, text: str, kinds: set[type]) -> DockerUnavailable:
    """A node's daemon over ssh:// or tcp://: the remedies are on that node, not on this one."""
    check = (f"`docker --context {endpoint.spec} info`" if endpoint.source.startswith("context") and endpoint.spec
             else f"`docker -H {endpoint.url} info`")
    if endpoint.url.startswith("ssh://"):
        return DockerUnavailable("unreachable", f"cannot reach the Docker daemon at {where} over ssh: {text[:300]}",
                                 f"check that `ssh {endpoint.host}` works without a password prompt (keys or agent) and "
                                 f"that the user there is in the docker group; then {check}")
    if ConnectionRefusedError in kinds or "Connection refused" in text:
        return DockerUnavailable("not-running", f"the Docker daemon at {where} refuses connections",
                                 f"on that node: is dockerd running and listening on TCP (with TLS)? {check}")
    if "timed out" in text.lower() or "timeout" in text.lower():
        return DockerUnavailable("unreachable", f"the Docker daemon at {where} did not answer within "
                                 f"{CONNECT_TIMEOUT_S:g} s", f"check the network path to that node and {check}")
    if "SSL" in text or "certificate" in text.lower():
        return DockerUnavailable("tls", f"TLS with the Docker daemon at {where} failed: {text[:300]}",
                                 "check the context's TLS material (`docker context inspect`) or DOCKER_CERT_PATH")
    return DockerUnavailable("unreachable", f"cannot talk to the Docker daemon at {where}: {text[:300]}", check)


def _api_client(endpoint: Endpoint, timeout: float | None) -> APIClient:
    """docker-py's low-level client for an endpoint; ssh:// goes through the system `ssh` (like the CLI).
    A local socket gets docker_local.LocalAPI, which answers `ps`'s reads without importing docker-py
    and hands everything else to docker-py's client (hence typed as one)."""
    if endpoint.url.startswith("unix:///"):
        from metralectl.seams.docker_local import LocalAPI

        return cast("APIClient", LocalAPI(endpoint.url, timeout, lambda: _docker_api_client(endpoint, timeout)))
    return _docker_api_client(endpoint, timeout)


def _docker_api_client(endpoint: Endpoint, timeout: float | None) -> APIClient:
    import docker

    return docker.APIClient(base_url=endpoint.url, timeout=timeout, tls=endpoint.tls or False, version="auto",
                            use_ssh_client=endpoint.url.startswith("ssh://"))


def _docker_errors() -> ModuleType:
    """docker.errors, imported only when an exception is being matched: an `except` clause evaluates its
    class then, so the reads LocalAPI answers need no docker-py when all goes well."""
    import importlib

    return importlib.import_module("docker.errors")


def _requests_errors() -> ModuleType:
    import requests.exceptions

    return requests.exceptions


class DockerRuntime:
    """Containers and images through the Docker SDK, with our errors and our labels."""

    def __init__(self, endpoint: Endpoint | None = None, timeout: float = 30.0,
                 connect_timeout: float = CONNECT_TIMEOUT_S) -> None:
        self.endpoint = endpoint or resolve_endpoint()
        try:
            self.api = _api_client(self.endpoint, connect_timeout)
            self.api.ping()
        except Exception as exc:  # noqa: BLE001 - every way of failing to connect is classified
            raise classify_connect_error(self.endpoint, exc) from None
        self.api.timeout = timeout

    # --- daemon ---------------------------------------------------------------------------------
    def server_version(self) -> str:
        return str(self._call(self.api.version).get("Version", "?"))

    def info(self) -> dict[str, Any]:
        return dict(self._call(self.api.info))

    # --- images ---------------------------------------------------------------------------------
    # -- disk: local images (`rm --image`, `prune`) ------------------------------------------------------------
    def image_record(self, ref: str) -> ImageRecord | None:
        """The local image `ref` names, or None when the daemon has none."""
        try:
            data = self._call(self.api.inspect_image, ref)
        except RuntimeFailure as exc:
            if exc.cause is RuntimeCause.IMAGE_MISSING:
                return None
            raise
        return ImageRecord(str(data.get("Id")), tuple(str(t) for t in data.get("RepoTags") or ()),
                           int(data.get("Size") or 0))

    def image_tags(self) -> list[str]:
        """Every tag of every local image (`<none>` ones left out)."""
        tags = [str(t) for image in self._call(self.api.images) for t in image.get("RepoTags") or ()]
        return [t for t in tags if t != "<none>:<none>"]

    def images_in_use(self) -> dict[str, str]:
        """Image ref (as the container names it) and image id -> a running container using it, any owner's."""
        used: dict[str, str] = {}
        for container in self._call(self.api.containers, all=False):
            name = str((container.get("Names") or ["?"])[0]).lstrip("/")
            for key in (container.get("Image"), container.get("ImageID")):
                if key:
                    used[str(key)] = name
        return used

    def remove_image(self, ref: str) -> None:
        """Untag / remove `ref`, never forced: the daemon's refusal (a container still uses it) is raised in its
        own words as a RuntimeFailure."""
        self._call(self.api.remove_image, ref)

    def image_state(self, ref: str, revision_label: str | None = None) -> ImageState:
        """The image as the daemon has it. Its revision: `revision_label` (the catalog's image entry names it),
        else the first of IMAGE_REVISION_LABELS it carries (`ps` and a benchmark's target know no entry)."""
        try:
            data = self.api.inspect_image(ref)
        except _docker_errors().ImageNotFound:
            return ImageState(ref, False)
        except _docker_errors().DockerException as exc:
            raise self._translate(exc) from None
        labels = (data.get("Config") or {}).get("Labels") or {}
        arch = data.get("Architecture") or ""
        os_name = data.get("Os") or "linux"
        return ImageState(ref, True, data.get("Id"), image_revision(labels, revision_label),
                          f"{os_name}/{arch}" if arch else None,
                          tuple(data.get("RepoDigests") or ()))

    def pull_image(self, ref: str, on_progress: Any = None, platform: str | None = None) -> ImageState:
        """Pull ref; on_progress(layer_id, status, current_bytes, total_bytes) per daemon event."""
        import docker.errors

        repository, tag = _split_ref(ref)
        previous = self.api.timeout
        self.api.timeout = None  # a large layer may go quiet for a while; the daemon reports errors itself
        try:
            for event in self.api.pull(repository, tag=tag, stream=True, decode=True, platform=platform):
                if "error" in event:
                    raise RuntimeFailure(RuntimeCause.PULL_FAILED, f"pulling {ref} failed: {event['error']}",
                                         "check the image name, your network/registry login (`docker login`)")
                if on_progress is not None:
                    detail = event.get("progressDetail") or {}
                    on_progress(event.get("id"), event.get("status", ""), detail.get("current"), detail.get("total"))
        except docker.errors.DockerException as exc:
            raise self._translate(exc) from None
        finally:
            self.api.timeout = previous
        return self.image_state(ref)

    # --- containers -----------------------------------------------------------------------------
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
        except _docker_errors().NotFound:
            return None
        except _docker_errors().DockerException as exc:
            raise self._translate(exc) from None
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
        if spec.gpus == "all":
            device_requests = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
        elif isinstance(spec.gpus, int):
            device_requests = [DeviceRequest(count=spec.gpus, capabilities=[["gpu"]])]
        binds = {m.source: {"bind": m.target, "mode": "ro" if m.read_only else "rw"} for m in spec.mounts}
        host_config = self.api.create_host_config(network_mode=spec.network_mode, ipc_mode=spec.ipc_mode, binds=binds,
                                                  device_requests=device_requests, init=False,
                                                  **profile_kwargs(spec))
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
        import docker.errors

        previous = self.api.timeout
        self.api.timeout = timeout_s + 30
        try:
            self.api.stop(name_or_id, timeout=int(max(1, timeout_s)))
        except docker.errors.NotFound:
            return
        except docker.errors.DockerException as exc:
            raise self._translate(exc) from None
        finally:
            self.api.timeout = previous

    def kill(self, name_or_id: str) -> None:
        import docker.errors

        try:
            self.api.kill(name_or_id)
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            if "is not running" not in str(exc):
                raise self._translate(exc) from None

    def remove(self, name_or_id: str, *, force: bool = False) -> None:
        import docker.errors

        try:
            self.api.remove_container(name_or_id, force=force, v=False)
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            if "already in progress" in str(exc):
                return
            raise self._translate(exc) from None

    def wait_exit(self, name_or_id: str, timeout_s: float) -> int | None:
        """The exit code once the container has stopped, or None if it still runs after timeout_s."""
        import docker.errors
        import requests

        previous = self.api.timeout
        self.api.timeout = timeout_s
        try:
            return int(self.api.wait(name_or_id)["StatusCode"])
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            return None
        except docker.errors.NotFound:
            return 0
        except docker.errors.DockerException as exc:
            raise self._translate(exc) from None
        finally:
            self.api.timeout = previous

    def log_tail(self, name_or_id: str, lines: int = 50) -> list[str]:
        import docker.errors

        try:
            raw: bytes = self.api.logs(name_or_id, stdout=True, stderr=True, tail=lines)
        except docker.errors.NotFound:
            return []
        except docker.errors.DockerException as exc:
            raise self._translate(exc) from None
        return raw.decode("utf-8", "replace").splitlines()

    def follow_logs(self, name_or_id: str, *, tail: int | str = "all", stop: threading.Event | None = None,
                    since: int | None = None) -> Iterator[str]:
        """Lines as they are written; ends when the container exits or `stop` is set.

        docker-py's followed streams read without a socket timeout, so a daemon that keeps the
        stream open after the container is gone would hang the reader: a watchdog closes it.
        """
        import docker.errors

        try:
            stream = self.api.logs(name_or_id, stdout=True, stderr=True, stream=True, follow=True, tail=tail,
                                   since=since)
        except docker.errors.NotFound:
            return
        except docker.errors.DockerException as exc:
            raise self._translate(exc) from None
        finished = threading.Event()
        watchdog = threading.Thread(target=self._watch_stream, args=(name_or_id, stream, finished, stop), daemon=True)
        watchdog.start()
        buffer = b""
        try:
            for chunk in stream:
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                for line in complete:
                    yield line.decode("utf-8", "replace").rstrip("\r")
        except Exception:  # noqa: BLE001 - a stream closed under us by the watchdog ends the iteration
            pass
        finally:
            finished.set()
            stream.close()
        if buffer:
            yield buffer.decode("utf-8", "replace")

    def _watch_stream(self, name_or_id: str, stream: Any, finished: threading.Event,
                      stop: threading.Event | None) -> None:
        watcher = _api_client(self.endpoint, 5)
        try:
            while not finished.is_set():
                if stop is not None and stop.is_set():
                    break
                try:
                    state = (watcher.inspect_container(name_or_id).get("State") or {}).get("Status")
                except Exception:  # noqa: BLE001 - gone or daemon gone: either way, stop reading
                    state = "gone"
                if state not in ("running", "created", "restarting", "paused"):
                    finished.wait(0.5)  # let the daemon flush the last lines first
                    break
                finished.wait(0.25)
        finally:
            watcher.close()
            if not finished.is_set():
                stream.close()

    def container_pids(self, name_or_id: str) -> set[int]:
        """Host PIDs of a running container's processes (empty when it is not running)."""
        import docker.errors

        try:
            top = self.api.top(name_or_id, ps_args="-eo pid")
        except docker.errors.DockerException:
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
        host_config = self.api.create_host_config(network_mode="host", mounts=mounts or None)
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

    def daemon_identity(self) -> tuple[str, str, str]:
        """(identity, host name, CPU architecture) of the daemon this endpoint reaches. The identity is
        the daemon ID with its host name and root dir: Docker 20.10 derives the ID from /etc/docker/key.json,
        which machines cloned from one image share."""
        info = self.info()
        identity = f"{info.get('ID') or '?'}|{info.get('Name') or '?'}|{info.get('DockerRootDir') or '?'}"
        return identity, str(info.get("Name") or "?"), str(info.get("Architecture") or "")

    # --- helpers --------------------------------------------------------------------------------
    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except _docker_errors().DockerException as exc:
            raise self._translate(exc) from None
        except _requests_errors().RequestException as exc:
            raise classify_connect_error(self.endpoint, exc) from None

    def _translate(self, exc: Exception) -> MetralError:
        import docker.errors

        text = str(getattr(exc, "explanation", None) or exc)
        if isinstance(exc, docker.errors.ImageNotFound):
            return RuntimeFailure(RuntimeCause.IMAGE_MISSING, f"image not found: {text}",
                                  "pull it first (`metralectl pull RECIPE`)")
        if not isinstance(exc, docker.errors.APIError):
            return classify_connect_error(self.endpoint, exc)
        cause = refusal_cause(exc.status_code, text)
        if cause is RuntimeCause.DEVICE_MISSING:
            return RuntimeFailure(cause, f"this node lacks a device the launch passes to the engine ({text})",
                                  RDMA_HINT if "/dev/infiniband" in text else "check the device path on that node")
        if cause is RuntimeCause.MEMLOCK_REFUSED:
            return RuntimeFailure(cause, "the Docker daemon may not give the container an unlimited "
                                  f"locked-memory limit ({text})", MEMLOCK_HINT)
        if cause is RuntimeCause.GPU_RUNTIME_MISSING:
            return RuntimeFailure(cause, f"the daemon cannot give containers a GPU: {text}", GPU_RUNTIME_HINT)
        if cause is RuntimeCause.GPU_HOOK_FAILED:
            return RuntimeFailure(cause, f"Docker refused: {text}", "check the NVIDIA driver (`nvidia-smi`) and "
                                  "the container toolkit (`nvidia-container-cli info`) on that node")
        if cause is RuntimeCause.CONFLICT:
            return RuntimeFailure(cause, f"conflict: {text}")
        return RuntimeFailure(cause, f"Docker refused: {text}")

    def close(self) -> None:
        self.api.close()

    def __enter__(self) -> DockerRuntime:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


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


def _split_ref(ref: str) -> tuple[str, str | None]:
    """repository and tag of an image reference (a digest stays in the repository part)."""
    if "@" in ref:
        return ref, None
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        repository, tag = ref.rsplit(":", 1)
        return repository, tag
    return ref, "latest"


def container_pids(runtime: ContainerRuntime, name_or_id: str) -> set[int]:
    """Host PIDs of a running container's processes (empty when it is not running)."""
    return runtime.container_pids(name_or_id)


def open_runtime(endpoint: Endpoint | None = None, *, timeout: float = 30.0) -> ContainerRuntime:
    """A connected runtime for `endpoint` (default: DOCKER_HOST / the current context / the default socket).
    Use it as a context manager, so the connection is closed on every path: `with open_runtime() as rt:`."""
    return DockerRuntime(endpoint, timeout=timeout)
