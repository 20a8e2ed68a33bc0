"""An attacker's pass over `--on kube`: a hostile API server on loopback (answers no API server sends, redirects,
names with escapes and '/', a log that never ends) and kubeconfigs an unlucky user might have (a token that cannot
go in a header, CA or certificate data ssl cannot load, a `file://` path, a server that is no http(s) URL,
insecure-skip-tls-verify). Each is a clear error with exit 65 or 69, never an internal error (70) or a hang."""

from __future__ import annotations

import base64
import os
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes.kube_api import FakeKube
from tests.unit.test_kube_api import _pki


class Hostile:
    """A loopback HTTP server answering every request with `status`, `headers` and `body`; `trickle` streams a
    line every 0.2 s for ever. Records (method, path) of what it was asked."""

    def __init__(self) -> None:
        self.status, self.body, self.headers, self.trickle = 200, b"{}", {}, False
        self.calls: list[tuple[str, str]] = []
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                hostile.calls.append((self.command, self.path.split("?")[0]))
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(hostile.status)
                for k, v in hostile.headers.items():
                    self.send_header(k, v)
                if hostile.trickle:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    try:
                        while True:
                            self.wfile.write(b"5\r\nlog \n\r\n")
                            self.wfile.flush()
                            time.sleep(0.2)
                    except OSError:
                        return
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(hostile.body)))
                self.end_headers()
                self.wfile.write(hostile.body)

            do_GET = do_PATCH = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)  # bound here: the port is ours from now
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def hostile() -> Iterator[Hostile]:
    server = Hostile()
    yield server
    server.stop()


def _kubeconfig(path: Path, server: str, *, user: dict[str, Any] | None = None,
                cluster: dict[str, Any] | None = None) -> Path:
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "lab",
           "clusters": [{"name": "lab", "cluster": {"server": server, **(cluster or {})}}],
           "users": [{"name": "me", "user": user if user is not None else {"token": "t0ken"}}],
           "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "me", "namespace": "llm"}}]}
    path.write_text(yaml.safe_dump(doc))
    return path


def _cli(tmp_path: Path, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path / "home"), "NO_COLOR": "1",
           "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_STATE_HOME": str(tmp_path / "state"),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, env=env,
                          timeout=60)


def _no_internal_error(done: subprocess.CompletedProcess[str]) -> None:
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "\x1b" not in done.stderr + done.stdout


@pytest.mark.parametrize("body", [b"[1]", b"[" * 200_000, b"<html>login</html>", b"\xff\xfe", b"null"],
                         ids=["a-list", "deep", "html", "not-utf8", "null"])
def test_an_answer_no_api_server_sends_is_a_data_error(tmp_path: Path, hostile: Hostile, body: bytes) -> None:
    hostile.body = body
    config = _kubeconfig(tmp_path / "kc", hostile.url)
    for args in (("ps", "--on", "kube"), ("stop", "--on", "kube", "--all"), ("logs", "--on", "kube")):
        done = _cli(tmp_path, config, *args)
        assert done.returncode == 65 and "not a JSON object" in done.stderr, (args, done.stderr)
        _no_internal_error(done)


def test_a_redirect_is_refused_never_followed(tmp_path: Path, hostile: Hostile) -> None:
    hostile.status, hostile.body = 302, b""
    hostile.headers = {"Location": "http://127.0.0.9:9/steal"}  # never contacted: not followed
    done = _cli(tmp_path, _kubeconfig(tmp_path / "kc", hostile.url), "ps", "--on", "kube")
    assert done.returncode == 69 and "a redirect to http://127.0.0.9:9/steal" in done.stderr
    assert "does not follow" in done.stderr
    _no_internal_error(done)


def test_names_the_server_gives_never_steer_a_delete(tmp_path: Path, hostile: Hostile) -> None:
    """`stop` deletes what the server listed: a name with '/' or '..' would put another path in the URL."""
    import json

    for name in ("../../../kube-system/deployments/coredns", "evil\x1b]0;x\x07", None):
        hostile.calls.clear()
        hostile.body = json.dumps({"items": [{"metadata": {"name": name} if name else {}}]}).encode()
        done = _cli(tmp_path, _kubeconfig(tmp_path / "kc", hostile.url), "stop", "--on", "kube", "--all")
        assert done.returncode == 65 and "no Kubernetes name" in done.stderr, done.stderr
        assert not any(method == "DELETE" for method, _ in hostile.calls)
        _no_internal_error(done)


def test_pod_names_labels_and_phases_with_escapes_are_shown_escaped(tmp_path: Path, hostile: Hostile) -> None:
    import json

    hostile.body = json.dumps({"items": [{"metadata": {"name": "p\x1b]0;own\x07\u202e", "labels": {
        "ai.metrale.metralectl.recipe": "r\x1b[2J"}}, "status": {"phase": "Run\nning"},
        "spec": {"nodeName": "n\x9b"}}]}).encode()
    done = _cli(tmp_path, _kubeconfig(tmp_path / "kc", hostile.url), "ps", "--on", "kube")
    assert done.returncode == 0 and "p\\x1b]0;own\\x07\\u202e" in done.stdout and "Run\\nning" in done.stdout
    assert "r\\x1b[2J" in done.stdout and "\x9b" not in done.stdout and "\u202e" not in done.stdout
    _no_internal_error(done)


def test_a_log_that_never_ends_stops_at_the_deadline(tmp_path: Path, hostile: Hostile) -> None:
    from metralectl.seams.kube.client import KubeClient, KubeFailed
    from metralectl.seams.kube.config import load

    hostile.trickle = True
    client = KubeClient(load(None, _kubeconfig(tmp_path / "kc", hostile.url)), timeout_s=5, deadline_s=1)
    started = time.monotonic()
    with client, pytest.raises(KubeFailed, match="kept sending for more than 1 s"):
        client.log("llm", "metralectl-x-0", 20)
    assert time.monotonic() - started < 30  # the 1 s deadline, where the trickle would go on for ever


@pytest.mark.parametrize("user,cluster,said", [
    ({"token": "t\u00f6ken"}, {}, "not printable ASCII"),
    ({"token": "a\nAuthorization: x"}, {}, "not printable ASCII"),
    ({"token": "t"}, {"certificate-authority-data": base64.b64encode(b"not a PEM").decode()},
     "certificate-authority is not PEM"),
    ({"client-certificate-data": base64.b64encode(b"x").decode(), "client-key-data": base64.b64encode(b"y").decode()},
     {}, "client-certificate / client-key is not PEM"),
    ({"token": "t"}, {"certificate-authority": "file:///etc/ssl/certs/ca-certificates.crt"}, "cannot be read"),
    ({"token": "t"}, {"certificate-authority": "missing.pem"}, "cannot be read"),
], ids=["token-non-ascii", "token-newline", "ca-garbage", "client-cert-garbage", "file-url", "missing-file"])
def test_a_kubeconfig_fault_is_a_data_error_before_any_request(tmp_path: Path, hostile: Hostile, user: dict[str, Any],
                                                              cluster: dict[str, Any], said: str) -> None:
    url = hostile.url.replace("http://", "https://") if "certificate" in str(user) + str(cluster) else hostile.url
    done = _cli(tmp_path, _kubeconfig(tmp_path / "kc", url, user=user, cluster=cluster), "ps", "--on", "kube")
    assert done.returncode == 65 and said in done.stderr, done.stderr
    assert hostile.calls == [] and "t\u00f6ken" not in done.stderr  # the token's text is never printed
    _no_internal_error(done)


def test_a_server_that_is_no_http_url_is_a_data_error(tmp_path: Path) -> None:
    done = _cli(tmp_path, _kubeconfig(tmp_path / "kc", "file:///etc/passwd"), "ps", "--on", "kube")
    assert done.returncode == 65 and "no http(s) URL" in done.stderr
    _no_internal_error(done)


def test_insecure_skip_tls_verify_is_said_on_every_command(tmp_path: Path) -> None:
    pki = _pki(tmp_path)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(pki / "server.pem", pki / "server.key")
    fake = FakeKube()
    try:
        config = _kubeconfig(tmp_path / "kc", fake.start(server_ctx), cluster={"insecure-skip-tls-verify": True})
        done = _cli(tmp_path, config, "ps", "--on", "kube", "--json")
        assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr
        assert "skips TLS verification (insecure-skip-tls-verify)" in done.stderr
    finally:
        fake.stop()
