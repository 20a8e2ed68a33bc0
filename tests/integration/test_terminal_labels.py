"""Containers on a shared daemon carry whatever labels whoever started them chose (issue 27, classes 5 and 7):
`ps` shows them escaped whatever they say, and a label that is no URL or no number is a value shown, never
an internal error; `logs` shows the engine's own output without letting it drive the terminal. Real
containers on the real daemon (a busybox image made with `docker import`, nothing pulled), the CLI on a pty."""

from __future__ import annotations

import http.server
import io
import re
import shutil
import subprocess
import tarfile
import threading
import uuid
from collections.abc import Iterator

import pytest

from metralectl.core.labels import LABEL_ENDPOINT, LABEL_ENGINE, LABEL_MANAGED, LABEL_OWNER, LABEL_RANK, \
    LABEL_RECIPE, LABEL_RUN_ID, LABEL_SETS, LABEL_SPEC_HASH, owner
from tests.unit import ptyterm
from tests.unit.ptyterm import HOSTILE, assert_safe

IMAGE = "metralectl-test/busybox-term:latest"
COLOURS = [pytest.param({"NO_COLOR": "1"}, False, id="no-color"),
           pytest.param({"NO_COLOR": "", "FORCE_COLOR": "1"}, True, id="color")]


@pytest.fixture(scope="module")
def busybox(docker_daemon: None) -> str:
    """An image holding only a static busybox: `docker import` of a tar made here."""
    found = shutil.which("busybox")
    if found is None:
        pytest.skip("no static busybox on this machine to make a test image of")
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        tar.add(found, "bin/busybox")
        link = tarfile.TarInfo("bin/sh")
        link.type, link.linkname = tarfile.SYMTYPE, "busybox"
        tar.addfile(link)
    subprocess.run(["docker", "import", "-", IMAGE], input=data.getvalue(), check=True, capture_output=True,
                   timeout=120)
    return IMAGE


class _Hostile(http.server.BaseHTTPRequestHandler):
    """An engine endpoint a hostile label points at: /health answers 503 with hostile text."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *_: object) -> None:
        pass

    def do_GET(self) -> None:
        body = f'{{"status": "loading", "error": {HOSTILE!r}}}'.encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture()
def hostile_endpoint() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture()
def containers(busybox: str) -> Iterator[list[str]]:
    started: list[str] = []
    yield started
    if started:
        subprocess.run(["docker", "rm", "-f", *started], capture_output=True, timeout=120)


def _start(started: list[str], image: str, labels: dict[str, str], script: str = "sleep 600") -> str:
    name = f"metralectl-termtest-{uuid.uuid4().hex[:10]}"
    args = [arg for key, value in labels.items() for arg in ("--label", f"{key}={value}")]
    subprocess.run(["docker", "run", "-d", "--name", name, "--network", "host", *args, image, "/bin/busybox", "sh",
                    "-c", script], check=True, capture_output=True, timeout=120)
    started.append(name)
    return name


def _labels(**extra: str) -> dict[str, str]:
    return {LABEL_MANAGED: "true", LABEL_OWNER: owner(), **extra}


@pytest.mark.parametrize("env,color", COLOURS)
def test_ps_shows_hostile_labels_escaped(containers: list[str], busybox: str, hostile_endpoint: str,
                                         env: dict[str, str], color: bool) -> None:
    """Someone else's container, labelled as ours with hostile values (and a health answer that is hostile)."""
    _start(containers, busybox, _labels(**{
        LABEL_RECIPE: "recipe " + HOSTILE, LABEL_RUN_ID: "run " + HOSTILE, LABEL_ENDPOINT: hostile_endpoint,
        LABEL_ENGINE: "engine " + HOSTILE, LABEL_SPEC_HASH: HOSTILE, LABEL_SETS: "a=1\x1fb=" + HOSTILE}))
    _start(containers, busybox, {**_labels(**{LABEL_RECIPE: "owner", LABEL_ENDPOINT: "-"}), LABEL_OWNER: HOSTILE})
    for args in (["ps"], ["ps", "--repair"]):  # the report alone, and through the serving use case
        ran = ptyterm.run(args, env)
        assert ran.code == 0, ran.text
        assert_safe(ran, color=color, shows=("recipe \\x1b]0;PWNED\\x07", "\\u202eevil\\u200bname"))


@pytest.mark.parametrize("endpoint", [
    "not a url", "http://[::1", "http://127.0.0.1:99999", "http://127.0.0.1:8080/\x1b]0;x\x07", "ftp://127.0.0.1/",
    "http://", "http://a b/", "http://127.0.0.1:1/" + "x" * 70000,
])
def test_ps_survives_an_endpoint_label_that_is_no_url(containers: list[str], busybox: str, endpoint: str) -> None:
    _start(containers, busybox, _labels(**{LABEL_RECIPE: "nourl", LABEL_ENDPOINT: endpoint, LABEL_RANK: "two"}))
    ran = ptyterm.run(["ps"], {"NO_COLOR": "1"})
    assert ran.code == 0, ran.text
    assert_safe(ran, shows=())
    assert "nourl" in ran.text


@pytest.mark.parametrize("env,color", COLOURS)
def test_logs_do_not_drive_the_terminal(containers: list[str], busybox: str, env: dict[str, str],
                                        color: bool) -> None:
    """The engine's own output: its colours pass when we colour, its titles, clipboard writes, screen clears,
    8-bit controls and bidi overrides never do; a progress bar redrawn with CR shows its last state."""
    recipe = f"term-logs-{uuid.uuid4().hex[:8]}"
    script = ("printf '\\033[32mINFO\\033[0m ready \\033]0;PWNED\\007 \\033]52;c;ZXZpbA==\\007 \\033[2J\\033[H "
              "\\302\\233" "31m \\342\\200\\256evil\\342\\200\\213name\\n'; "
              "printf 'Loading 10%%\\rLoading 100%%\\n'; sleep 600")
    _start(containers, busybox, _labels(**{LABEL_RECIPE: recipe, LABEL_ENDPOINT: "http://127.0.0.1:9"}), script)
    ran = ptyterm.run(["logs", recipe], env)
    assert ran.code == 0, ran.text
    assert_safe(ran, color=color, shows=("\\x1b]0;PWNED\\x07", "\\x1b[2J", "\\x9b31m", "\\u202e", "\\u200b"))
    assert "Loading 100%" in ran.text and re.search(rb"\r(?!\n)", ran.data) is None  # no CR to write over a line
    assert ("\x1b[32mINFO" in ran.text) == color  # the engine's colour, only when we colour


def test_ps_reads_no_more_of_an_endless_health_answer_than_it_shows(containers: list[str], busybox: str) -> None:
    """The label points at a server whose /health never ends: `ps` keeps its first characters and leaves."""
    from tests.unit.endless_server import MiB, endless

    with endless({"/health": "body"}) as (url, state):
        _start(containers, busybox, _labels(**{LABEL_RECIPE: "endless", LABEL_ENDPOINT: url}))
        ran = ptyterm.run(["ps"], {"NO_COLOR": "1"})
        assert state.ended.wait(60)
    assert ran.code == 0 and "endless" in ran.text, ran.text
    assert state.sent["/health"] <= 64 * 1024 + 16 * MiB
