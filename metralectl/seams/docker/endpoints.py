"""Which Docker daemon: DOCKER_HOST, the Docker CLI's current context, or a node the operator named (a URL or a
context), with its TLS material. Read from the CLI's own files, so that finding the default socket imports no
docker-py (`ps`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metralectl.errors import MetralError

if TYPE_CHECKING:  # docker-py is imported lazily at run time (cold start); this is for the checker only
    from docker.tls import TLSConfig

DEFAULT_SOCKET = "/var/run/docker.sock"
# Not a daemon: this machine's engines run as host processes (seams/process; open_runtime hands it a ProcessRuntime).
PROCESS_ENDPOINT_URL = "process://local"


@dataclass(frozen=True)
class Endpoint:
    url: str  # unix:///..., tcp://..., ssh://...
    source: str  # "DOCKER_HOST", "context <name>", "default", "--worker", ...
    tls: TLSConfig | None = None
    spec: str = ""  # what the operator named (a context or a URL); "" for the current endpoint

    @property
    def is_local(self) -> bool:
        """A daemon on this machine (a unix socket, or TCP on loopback), or this machine's host processes."""
        if self.url.startswith(("unix://", "npipe://")) or self.is_process:
            return True
        host = self.host
        return host in ("localhost", "127.0.0.1", "::1")

    @property
    def is_process(self) -> bool:
        """Engines run as host processes on this machine (seams/process), not a daemon."""
        return self.url == PROCESS_ENDPOINT_URL

    @property
    def host(self) -> str:
        """The node's host name or address as the URL names it ("" for a unix socket or host processes)."""
        if "://" not in self.url or self.url.startswith(("unix://", "npipe://")) or self.is_process:
            return ""
        from urllib.parse import urlsplit

        return urlsplit(self.url).hostname or ""

    def describe(self) -> str:
        named = self.spec if self.spec and self.spec != self.url else ""
        return f"{self.url} (context {named})" if named else self.url


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


