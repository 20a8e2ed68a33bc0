"""The Docker seam's errors: every way of failing is told here, from the daemon's words or the socket's error, once.

Docker unusable (DockerUnavailable): not installed, not running, permission denied, the rootless socket not
exported, a node unreachable over ssh or tcp, each with its remedy (SPEC §5). The daemon refusing an operation
(RuntimeFailure): its answer arrives from either transport as a `Refused` (status and the daemon's own words),
and `refused_failure` reads its cause (RuntimeCause) so that callers test `failure.cause`, never the message.
"""

from __future__ import annotations

import grp
import os
import shutil
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from metralectl.errors import ExitCode, MetralError

if TYPE_CHECKING:
    from metralectl.seams.docker.endpoints import Endpoint

RDMA_HINT = ("an EP=2 rank gets the node's RDMA devices (/dev/infiniband) for NCCL over RoCE: load the ConnectX "
             "RDMA drivers on that node (`sudo modprobe mlx5_ib ib_uverbs rdma_ucm`; `ls /dev/infiniband` then lists "
             "uverbs0 and rdma_cm), or run with `--no-rdma` (NCCL over TCP sockets on the RoCE interface, slower)")
MEMLOCK_HINT = ("an EP=2 rank gets `--ulimit memlock=-1:-1` for RDMA memory registration, and this daemon lacks "
                "CAP_SYS_RESOURCE to raise it (rootless Docker, or Docker inside a container): run the node's "
                "dockerd as root on the host, or run with `--no-rdma` (no memory registration, no memlock)")
CONNECT_TIMEOUT_S = 3.0
# docker-py's rule for a 404 that means "no such image" (docker.errors._image_not_found_explanation_fragments)
IMAGE_NOT_FOUND = ("no such image", "not found: does not exist or no pull access", "repository does not exist",
                   "was found but does not match the specified platform")


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




class Refused(Exception):
    """The daemon's answer other than 2xx, as either transport reads it (docker-py's APIError, or the socket
    reader's own reply): its status, its explanation (the JSON `message`, else the body's text) and, as the
    exception's text, docker-py's wording of the answer. Raised by the client; the runtime judges it."""

    def __init__(self, status: int | None, explanation: object, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.explanation = str(explanation) if explanation else ""

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def image_missing(self) -> bool:
        return self.not_found and any(fragment in self.explanation.lower() for fragment in IMAGE_NOT_FOUND)

    @property
    def words(self) -> str:
        """What the daemon said (its explanation), else the answer's wording."""
        return self.explanation or str(self)


def refused_failure(exc: Refused) -> RuntimeFailure:
    """The daemon's refusal as a RuntimeFailure with its cause and the node's remedy."""
    text = exc.words
    if exc.image_missing:
        return RuntimeFailure(RuntimeCause.IMAGE_MISSING, f"image not found: {text}",
                              "pull it first (`metralectl pull RECIPE`)")
    cause = refusal_cause(exc.status, text)
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
