"""No internal error on hostile input (issue 27, class 7): a header value with CR/LF, a token file no client
can send, a file that will not fit in memory (a sparse terabyte) and one that is a FIFO, each in a place a
user or another program can put it. Walked through the real entry point (`python -m metralectl`): the
documented exit code (64 usage for a bad option, 65 data for a bad file), one line on stderr naming the file
or the option, never exit 70, never a traceback, never a hang."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from metralectl.errors import ExitCode, MetralError

REPO = Path(__file__).resolve().parents[2]
TERABYTE = 1 << 40


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _refused(out: subprocess.CompletedProcess[str], code: int, *says: str) -> None:
    assert out.returncode == code, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("metralectl: ") or "error:" in line]
    assert errors, out.stderr
    for word in says:
        assert word in out.stderr, (word, out.stderr)


def _hostile(path: Path, kind: str) -> Path:
    """A file at `path` that will not fit in memory (sparse, a terabyte by its size), or a FIFO."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        with open(path, "wb") as fh:
            fh.truncate(TERABYTE)
    return path


KINDS = ["huge", "fifo"]
SAYS = {"huge": "1099511627776 bytes", "fifo": "is a FIFO"}


class _Recorder(http.server.BaseHTTPRequestHandler):
    """An engine that records every request head it is sent."""

    protocol_version = "HTTP/1.1"
    heads: list[str] = []

    def log_message(self, *_: object) -> None:
        pass

    def _any(self) -> None:
        type(self).heads.append(str(self.headers))
        body = b'{"data": [{"id": "m"}]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _any
    do_POST = _any


@pytest.fixture()
def recorder() -> Iterator[str]:
    _Recorder.heads = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("header", ["X-Api-Key: secret\r\nX-Injected: 1", "X-Api-Key: secret\nX-Injected: 1",
                                    "X-Api-Key: caf\u00e9", "X Bad Name: 1", "X-Api-Key: a\x1bb"])
def test_a_header_that_cannot_be_sent_is_a_usage_error(recorder: str, header: str) -> None:
    out = _cli("bench", "run", "decode", "--url", recorder, "--header", header, "-p", "repeats=1", "-p", "warmup=0",
               "-p", "dialect=full", "-p", "timeout_s=10")
    _refused(out, ExitCode.USAGE, "--header")
    assert not any("X-Injected" in head for head in _Recorder.heads)  # nothing was sent, least of all that


def test_an_agent_token_no_client_can_send_is_refused(isolated_env: Path) -> None:
    from metralectl.app.agent_client import running_agent
    from metralectl.seams.agent_files import load_or_create_token, state_path, token_path

    token_path().parent.mkdir(parents=True, exist_ok=True)
    token_path().write_text("a" * 40 + "\r\nX-Injected: 1\n")
    token_path().chmod(0o600)
    with pytest.raises(MetralError, match="never has") as caught:
        load_or_create_token()
    assert caught.value.exit_code == ExitCode.DATA
    state_path().write_text(json.dumps({"pid": os.getpid(), "api_port": 9}))
    assert running_agent() is None  # the command works directly, and the token is never sent


@pytest.mark.parametrize("kind", KINDS)
def test_a_user_recipe_file_that_is_no_file(isolated_env: Path, kind: str) -> None:
    """`recipes check FILE` reads what it is given; `list` reads the config dir's recipes (a FIFO there is no
    file, and is passed over as before)."""
    recipe = _hostile(isolated_env / "config" / "recipes" / "big.yaml", kind)
    _refused(_cli("recipes", "check", str(recipe)), ExitCode.DATA, SAYS[kind])
    if kind == "huge":
        _refused(_cli("list"), ExitCode.DATA, "big.yaml", SAYS[kind])


@pytest.mark.parametrize("kind", KINDS)
def test_a_campaign_plan_that_is_no_file(tmp_path: Path, kind: str) -> None:
    plan = _hostile(tmp_path / "plan.yaml", kind)
    _refused(_cli("bench", "campaign", str(plan), "--dry-run"), ExitCode.DATA, "plan.yaml", SAYS[kind])


@pytest.mark.parametrize("kind", KINDS)
def test_bench_yaml_that_is_no_file(isolated_env: Path, kind: str) -> None:
    _hostile(isolated_env / "config" / "bench.yaml", kind)
    _refused(_cli("peer", "bench-config"), ExitCode.DATA, "bench.yaml", SAYS[kind])


@pytest.mark.parametrize("kind", KINDS)
def test_a_state_file_replaced(isolated_env: Path, kind: str) -> None:
    """The swap journal `ps` reads, replaced by a terabyte or a FIFO (Docker is not needed to see it)."""
    from metralectl.lifecycle.swap_journal import journal_path

    _hostile(journal_path(), kind)
    out = _cli("ps", "--json")
    _refused(out, ExitCode.DATA, "swap-journal.json", SAYS[kind])


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_record_replaced(isolated_env: Path, kind: str) -> None:
    directory = isolated_env / "metrale" / "runs" / "decode" / "20260101-000000-abcdef"
    directory.mkdir(parents=True)
    _hostile(directory / "run.json", kind)
    _refused(_cli("bench", "show", directory.name), ExitCode.DATA, "run.json", SAYS[kind])
    # `verify` says NOT VERIFIED with its exit code for a record it cannot check (docs/exit-codes.md: 1)
    _refused(_cli("verify", str(directory)), ExitCode.FAILED, "run.json", SAYS[kind])


def _pull(hub: str, token: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", "HF_ENDPOINT": hub, "HF_HUB_DISABLE_XET": "1"}
    if token is not None:
        env["HF_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "metralectl", "pull", "--weights-only", "demo-cpu"],
                          capture_output=True, text=True, cwd=REPO, timeout=120, stdin=subprocess.DEVNULL, env=env)


def test_a_hugging_face_token_no_request_can_carry(recorder: str) -> None:
    """HF_TOKEN (or the saved token) goes into an Authorization header: one that is not ASCII is a clear error
    naming the token, not a crash of the HTTP client (huggingface_hub drops line breaks from it itself)."""
    _refused(_pull(recorder, "hf_caf\u00e9"), ExitCode.DATA, "Hugging Face token")


def test_a_mirror_that_answers_what_no_hub_sends(recorder: str) -> None:
    """HF_ENDPOINT answers 200 with JSON of another shape: huggingface_hub's KeyError is the mirror's fault,
    said as such (exit 65), not an internal error."""
    _refused(_pull(recorder, None), ExitCode.DATA, "something a Hub does not send")
