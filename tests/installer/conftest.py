"""Fixtures for the installer tests: one release per session, a loopback server, clean homes.

Everything install.sh needs at install time comes from the loopback server: the release directory
(built once per session by scripts/release.py) and the dependency wheels, which pip reads through
its own settings (PIP_NO_INDEX + PIP_FIND_LINKS pointing at the server's /wheels/ listing). The
wheels are collected from PyPI once, by `pip download --require-hashes -r <lock>`, into
~/.cache/metralectl-tests (kept between runs); the installs themselves run with proxies pointed at
a dead port, so anything but the loopback server would fail.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import platform
import shutil
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALL_SH = REPO / "install" / "install.sh"
FAKES = Path(__file__).resolve().parent / "fakes"

# What install.sh calls, besides the interpreter. The tests' PATH holds links to exactly these, so a
# test can take one away (no hash tool) or add a fake (systemctl).
TOOLS = [
    "awk", "basename", "cat", "cmp", "curl", "cut", "date", "dirname", "grep", "head", "id", "ln",
    "mkdir", "mktemp", "mv", "readlink", "rm", "rmdir", "sed", "sleep", "sort", "stat", "tail", "tr",
    "uname", "sha256sum",
]  # fmt: skip


def host_platform() -> str:
    machine = platform.machine().lower()
    return "linux-aarch64" if machine in ("aarch64", "arm64") else "linux-x86_64"


def make_bin(directory: Path, tools: Sequence[str], fakes: Sequence[str] = ()) -> Path:
    """A PATH directory with links to the named system tools, python3, and fake tools."""
    directory.mkdir(parents=True, exist_ok=True)
    for tool in tools:
        if tool in fakes:
            continue
        found = shutil.which(tool)
        if found:
            (directory / tool).symlink_to(found)
    (directory / "python3").symlink_to(os.path.realpath(sys.executable))
    for fake in fakes:
        target = directory / fake
        assert not target.exists() and not target.is_symlink()  # never copy through a link
        shutil.copyfile(FAKES / fake, target)
        target.chmod(0o755)
    return directory


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(root: Path) -> dict[str, str]:
    """Every path under root (links as 'link -> target'), to compare before and after."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "link -> " + os.readlink(path)
        elif path.is_file():
            out[rel] = sha256(path)
        else:
            out[rel] = "dir"
    return out


# --------------------------------------------------------------------------------------------------
# The release and the dependency wheels


@pytest.fixture(scope="session")
def release_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("release") / "release"
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "release.py"), "build", "--out", str(out)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return out


@pytest.fixture(scope="session")
def wheel_cache(release_dir: Path) -> Path:
    """This platform's locked dependency wheels, downloaded once and kept under ~/.cache."""
    lock = next(release_dir.glob(f"metralectl-*-{host_platform()}.lock.txt"))
    key = hashlib.sha256(lock.read_bytes() + sys.version.encode()).hexdigest()[:16]
    cache = Path.home() / ".cache" / "metralectl-tests" / f"wheels-{key}"
    if not (cache / ".complete").exists():
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True)
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
             "--only-binary", ":all:", "--require-hashes", "-r", str(lock), "-d", str(cache)],
            capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            pytest.fail(f"could not collect the dependency wheels (needs PyPI once):\n{done.stderr[-3000:]}")
        (cache / ".complete").touch()
    return cache


# --------------------------------------------------------------------------------------------------
# The loopback server


class _Handler(http.server.SimpleHTTPRequestHandler):
    requests: list[str]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def send_head(self):  # type: ignore[no-untyped-def]
        self.requests.append(self.path)
        return super().send_head()


@dataclass
class Server:
    root: Path
    url: str
    requests: list[str] = field(default_factory=list)

    def site(self, name: str, source: Path) -> str:
        """Serve a copy of source at /name/; returns its URL."""
        target = self.root / name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source, target)
        return f"{self.url}/{name}/"


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, release_dir: Path, wheel_cache: Path):
    root = tmp_path_factory.mktemp("www")
    (root / "wheels").symlink_to(wheel_cache)
    requests: list[str] = []
    handler = type("Handler", (_Handler,), {"requests": requests})

    def make(*args, **kwargs):  # type: ignore[no-untyped-def]
        return handler(*args, directory=str(root), **kwargs)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    srv = Server(root=root, url=f"http://127.0.0.1:{httpd.server_address[1]}", requests=requests)
    srv.site("good", release_dir)
    yield srv
    httpd.shutdown()


# --------------------------------------------------------------------------------------------------
# Running the installer


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@dataclass
class Box:
    """A clean machine for one test: HOME, TMPDIR, PATH, the server."""

    base: Path
    server: Server
    bin: Path
    home: Path = field(init=False)
    tmp: Path = field(init=False)
    env: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.home = self.base / "home"
        self.tmp = self.base / "tmp"
        self.home.mkdir()
        self.tmp.mkdir()
        self.env = {
            "HOME": str(self.home),
            "TMPDIR": str(self.tmp),
            "PATH": str(self.bin),
            "SHELL": "/bin/bash",
            "LANG": "C.UTF-8",
            "METRALECTL_DOWNLOAD_URL": f"{self.server.url}/good/",
            # pip: no config files (this machine's pip.conf adds indexes), no index, only the
            # loopback server's wheel listing.
            "PIP_CONFIG_FILE": os.devnull,
            "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": f"{self.server.url}/wheels/",
            # Anything that tried another host would go through a proxy that is not there.
            "http_proxy": "http://127.0.0.1:9",
            "https_proxy": "http://127.0.0.1:9",
            "HTTP_PROXY": "http://127.0.0.1:9",
            "HTTPS_PROXY": "http://127.0.0.1:9",
            "no_proxy": "127.0.0.1,localhost",
            "NO_PROXY": "127.0.0.1,localhost",
        }

    @property
    def data(self) -> Path:
        return self.home / ".local" / "share" / "metralectl"

    @property
    def link(self) -> Path:
        return self.home / ".local" / "bin" / "metralectl"

    def install(self, *args: str, env: dict[str, str] | None = None, timeout: float = 300,
                cwd: Path | None = None, stdin: bytes | None = None, shell: str = "dash") -> Run:
        argv = list(args)
        if os.geteuid() == 0 and "--allow-root" not in argv and not (env or {}).get("_NO_ALLOW_ROOT"):
            argv.append("--allow-root")   # the tests run as root here and in CI
        full_env = {**self.env, **(env or {})}
        full_env.pop("_NO_ALLOW_ROOT", None)
        cmd = [shutil.which(shell) or shell]
        cmd += ["-s", "--", *argv] if stdin is not None else [str(INSTALL_SH), *argv]
        done = subprocess.run(cmd, env=full_env, cwd=cwd or self.base, input=stdin,
                              capture_output=True, timeout=timeout)  # fmt: skip
        return Run(done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))

    def run_installed(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        # The program's own cache (what running it creates) goes outside HOME, so HOME shows only
        # what the installer made.
        full_env = {**self.env, "NO_COLOR": "1", "METRALECTL_CACHE_DIR": str(self.base / "cache"), **(env or {})}
        for key in ("PIP_CONFIG_FILE", "PIP_NO_INDEX", "PIP_FIND_LINKS"):
            full_env.pop(key)
        return subprocess.run([str(self.link), *args], env=full_env, cwd="/", capture_output=True,
                              text=True, timeout=120)  # fmt: skip


@pytest.fixture
def box(tmp_path: Path, server: Server) -> Box:
    return Box(base=tmp_path, server=server, bin=make_bin(tmp_path / "bin", TOOLS))


@pytest.fixture
def make_box(tmp_path: Path, server: Server):
    """A Box with a chosen PATH (tools removed, fakes added)."""
    count = [0]

    def make(tools: Sequence[str] = TOOLS, fakes: Sequence[str] = ()) -> Box:
        count[0] += 1
        base = tmp_path / f"box{count[0]}"
        base.mkdir()
        return Box(base=base, server=server, bin=make_bin(base / "bin", tools, list(fakes)))

    return make


# --------------------------------------------------------------------------------------------------
# A loopback https server (its own CA-less, self-signed certificate) and a loopback "other host"


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key (PEM); the certificate is its own CA."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "metralectl installer test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                    x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_pem, key_pem = directory / "cert.pem", directory / "key.pem"
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))  # fmt: skip
    return cert_pem, key_pem


class _TlsHandler(http.server.SimpleHTTPRequestHandler):
    """Files under its root, except the paths in `redirects`, which answer 302 with that Location."""

    requests: list[str]
    redirects: dict[str, str]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def send_head(self):  # type: ignore[no-untyped-def]
        self.requests.append(self.path)
        target = self.redirects.get(self.path)
        if target is not None:
            self.send_response(302)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        return super().send_head()


@dataclass
class TlsServer:
    root: Path
    url: str
    ca: Path
    requests: list[str] = field(default_factory=list)
    redirects: dict[str, str] = field(default_factory=dict)

    def trust_env(self, home: Path) -> dict[str, str]:
        """The environment that makes curl and wget trust this server's certificate (and only that)."""
        wgetrc = home.parent / "wgetrc"
        wgetrc.write_text(f"ca_certificate = {self.ca}\n")
        return {"CURL_CA_BUNDLE": str(self.ca), "WGETRC": str(wgetrc)}


@pytest.fixture(scope="session")
def tls_server(tmp_path_factory: pytest.TempPathFactory, release_dir: Path):
    import ssl

    base = tmp_path_factory.mktemp("tls")
    cert, key = _self_signed(base)
    root = base / "www"
    shutil.copytree(release_dir, root / "direct")
    requests: list[str] = []
    redirects: dict[str, str] = {}
    handler = type("TlsHandler", (_TlsHandler,), {"requests": requests, "redirects": redirects})

    def make(*args, **kwargs):  # type: ignore[no-untyped-def]
        return handler(*args, directory=str(root), **kwargs)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield TlsServer(root=root, url=f"https://127.0.0.1:{httpd.server_address[1]}", ca=cert,
                    requests=requests, redirects=redirects)
    httpd.shutdown()


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    """Stands in for every other host: a forward proxy on loopback that records each request it is
    sent (absolute-form, e.g. `GET http://other.invalid/good/SHA256SUMS`) and serves the release, so
    that an installer that went there would carry on as it would with a real other host."""

    seen: list[str]
    release: Path

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.seen.append(self.path)
        name = self.path.rstrip("/").rsplit("/", 1)[-1]
        file = self.release / name
        body = file.read_bytes() if name and file.is_file() else b""
        self.send_response(200 if body else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def other_host(release_dir: Path):
    """(proxy URL, the requests it was sent): point http_proxy at it and every non-loopback host is it."""
    seen: list[str] = []
    handler = type("ProxyHandler", (_ProxyHandler,), {"seen": seen, "release": release_dir})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()
