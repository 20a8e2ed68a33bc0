"""Where install.sh agrees to download from, and which redirects it follows, with the real curl and wget.

* The release URL is parsed, not matched by prefix: `http://127.0.0.1:x@OTHER/` is a URL for OTHER
  (everything before '@' is a user name and password), and it used to pass as "http to this machine".
  "OTHER" here is a forward proxy on loopback that every non-loopback host goes through, so an
  installer that went to OTHER is seen doing so without anything leaving this machine.
* A redirect is followed only to https://. curl has --proto-redir for that; wget has nothing
  equivalent (its --https-only is for recursive downloads: wget 1.21 follows https -> http with it),
  so install.sh follows wget's redirects itself, one hop at a time. Served by a loopback https server
  with a self-signed certificate that curl (CURL_CA_BUNDLE) and wget (WGETRC) are told to trust.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.installer.conftest import INSTALL_SH, TOOLS, Box, Server, TlsServer, make_bin, tree

WGET_TOOLS = [t for t in TOOLS if t != "curl"] + ["wget"]
DOWNLOADERS = {"curl": TOOLS, "wget": WGET_TOOLS}


def _need(tool: str) -> None:
    if not shutil.which(tool):
        pytest.skip(f"{tool} is not installed")


@pytest.fixture
def lib_sh(tmp_path: Path):
    """Runs a snippet after sourcing install.sh minus its last line (the functions, nothing run)."""
    lib = tmp_path / "install-lib.sh"
    lines = INSTALL_SH.read_text().splitlines(keepends=True)
    assert lines[-1].strip() == '{ main "$@"; }'
    lib.write_text("".join(lines[:-1]))
    bins = {name: make_bin(tmp_path / f"bin-{name}", tools) for name, tools in DOWNLOADERS.items()}

    def run(script: str, *, downloader: str = "curl", env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        full_env = {"HOME": str(tmp_path), "PATH": str(bins[downloader]), "LIB": str(lib),
                    "no_proxy": "127.0.0.1,localhost", "http_proxy": "http://127.0.0.1:9",
                    "https_proxy": "http://127.0.0.1:9", **(env or {})}  # fmt: skip
        return subprocess.run([shutil.which("dash") or "dash", "-c", '. "$LIB"; ' + script], env=full_env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip

    return run


# --- the URL check ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "https://releases.example/metralectl/latest",
        "https://mirror.example:8443/metralectl/v1.2.3",
        "http://127.0.0.1:8080/release",
        "http://127.0.0.1",
        "http://127.255.255.254/release",       # all of 127.0.0.0/8
        "http://localhost:1/release",
        "http://[::1]:8000/release",
        "http://[::1]/release",
        "file:///srv/release",
    ],
)
def test_accepted_urls(lib_sh, url: str) -> None:
    done = lib_sh('check_download_url "$URL" && echo accepted', env={"URL": url})
    assert done.returncode == 0 and done.stdout == "accepted\n", done.stderr


@pytest.mark.parametrize(
    "url, why",
    [
        ("http://127.0.0.1:x@other.example/release", "user info"),    # the reported bypass
        ("http://localhost@other.example/", "user info"),
        ("http://[::1]:1@other.example/", "user info"),
        ("https://user:password@mirror.example/release", "user info"),
        ("http://127.0.0.1;@other.example/", "user info"),
        ("http://127.0.0.1%40other.example/", "only https://"),
        ("http://127.0.0.1\\@other.example/", "characters"),
        ("http://127.0.0.1?@other.example/", "characters"),
        ("http://127.0.0.1#@other.example/", "characters"),
        ("http://127.0.0.1/ x", "characters"),
        ("http://127.0.0.1/\x1b[2J", "characters"),
        ("http://127.0.0.1/\nhttp://other.example/", "characters"),
        ("http://127.0.0.1/release\n", "characters"),
        ("http://other.example/release", "only https://"),
        ("http://localhost.other.example/", "only https://"),
        ("http://127.0.0.1.other.example/", "only https://"),
        ("http://127.1/", "only https://"),                    # shorthand: tools disagree
        ("http://0x7f.0.0.1/", "only https://"),
        ("http://127.0.0.01/", "only https://"),               # octal to some parsers
        ("http://127.0.0.256/", "only https://"),
        ("http://[::2]/", "only https://"),
        ("http://[::ffff:127.0.0.1]/", "only https://"),
        ("http://127.0.0.1:65536/", "not a number from 1 to 65535"),
        ("http://127.0.0.1:0/", "not a number from 1 to 65535"),
        ("http://127.0.0.1:/", "without a port number"),
        ("http://[::1/", "no closing ']'"),
        ("https:///release", "names no host"),
        ("HTTP://127.0.0.1/", "only https://"),
        ("ftp://mirror.example/", "only https://"),
    ],
)
def test_refused_urls_say_why(lib_sh, url: str, why: str) -> None:
    done = lib_sh('check_download_url "$URL" && echo accepted', env={"URL": url})
    assert done.returncode != 0 and done.stdout == "", done.stdout
    assert why in done.stderr, done.stderr
    assert "\x1b" not in done.stderr and "\n" not in done.stderr.split("': ")[0]   # shown escaped


@pytest.mark.parametrize("downloader", ["curl", "wget"])
def test_userinfo_url_never_reaches_the_other_host(make_box, other_host, downloader: str) -> None:
    """`http://127.0.0.1:x@OTHER/` is OTHER over plain http: refused before anything is downloaded."""
    _need(downloader)
    box: Box = make_box(tools=DOWNLOADERS[downloader])
    proxy, seen = other_host
    run = box.install(env={"METRALECTL_DOWNLOAD_URL": "http://127.0.0.1:x@other.example/good/",
                           "http_proxy": proxy, "HTTP_PROXY": proxy,
                           "METRALECTL_NO_AGENT": "1"})  # fmt: skip
    assert seen == [], f"the installer asked the other host for {seen}"
    assert run.returncode != 0, run.output[-2000:]
    assert "user info" in run.stderr and "nothing was installed" in run.stderr, run.stderr
    assert tree(box.home) == {}


# --- redirects ----------------------------------------------------------------------------------


@pytest.mark.parametrize("downloader", ["curl", "wget"])
def test_https_redirects_are_followed_to_https(lib_sh, tls_server: TlsServer, release_dir: Path,
                                               downloader: str) -> None:
    _need(downloader)
    base = tls_server.url
    tls_server.redirects.update({
        "/abs/SHA256SUMS": f"{base}/direct/SHA256SUMS",          # absolute
        "/path/SHA256SUMS": "/direct/SHA256SUMS",                # absolute path
        "/rel/SHA256SUMS": "../direct/SHA256SUMS",               # relative to the directory
        "/two/SHA256SUMS": f"{base}/abs/SHA256SUMS",             # a chain of two
    })  # fmt: skip
    want = (release_dir / "SHA256SUMS").read_bytes()
    env = tls_server.trust_env(release_dir.parent)
    for start in ("abs", "path", "rel", "two"):
        dest = release_dir.parent / f"got-{downloader}-{start}"
        done = lib_sh(f'BASE_URL="{base}/{start}"; pick_downloader; echo "$DOWNLOADER"; '
                      f'download "$BASE_URL/SHA256SUMS" "{dest}"', downloader=downloader, env=env)
        assert done.returncode == 0, (start, done.stderr)
        assert done.stdout == f"{downloader}\n"
        assert dest.read_bytes() == want, start


@pytest.mark.parametrize("downloader", ["curl", "wget"])
def test_https_to_http_redirect_is_refused(lib_sh, tls_server: TlsServer, server: Server, release_dir: Path,
                                           downloader: str) -> None:
    _need(downloader)
    site = f"plain-{downloader}"
    server.site(site, release_dir)
    tls_server.redirects[f"/down-{downloader}/SHA256SUMS"] = f"{server.url}/{site}/SHA256SUMS"
    dest = release_dir.parent / f"refused-{downloader}"
    done = lib_sh(f'BASE_URL="{tls_server.url}/down-{downloader}"; pick_downloader; '
                  f'download "$BASE_URL/SHA256SUMS" "{dest}"',
                  downloader=downloader, env=tls_server.trust_env(release_dir.parent))
    assert done.returncode != 0
    assert "not https://" in done.stderr, done.stderr
    assert not dest.exists()
    assert not [r for r in server.requests if r.startswith(f"/{site}/")], "the plain-http server was asked"


@pytest.mark.parametrize("downloader", ["curl", "wget"])
def test_install_refuses_a_redirect_to_plain_http(make_box, tls_server: TlsServer, release_dir: Path,
                                                  downloader: str) -> None:
    """The whole installer: an https release directory that redirects to plain http installs nothing."""
    _need(downloader)
    box: Box = make_box(tools=DOWNLOADERS[downloader])
    site = f"{box.base.name}-{downloader}-plain"
    box.server.site(site, release_dir)
    for file in release_dir.iterdir():
        tls_server.redirects[f"/{site}/{file.name}"] = f"{box.server.url}/{site}/{file.name}"
    run = box.install(env={"METRALECTL_DOWNLOAD_URL": f"{tls_server.url}/{site}/", "METRALECTL_NO_AGENT": "1",
                           **tls_server.trust_env(box.base)})  # fmt: skip
    assert [r for r in tls_server.requests if r.startswith(f"/{site}/")], "the https server was never asked"
    assert not [r for r in box.server.requests if r.startswith(f"/{site}/")], "followed the redirect to http"
    assert run.returncode != 0, run.output[-2000:]
    assert "not https://" in run.stderr and "nothing was installed" in run.stderr, run.stderr
    assert tree(box.home) == {}


def test_wget_installs_over_https_through_redirects(make_box, tls_server: TlsServer, release_dir: Path) -> None:
    """The wget fallback end to end: every file behind an https -> https redirect, installed and run."""
    _need("wget")
    box: Box = make_box(tools=WGET_TOOLS)
    site = f"{box.base.name}-wget-hops"
    for file in release_dir.iterdir():
        tls_server.redirects[f"/{site}/{file.name}"] = f"/direct/{file.name}"
    run = box.install(env={"METRALECTL_DOWNLOAD_URL": f"{tls_server.url}/{site}", "METRALECTL_NO_AGENT": "1",
                           **tls_server.trust_env(box.base)})  # fmt: skip
    assert run.returncode == 0, run.output[-3000:]
    asked = [r for r in tls_server.requests if r.startswith(f"/{site}/")]
    assert any(r.endswith("/SHA256SUMS") for r in asked) and any(r.endswith(".whl") for r in asked), asked
    version = box.run_installed("--version")
    assert version.returncode == 0 and version.stdout.startswith("metralectl "), version.stderr
