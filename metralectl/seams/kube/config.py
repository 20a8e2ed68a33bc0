"""A kubeconfig read the way kubectl reads its basics: $KUBECONFIG (the first file of the list that exists) or
~/.kube/config; the current context or the one named; the cluster's server and CA; the user's bearer token or
client certificate. Credential plugins (exec, auth-provider) run other programs and are refused with the fix.
The file holds secrets: it is read capped (filecap) and nothing of it but names is ever printed. What it holds is
checked before use, each fault exit 65 naming the key: the server an http(s) URL, the token printable ASCII (it
goes in a header), the CA and client certificate PEM that ssl loads, the files it names regular and present."""

from __future__ import annotations

import base64
import os
import re
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metralectl.errors import ExitCode, MetralError
from metralectl.safetext import clean

CONFIG_LIMIT = 4 << 20
SERVER_RE = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?", re.ASCII)
TOKEN_RE = re.compile(r"[\x21-\x7e]{1,16384}")
NO_PLUGINS = ("metralectl does not run credential plugins: give the context a user with a token or a client "
              "certificate (`kubectl create token SA` gives a token; or `kubectl config set-credentials NAME "
              "--token=...`), or a copy of the kubeconfig with such a user in $KUBECONFIG")


@dataclass(frozen=True)
class KubeConfig:
    context: str
    server: str
    namespace: str  # the context's, else "default"
    token: str | None = None
    ca_pem: str | None = None  # PEM of the CA to trust; None: the system's
    client_cert_pem: str | None = None
    client_key_pem: str | None = None
    insecure: bool = False  # insecure-skip-tls-verify: true in the kubeconfig (a warning on every --on kube command)
    source: str = ""

    def ssl_context(self) -> ssl.SSLContext | bool:
        """What httpx's `verify` takes: an SSLContext trusting the cluster's CA (client certificate loaded); a CA
        or certificate ssl cannot load is exit 65, naming which."""
        if not self.server.startswith("https://"):
            return False
        what = "certificate-authority"
        try:
            ctx = ssl.create_default_context(cadata=self.ca_pem) if self.ca_pem else ssl.create_default_context()
            what = "client-certificate / client-key"
            self._load_client(ctx)
        except (ssl.SSLError, ValueError) as exc:
            raise MetralError(f"kubeconfig {self.source}, context {clean(self.context, 80)!r}: its {what} is not "
                              f"PEM that ssl loads ({clean(str(exc), 120)})", "fix the kubeconfig's " + what,
                              exit_code=ExitCode.DATA) from None
        return ctx

    def _load_client(self, ctx: ssl.SSLContext) -> None:
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.client_cert_pem and self.client_key_pem:
            # ssl loads a chain from files only: a private directory, removed as soon as it is read
            with tempfile.TemporaryDirectory(prefix="metralectl-kube-") as tmp:
                cert, key = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
                for path, text in ((cert, self.client_cert_pem), (key, self.client_key_pem)):
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "w") as out:
                        out.write(text)
                ctx.load_cert_chain(cert, key)


def config_path() -> Path:
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    for entry in listed:
        if Path(entry).expanduser().is_file():
            return Path(entry).expanduser()
    if listed:
        raise MetralError(f"no file of $KUBECONFIG exists ({clean(os.environ['KUBECONFIG'], 200)})",
                          "point KUBECONFIG at your cluster's kubeconfig", exit_code=ExitCode.USAGE)
    return Path.home() / ".kube" / "config"


def load(context: str | None = None, path: Path | None = None) -> KubeConfig:
    """The kubeconfig's `context` (default: its current-context) resolved to a server and credentials."""
    import yaml

    from metralectl.filecap import read_text

    path = path or config_path()
    if not path.is_file():
        raise MetralError(f"no kubeconfig at {path}", "set KUBECONFIG, or copy the cluster's (k3s: "
                          "/etc/rancher/k3s/k3s.yaml) to ~/.kube/config", exit_code=ExitCode.USAGE)
    try:
        doc = yaml.safe_load(read_text(path, CONFIG_LIMIT, "kubeconfig"))
    except yaml.YAMLError as exc:
        raise MetralError(f"{path} is not YAML ({clean(str(exc).splitlines()[0], 200)})", "check the kubeconfig",
                          exit_code=ExitCode.DATA) from None
    if not isinstance(doc, dict):
        raise MetralError(f"{path} is not a kubeconfig (no mapping)", "check the kubeconfig", exit_code=ExitCode.DATA)
    contexts = _named(doc, "contexts", "context", path)
    name = context or doc.get("current-context") or ""
    if name not in contexts:
        known = ", ".join(clean(n, 80) for n in sorted(contexts)) or "none"
        what = f"context {clean(str(name), 80)!r}" if name else "no current-context"
        raise MetralError(f"{what} in {path} (contexts: {known})",
                          "pass --on kube:CONTEXT with one of them, or `kubectl config use-context NAME`",
                          exit_code=ExitCode.USAGE)
    ctx = contexts[name]
    cluster = _named(doc, "clusters", "cluster", path).get(str(ctx.get("cluster")))
    user = _named(doc, "users", "user", path).get(str(ctx.get("user")), {})
    if not cluster or not isinstance(cluster.get("server"), str):
        raise MetralError(f"context {clean(name, 80)!r} names no cluster with a server in {path}",
                          "fix the kubeconfig's clusters", exit_code=ExitCode.DATA)
    if "exec" in user or "auth-provider" in user:
        plugin = "exec" if "exec" in user else "auth-provider"
        raise MetralError(f"context {clean(name, 80)!r}: its user authenticates through a credential plugin "
                          f"({plugin})", NO_PLUGINS, exit_code=ExitCode.USAGE)
    server = str(cluster["server"]).rstrip("/")
    if not SERVER_RE.fullmatch(server):
        raise MetralError(f"context {clean(name, 80)!r}: the cluster's server {clean(server, 120)!r} in {path} is no "
                          "http(s) URL", "fix the kubeconfig's clusters[].cluster.server", exit_code=ExitCode.DATA)
    base = path.parent
    token = user.get("token")
    if token is None and user.get("tokenFile"):
        token = _file(base, str(user["tokenFile"]), "tokenFile").strip()
    if token and not TOKEN_RE.fullmatch(str(token)):
        raise MetralError(f"context {clean(name, 80)!r}: the user's token in {path} (or its tokenFile) is not "
                          "printable ASCII, so it cannot go in a header", "fix the kubeconfig's token",
                          exit_code=ExitCode.DATA)
    return KubeConfig(
        context=name, server=server, namespace=str(ctx.get("namespace") or "default"),
        token=str(token) if token else None,
        ca_pem=_pem(cluster, "certificate-authority", base),
        client_cert_pem=_pem(user, "client-certificate", base), client_key_pem=_pem(user, "client-key", base),
        insecure=cluster.get("insecure-skip-tls-verify") is True, source=str(path))


def _named(doc: dict[str, Any], key: str, inner: str, path: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for entry in doc.get(key) or []:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str) and isinstance(entry.get(inner), dict):
            out[entry["name"]] = entry[inner]
    return out


def _file(base: Path, name: str, what: str) -> str:
    """A file the kubeconfig names (a path, as kubectl takes it: a `file://` URL is no path), read capped."""
    from metralectl.filecap import read_text

    path = base / Path(name).expanduser()
    try:
        return read_text(path, CONFIG_LIMIT, f"kubeconfig {what}")
    except (OSError, ValueError) as exc:  # missing, unreadable, not UTF-8
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise MetralError(f"the kubeconfig's {what} {clean(str(path), 200)} cannot be read: {why}",
                          f"fix {what} in the kubeconfig (a path, relative to the kubeconfig's directory)",
                          exit_code=ExitCode.DATA) from None


def _pem(section: dict[str, Any], key: str, base: Path) -> str | None:
    """`key-data` (base64 PEM) or `key` (a file, relative to the kubeconfig's directory)."""
    data = section.get(f"{key}-data")
    if data:
        try:
            return base64.b64decode(str(data), validate=True).decode()
        except (ValueError, UnicodeDecodeError):
            raise MetralError(f"kubeconfig {key}-data is not base64 of PEM text", "fix the kubeconfig",
                              exit_code=ExitCode.DATA) from None
    if section.get(key):
        return _file(base, str(section[key]), key)
    return None
