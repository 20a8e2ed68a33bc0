"""Where `recipes sync` reads from, tried as a hostile server or a booby-trapped directory would: an https
server (a certificate made here, trusted only by this test) that redirects to plain http, redirects to
file: and ftp:, plain http to a host that is not this machine, Content-Length lies, an endless body, a
server that drips; a FIFO, /dev/zero and a file whose size lies given as release assets. Every server is
on 127.0.0.1; no test reaches anything else (name lookups are replaced by a recorder that fails)."""

from __future__ import annotations

import datetime as _dt
import functools
import http.server
import ipaddress
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from metralectl.app import recipe_sync
from metralectl.core import release_archive as ra
from metralectl.core import synced_set
from metralectl.core.catalog import load_catalog
from metralectl.errors import ExitCode
from metralectl.seams.sync_fetch import Source
from tests.unit.recipe_helpers import REPO
from tests.unit.release_fixture import write_release


def _sync(source: Source, root: Path) -> recipe_sync.SyncReport:
    return recipe_sync.sync(load_catalog(use_cache=False), source, root=root, today="2026-12-01")


@pytest.fixture()
def root(isolated_env: Path) -> Path:
    return synced_set.synced_dir()


@pytest.fixture()
def no_lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Name lookups and connections to anything but 127.0.0.1 are recorded and fail: no test leaves the box."""
    asked: list[str] = []
    real_lookup, real_connect = socket.getaddrinfo, socket.create_connection

    def lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in ("127.0.0.1", b"127.0.0.1"):
            asked.append(str(host))
            raise socket.gaierror(socket.EAI_NONAME, "not looked up in tests")
        return real_lookup(host, *args, **kwargs)

    def connect(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        if address[0] != "127.0.0.1":
            asked.append(str(address[0]))
            raise OSError("no connection outside loopback in tests")
        return real_connect(address, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    monkeypatch.setattr(socket, "create_connection", connect)
    return asked


# --- servers on 127.0.0.1 ---------------------------------------------------------------------------------------


class _Site(http.server.SimpleHTTPRequestHandler):
    """Serves the release directory and records each request path on its server."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        self.server.seen.append(self.path)  # type: ignore[attr-defined]
        behaviour: Callable[[_Site], bool] | None = self.server.behaviour  # type: ignore[attr-defined]
        if behaviour is not None and behaviour(self):
            return
        super().do_GET()


@pytest.fixture()
def serve(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(site: Path, behaviour: Callable[[_Site], bool] | None = None,
              tls: ssl.SSLContext | None = None) -> http.server.ThreadingHTTPServer:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Site, directory=str(site)))
        server.daemon_threads = True
        server.seen = []  # type: ignore[attr-defined]
        server.behaviour = behaviour  # type: ignore[attr-defined]
        if tls is not None:
            server.socket = tls.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _url(server: http.server.ThreadingHTTPServer, scheme: str = "http") -> str:
    return f"{scheme}://127.0.0.1:{server.server_address[1]}/"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, made here: (cert, key) PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "metralectl test")])
    now = _dt.datetime.now(_dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - _dt.timedelta(days=1))
            .not_valid_after(now + _dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    where = tmp_path_factory.mktemp("tls")
    (where / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (where / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
    return where / "cert.pem", where / "key.pem"


@pytest.fixture()
def tls(certificate: tuple[Path, Path]) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(the server's context, a client context that trusts only the test certificate)."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(*certificate)
    return server, ssl.create_default_context(cafile=str(certificate[0]))


def _redirect_to(target: Callable[[str], str]) -> Callable[[_Site], bool]:
    def behaviour(handler: _Site) -> bool:
        handler.send_response(302)
        handler.send_header("Location", target(handler.path))
        handler.send_header("Content-Length", "0")
        handler.end_headers()
        return True
    return behaviour


# --- https and redirects ----------------------------------------------------------------------------------------


def test_a_release_over_https_with_a_trusted_certificate_syncs(tmp_path: Path, root: Path, serve: Any,
                                                              tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    write_release(tmp_path / "site" / "b41")
    server = serve(tmp_path / "site", tls=tls[0])
    report = _sync(Source(_url(server, "https") + "b41/", context=tls[1]), root)
    assert report.installed and report.release == "b41"


def test_an_https_to_http_redirect_is_refused_and_the_http_server_never_asked(
        tmp_path: Path, root: Path, serve: Any, tls: tuple[ssl.SSLContext, ssl.SSLContext],
        certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))  # trusted the way a user would: the default context
    release = write_release(tmp_path / "site")
    plain = serve(release)
    secure = serve(release, _redirect_to(lambda path: _url(plain) + path.lstrip("/")), tls=tls[0])
    with pytest.raises(ra.ReleaseError, match="a redirect from https to plain http .* it was not followed") as caught:
        _sync(Source(_url(secure, "https")), root)
    assert caught.value.exit_code == ExitCode.DATA
    assert secure.seen == ["/index.json"] and plain.seen == []  # refused before a byte went to the http server
    assert not root.exists()


def test_the_cli_trusts_ssl_cert_file_and_refuses_the_downgrade(tmp_path: Path, isolated_env: Path, serve: Any,
                                                                certificate: tuple[Path, Path],
                                                                tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    """The whole command, the certificate trusted the way a user would (SSL_CERT_FILE), no injection."""
    release = write_release(tmp_path / "site")
    plain = serve(release)
    secure = serve(release, _redirect_to(lambda path: _url(plain) + path.lstrip("/")), tls=tls[0])
    env = {**os.environ, "METRALECTL_CONFIG_DIR": str(isolated_env / "config"), "SSL_CERT_FILE": str(certificate[0])}
    out = subprocess.run([sys.executable, "-m", "metralectl", "recipes", "sync", "--from", _url(secure, "https")],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert out.returncode == ExitCode.DATA, out.stderr
    assert "a redirect from https to plain http" in out.stderr and "Traceback" not in out.stderr
    assert secure.seen == ["/index.json"] and plain.seen == []


@pytest.fixture()
def listener() -> Iterator[tuple[int, list[socket.socket]]]:
    """A bare TCP port on 127.0.0.1 that records every connection made to it (and holds it open)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(sock.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield sock.getsockname()[1], accepted
    sock.close()
    for conn in accepted:
        conn.close()


@pytest.mark.parametrize("scheme", ["ftp", "file", "data"])
def test_a_redirect_to_another_scheme_is_refused(tmp_path: Path, root: Path, serve: Any, scheme: str,
                                                 listener: tuple[int, list[socket.socket]]) -> None:
    port, accepted = listener
    target = {"ftp": f"ftp://127.0.0.1:{port}/index.json", "file": "file:///etc/passwd",
              "data": "data:,hello"}[scheme]
    server = serve(write_release(tmp_path / "site"), _redirect_to(lambda path: target))
    with pytest.raises(ra.ReleaseError, match=r"only http and https are fetched\); it was not followed"):
        _sync(Source(_url(server)), root)
    assert accepted == []  # the ftp "server" was never contacted


def test_plain_http_to_another_host_needs_allow_http_and_is_refused_before_any_lookup(
        root: Path, no_lookups: list[str]) -> None:
    with pytest.raises(ra.ReleaseError, match="plain http to a host that is not this machine") as caught:
        Source("http://releases.invalid/b41/")
    assert caught.value.exit_code == ExitCode.USAGE and "--allow-http" in (caught.value.hint or "")
    assert no_lookups == []
    with pytest.raises(ra.ReleaseError, match="failed") as failed:  # allowed: then it is tried (and fails here)
        _sync(Source("http://releases.invalid/b41/", allow_http=True), root)
    assert failed.value.exit_code == ExitCode.UNAVAILABLE and no_lookups == ["releases.invalid"]
    for fine in ("http://127.0.0.1:9/b41/", "http://localhost:9/", "http://[::1]:9/", "https://releases.invalid/"):
        Source(fine)
    for doubtful in ("http://a.localhost/", "http://127.1/", "http://0x7f000001/", "http://localhost.invalid/"):
        with pytest.raises(ra.ReleaseError, match="plain http to a host that is not this machine"):
            Source(doubtful)
    assert no_lookups == ["releases.invalid"]


def test_the_cli_refuses_plain_http_off_loopback_with_exit_64(isolated_env: Path) -> None:
    env = {**os.environ, "METRALECTL_CONFIG_DIR": str(isolated_env / "config")}
    out = subprocess.run([sys.executable, "-m", "metralectl", "recipes", "sync", "--from",
                          "http://releases.invalid/b41/"], capture_output=True, text=True, env=env, cwd=REPO,
                         timeout=120)
    assert out.returncode == ExitCode.USAGE and "pass --allow-http" in out.stderr, out.stderr


def test_a_loopback_http_redirect_to_another_host_is_refused_before_any_lookup(
        tmp_path: Path, root: Path, serve: Any, no_lookups: list[str]) -> None:
    server = serve(write_release(tmp_path / "site"), _redirect_to(lambda path: "http://releases.invalid" + path))
    with pytest.raises(ra.ReleaseError, match="a redirect to http://releases.invalid/index.json is plain http"):
        _sync(Source(_url(server)), root)
    assert no_lookups == []


@pytest.mark.parametrize("location", ["http://[::1", "http://127.0.0.1:99999/", "http://127.0.0.1/\r\nX-Evil: 1",
                                      "ht\x1btp://x"])
def test_a_malformed_source_is_a_clear_error_not_an_internal_one(location: str) -> None:
    with pytest.raises(ra.ReleaseError) as caught:
        Source(location)
    assert "\x1b" not in caught.value.message and "\r" not in caught.value.message


# --- servers that lie about sizes, or never finish ------------------------------------------------------------


def _lying_length(delta: int) -> Callable[[_Site], bool]:
    def behaviour(handler: _Site) -> bool:
        if not handler.path.endswith("/index.json"):
            return False
        data = (Path(handler.directory) / "index.json").read_bytes()
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(data) + delta))
        handler.end_headers()
        handler.wfile.write(data)
        handler.close_connection = True
        return True
    return behaviour


def test_a_content_length_larger_than_the_body_is_refused(tmp_path: Path, root: Path, serve: Any) -> None:
    server = serve(write_release(tmp_path / "site"), _lying_length(+100))
    with pytest.raises(ra.ReleaseError, match=r"index.json: the server closed the connection after \d+ of \d+ bytes") \
            as caught:
        _sync(Source(_url(server)), root)
    assert caught.value.exit_code == ExitCode.UNAVAILABLE


def test_a_content_length_smaller_than_the_body_cuts_it_and_fails_its_digest(tmp_path: Path, root: Path,
                                                                            serve: Any) -> None:
    server = serve(write_release(tmp_path / "site"), _lying_length(-100))
    with pytest.raises(ra.ReleaseError, match="index.json has sha256 .*, but index.json.sha256 says") as caught:
        _sync(Source(_url(server)), root)
    assert caught.value.exit_code == ExitCode.DATA


def _endless(handler: _Site) -> bool:
    handler.send_response(200)
    handler.end_headers()  # no Content-Length: the body ends when the connection does
    try:
        for _ in range(64 << 10):  # 4 GB at most, should the client not stop
            handler.wfile.write(bytes(1 << 16))
    except OSError:
        pass
    handler.close_connection = True
    return True


def test_an_endless_body_stops_at_the_assets_cap(tmp_path: Path, root: Path, serve: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ra.LIMITS, "index.json", 1 << 20)
    server = serve(write_release(tmp_path / "site"), _endless)
    with pytest.raises(ra.ReleaseError, match="index.json is more than the 1 MB this asset may be") as caught:
        _sync(Source(_url(server)), root)
    assert caught.value.exit_code == ExitCode.DATA


def _drip(phase: str) -> Callable[[_Site], bool]:
    """A byte every 50 ms, in the headers or in the body, for 30 s at most (never a read that times out)."""
    def behaviour(handler: _Site) -> bool:
        handler.wfile.write(b"HTTP/1.1 200 OK\r\n")
        if phase == "body":
            handler.wfile.write(b"Content-Length: 1000000\r\n\r\n")
        else:
            handler.wfile.write(b"X-Slow: ")
        handler.wfile.flush()
        try:
            for _ in range(600):
                handler.wfile.write(b"a")
                handler.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass
        handler.close_connection = True
        return True
    return behaviour


@pytest.mark.parametrize("phase", ["headers", "body"])
def test_a_server_that_drips_is_cut_off_at_the_assets_deadline(tmp_path: Path, root: Path, serve: Any,
                                                                monkeypatch: pytest.MonkeyPatch, phase: str) -> None:
    from metralectl.seams import sync_http

    monkeypatch.setattr(sync_http, "DEADLINE_S", 0.5)
    server = serve(write_release(tmp_path / "site"), _drip(phase))
    with pytest.raises(ra.ReleaseError, match=r"index.json did not finish within 0.5 s; the connection was closed") \
            as caught:
        _sync(Source(_url(server)), root)
    assert caught.value.exit_code == ExitCode.UNAVAILABLE


def test_a_tls_handshake_that_never_comes_is_cut_off_at_the_deadline(root: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     listener: tuple[int, list[socket.socket]]) -> None:
    from metralectl.seams import sync_http

    monkeypatch.setattr(sync_http, "DEADLINE_S", 0.5)
    port, accepted = listener
    with pytest.raises(ra.ReleaseError, match="did not finish within 0.5 s"):
        _sync(Source(f"https://127.0.0.1:{port}/"), root)
    assert len(accepted) == 1


# --- --from DIR: a FIFO, /dev/zero, a size that lies -----------------------------------------------------------


def _unblock_later(fifo: Path) -> threading.Thread:
    """Opens the FIFO's other end after a while, so that code which blocks on it (as main's did) returns."""
    def writer() -> None:
        for _ in range(100):
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                time.sleep(0.1)
                continue
            os.write(fd, b"{}")
            os.close(fd)
            return
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    return thread


def test_a_fifo_given_as_an_asset_is_refused_without_blocking(tmp_path: Path, root: Path) -> None:
    release = write_release(tmp_path / "b40")
    (release / "index.json").unlink()
    os.mkfifo(release / "index.json")
    _unblock_later(release / "index.json")
    with pytest.raises(ra.ReleaseError, match="index.json is a FIFO; a release asset is read only from a regular"):
        _sync(Source(str(release)), root)


def test_a_link_to_dev_zero_is_refused_not_read(tmp_path: Path, root: Path) -> None:
    release = write_release(tmp_path / "b40")
    (release / "recipes.tar.gz").unlink()
    (release / "recipes.tar.gz").symlink_to("/dev/zero")
    with pytest.raises(ra.ReleaseError, match="recipes.tar.gz is a device"):
        _sync(Source(str(release)), root)


def test_a_file_whose_size_says_nothing_is_read_to_the_cap_only(tmp_path: Path, root: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A /proc file says st_size 0 and holds more: the cap is on the bytes read, not on what stat says."""
    proc = Path("/proc/self/maps")
    assert proc.stat().st_size == 0 and len(proc.read_bytes()) > 200
    monkeypatch.setitem(ra.LIMITS, "index.json", 200)
    release = write_release(tmp_path / "b40")
    (release / "index.json").unlink()
    (release / "index.json").symlink_to(proc)
    with pytest.raises(ra.ReleaseError, match="index.json is more than the 200 bytes this asset may be"):
        _sync(Source(str(release)), root)


def test_a_file_larger_than_its_cap_is_refused(tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ra.LIMITS, "serve-options.json", 4096)
    release = write_release(tmp_path / "b40")
    with open(release / "serve-options.json", "ab") as fh:
        fh.truncate(1 << 30)  # sparse: 1 GB of nothing, on no disk
    with pytest.raises(ra.ReleaseError, match="serve-options.json is more than the 4 KB this asset may be"):
        _sync(Source(str(release)), root)
