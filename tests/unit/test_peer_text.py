"""Text another machine chose is shown escaped and capped, with our own fingerprint first (issue 19, item 1):
`peer pair`, `peer list`, `nodes`, the agent's log, and the control-plane page (safetext.js, the twin of
metralectl/safetext.clean). Real peer listeners on loopback; the CLI as a user runs it."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from metralectl.agent.service import CleanFormatter, configure_logging
from metralectl.peers import ops
from metralectl.peers.admission import Facts, GpuFact
from metralectl.peers.config import BenchConfig, save_bench_config
from metralectl.peers.store import PeerStore
from metralectl.safetext import NAME_LIMIT, clean
from metralectl.seams import identity
from tests.unit.peer_fixtures import FACTS, Box, client, send_hello

REPO = Path(__file__).resolve().parents[2]
STATIC = REPO / "metralectl" / "agent" / "static"
ESC = "\x1b"
FORGED_NAME = "good-node\n  fingerprint: AAAA-BBBB-FAKE\nTrust this key? [y/N]: y\x1b[8m"


def _cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "METRALECTL_CONFIG_DIR": str(config), "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=60, env=env, stdin=subprocess.DEVNULL)


@pytest.fixture()
def forged(tmp_path: Path) -> Iterator[Box]:
    box = Box(tmp_path, "forged", node_name=FORGED_NAME)
    yield box
    box.stop()


def test_peer_pair_shows_the_fingerprint_first_and_the_name_escaped(forged: Box, tmp_path: Path) -> None:
    out = _cli(tmp_path / "me", "peer", "pair", forged.addr, "--yes")
    assert out.returncode == 0, out.stderr
    assert ESC not in out.stderr + out.stdout
    lines = out.stderr.splitlines()
    assert lines[0] == f"fingerprint: {forged.me.fingerprint}"  # first, and computed from the proven key
    assert [line for line in lines if "fingerprint:" in line.split("calls itself")[0]] == [lines[0]]  # no forged line
    assert not any(line.startswith("Trust this key?") for line in lines)
    assert "calls itself good-node\\n  fingerprint: AAAA-BBBB-FAKE\\nTrust" in out.stderr  # shown, escaped, capped
    assert "\\x1b" not in out.stderr or "\\x1b[8m" in out.stderr
    (paired,) = [line for line in out.stdout.splitlines() if line.startswith("paired:")]
    assert paired.startswith(f"paired: {forged.addr} {forged.me.fingerprint} (good-node\\n")


def test_peer_list_escapes_pending_hellos_and_caps_them(forged: Box, tmp_path: Path) -> None:
    stranger = identity.load_or_create(tmp_path / "stranger")
    name = "\x1b[2J\x1b[Hgranted bench to EVIL\n" + "x" * 500
    assert send_hello(stranger, forged, name=name).status_code == 200
    stored = PeerStore(forged.base).load().pending[0].name
    assert len(stored) <= NAME_LIMIT  # capped when stored, too
    out = _cli(forged.base, "peer", "list")
    assert out.returncode == 0, out.stderr
    assert ESC not in out.stderr + out.stdout and "\\x1b[2J\\x1b[H" in out.stderr
    (line,) = [line for line in out.stderr.splitlines() if line.startswith("pending hello:")]
    assert line.startswith(f"pending hello: {stranger.fingerprint}, which calls itself \\x1b[2J")  # ours first
    assert len(line) < 400
    assert not any(line.startswith("granted bench") for line in out.stderr.splitlines())
    assert json.loads(_cli(forged.base, "peer", "list", "--json").stdout)["pending"][0]["name"] == stored  # data as it is


def test_nodes_escapes_what_the_node_answers(tmp_path: Path) -> None:
    facts = Facts(gpu=lambda: GpuFact("GB10\x1b[2J\nother-node  admitted", "gb10\x1b[8m"), busy=FACTS.busy,
                  queued=FACTS.queued, memory=FACTS.memory, disk=FACTS.disk)
    node = Box(tmp_path, "node", facts=facts)
    try:
        me = identity.load_or_create(tmp_path / "me")
        ops.pair(node.addr, me, base=tmp_path / "me", confirm=lambda r, w: True, name="me")
        PeerStore(node.base).grant(me.fingerprint)
        save_bench_config(BenchConfig(enabled=True), node.base)
        out = _cli(tmp_path / "me", "nodes", node.addr)
        assert out.returncode == 0, out.stderr
        assert ESC not in out.stdout
        (line,) = out.stdout.splitlines()  # one node, one line: the GPU's name could not add another
        assert line.startswith(f"{node.addr}  admitted  gb10\\x1b[8m  GB10\\x1b[2J\\nother-node")
    finally:
        node.stop()


def test_the_agent_log_cannot_be_forged_by_a_hello_or_a_header(forged: Box, tmp_path: Path) -> None:
    stream = io.StringIO()
    level = logging.getLogger().level
    handler = configure_logging(stream)
    try:
        stranger = identity.load_or_create(tmp_path / "stranger")
        name = "x\n2030-01-01 00:00:00,000 metralectl.peers: granted bench to EVIL\x1b[2J"
        assert send_hello(stranger, forged, name=name).status_code == 200
        with client() as http:  # a refusal that quotes a header back
            http.get(f"http://{forged.addr}/peer/v1/admission", headers={
                "X-Metrale-Key": "k", "X-Metrale-To": "\x1b[2Jnot-me", "X-Metrale-Created": "1",
                "X-Metrale-Expires": "2", "X-Metrale-Nonce": "n" * 24, "X-Metrale-Signature": "s"})
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(level)
    text = stream.getvalue()
    assert ESC not in text
    lines = text.splitlines()
    assert any("hello from" in line and "x\\n2030-01-01 00:00:00,000 metralectl.peers: granted" in line
               for line in lines), text  # inside the hello line, escaped
    assert not any(line.startswith("2030-01-01") for line in lines)
    assert any("\\x1b[2Jnot-me" in line for line in lines)


def test_the_log_formatter_escapes_messages_but_keeps_our_tracebacks() -> None:
    formatter = CleanFormatter("%(name)s: %(message)s")
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("metralectl.peers", logging.ERROR, __file__, 1, "peer said %s", ("a\nb\x1b[2J",),
                                   sys.exc_info())
    text = formatter.format(record)
    first, *rest = text.splitlines()
    assert first == "metralectl.peers: peer said a\\nb\\x1b[2J"
    assert rest[0] == "Traceback (most recent call last):" and rest[-1] == "ValueError: boom"


# -- the control-plane page -----------------------------------------------------------------------------------
SAMPLES = ["plain", "a\x1b[2Jb", "line\nbreak\r\ttab", "\u202eevil.exe", "zero\u200bwidth", "\x7f\x85\x9b",
           "emoji 😀 ok", "lone \ud800 surrogate", "\U000e0041 tag", "é" * 70, "x" * 3000, "\u2028\u2029", ""]


def _node() -> str:
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        if os.environ.get("CI"):
            pytest.fail("CI: node is needed to check the page's safetext.js")
        pytest.skip("node is not installed")
    return node


@pytest.mark.parametrize("limit", [None, 64, 2000])
def test_the_pages_clean_is_the_same_function(limit: int | None) -> None:
    script = ("const {clean} = require(process.argv[1]);"
              "const input = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
              "process.stdout.write(JSON.stringify(input.samples.map((s) => clean(s, input.limit ?? undefined))));")
    payload = json.dumps({"samples": SAMPLES, "limit": limit})
    out = subprocess.run([_node(), "-e", script, str(STATIC / "safetext.js")], input=payload, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [clean(s, limit) for s in SAMPLES]


def test_the_page_writes_text_only_through_clean() -> None:
    app = (STATIC / "app.js").read_text()
    raw_writes = [line for line in app.splitlines() if re.search(r"\.(textContent|innerText)\s*=", line)]
    assert raw_writes == [
        'function setText(node, text) { node.textContent = clean(text, TEXT_LIMIT); }',
    ]
    assert "innerHTML" not in app and "insertAdjacentHTML" not in app and "document.write" not in app
    joblog = [line.split("//")[0] for line in (STATIC / "joblog.js").read_text().splitlines()]  # code, not comments
    assert not [line for line in joblog if re.search(r"innerHTML|insertAdjacentHTML|document\.|textContent|innerText",
                                                     line)]  # the job log's rows are values; app.js's el() writes them
    assert "document.createTextNode(clean(c, TEXT_LIMIT))" in app
    page = (STATIC / "index.html").read_text()
    assert page.index('src="/safetext.js"') < page.index('src="/joblog.js"') < page.index('src="/app.js"')


def test_the_agent_serves_safetext_js(tmp_path: Path) -> None:
    import httpx

    from metralectl.agent.api import LocalApiServer
    from tests.unit.test_agent_api import TOKEN, FakeOps

    server = LocalApiServer(FakeOps(), token=TOKEN, port=0)
    server.start("api")
    try:
        answer = httpx.get(f"http://127.0.0.1:{server.port}/safetext.js", trust_env=False)
        assert answer.status_code == 200 and "javascript" in answer.headers["content-type"]
        assert answer.content == (STATIC / "safetext.js").read_bytes()
        joblog = httpx.get(f"http://127.0.0.1:{server.port}/joblog.js", trust_env=False)  # the job log's rows
        assert joblog.status_code == 200 and "javascript" in joblog.headers["content-type"]
        assert joblog.content == (STATIC / "joblog.js").read_bytes()
    finally:
        server.stop()
