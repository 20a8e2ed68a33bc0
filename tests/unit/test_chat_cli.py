"""`metralectl chat` as a real subprocess against real loopback HTTP servers: the bench truth server, the
engine double (run directly, no Docker), and a small scripted server here for the failures; the REPL is
driven through a pseudo-terminal (Ctrl-D, /exit, Ctrl-C during an answer, history kept)."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from metralectl.errors import ExitCode

from tests.bench_truth.helpers import REPO, truth_server

ESC = "\x1b"


def cli(*args: str, stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", "chat", *args], input=stdin, capture_output=True,
                          text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=timeout)


class Scripted(BaseHTTPRequestHandler):
    """An OpenAI-style chat endpoint whose answer depends on the last user message (see do_POST)."""

    protocol_version = "HTTP/1.0"  # the body ends when the connection closes, as a cut stream does

    def log_message(self, *_: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._json(200, {"object": "list", "data": [{"id": "scripted-model"}]})

    def _json(self, status: int, value: Any) -> None:
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _event(self, value: Any) -> None:
        self.wfile.write(b"data: " + (value if isinstance(value, bytes) else json.dumps(value).encode()) + b"\n\n")
        self.wfile.flush()

    def _delta(self, text: str, finish: str | None = None) -> None:
        self._event({"model": "scripted-model", "choices": [{"index": 0, "delta": {"content": text} if text else {},
                                                             "finish_reason": finish}]})

    def do_POST(self) -> None:
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        messages = req["messages"]
        last = messages[-1]["content"]
        if last == "http500":
            self._json(500, {"error": {"message": f"kv cache exhausted{ESC}[2J"}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if last == "cut":
            self._delta("half an ans")
            return  # the connection closes: no finish_reason, no [DONE]
        if last == "errevent":
            self._delta("partial")
            self._event({"error": {"message": "engine fault: Xid 13"}})
            return
        if last == "slow":
            try:
                for i in range(300):
                    self._delta(f"tok{i} ")
                    time.sleep(0.1)
            except (BrokenPipeError, ConnectionResetError):
                return  # the client stopped reading (Ctrl-C): what the test wants
        elif last == "escape":
            self._delta(f"red{ESC}[31mtext\x07\nnext line")
        else:
            roles = ",".join(m["role"] for m in messages)
            self._delta(f"roles={roles} last={last} max={req.get('max_tokens')} temp={req.get('temperature')}")
        self._delta("", "stop")
        self._event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10}})
        self._event(b"[DONE]")


@pytest.fixture(scope="module")
def scripted() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


# -- one prompt ---------------------------------------------------------------------------------------
def test_one_shot_against_the_truth_server_streams_the_answer_and_exits_0() -> None:
    with truth_server("--ttft-ms", "5", "--itl-ms", "2", "--reasoning", "2") as url:
        out = cli("--url", url, "--max-tokens", "6", "hello there")
    assert out.returncode == ExitCode.OK, out.stderr
    assert out.stdout == " word" * 4 + "\n"  # 2 of the 6 tokens were reasoning: on stderr, not stdout
    assert "think think" in out.stderr and "cut at its token limit (--max-tokens 6)" in out.stderr


def test_tokens_reach_stdout_while_the_answer_is_still_streaming() -> None:
    """The first token is on stdout before the server has even sent its finish (held back 3 s here)."""
    with truth_server("--ttft-ms", "5", "--itl-ms", "5", "--tail-ms", "3000") as url:
        proc = subprocess.Popen([sys.executable, "-m", "metralectl", "chat", "--url", url, "--max-tokens", "3", "hi"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
                                env=dict(os.environ, PYTHONPATH=str(REPO)))
        try:
            assert proc.stdout is not None
            first = os.read(proc.stdout.fileno(), 100)
            still_running = proc.poll() is None
            rest = proc.stdout.read()
            code = proc.wait(60)
        finally:
            proc.kill()
    assert first.startswith(b" word") and still_running
    assert (first + rest).decode() == " word word word\n" and code == ExitCode.OK


def test_json_prints_the_final_message_and_usage() -> None:
    with truth_server("--ttft-ms", "5", "--itl-ms", "2", "--reasoning", "1") as url:
        out = cli("--url", url + "/v1/", "--json", "--max-tokens", "3", "hi")
    assert out.returncode == ExitCode.OK, out.stderr
    doc = json.loads(out.stdout)
    assert doc["message"] == {"role": "assistant", "content": " word word", "reasoning_content": " think"}
    assert doc["model"] == "truth-model" and doc["finish_reason"] == "length" and doc["url"] == url
    assert doc["usage"]["completion_tokens"] == 3


def test_the_engine_double_answers(tmp_path: Any) -> None:
    from tests.unit.test_engine_double_local import MARKER, Double, clean_env

    double = Double("serve", "Qwen/Qwen3-8B", env=clean_env())
    try:
        assert double.wait_for(MARKER), double.text
        out = cli("--url", double.url, "What is the capital of France?")
    finally:
        double.stop()
    assert out.returncode == ExitCode.OK, out.stderr
    assert out.stdout.startswith("Paris is the capital of France.")


def test_options_system_max_tokens_temperature_and_stdin_reach_the_request(scripted: str) -> None:
    out = cli("--url", scripted, "--system", "be brief", "--max-tokens", "9", "--temperature", "0.5", stdin="from a pipe\n")
    assert out.returncode == ExitCode.OK, out.stderr
    assert out.stdout == "roles=system,user last=from a pipe max=9 temp=0.5\n"


def test_engine_text_cannot_drive_the_terminal(scripted: str) -> None:
    out = cli("--url", scripted, "escape")
    assert out.returncode == ExitCode.OK
    assert ESC not in out.stdout and "\x07" not in out.stdout
    assert out.stdout == "red\\x1b[31mtext\\x07\nnext line\n"  # text stays text: its line break kept


# -- failures -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("prompt,code,says", [
    ("http500", ExitCode.FAILED, "the engine answered HTTP 500: kv cache exhausted\\x1b[2J"),
    ("cut", ExitCode.FAILED, "the stream ended before the answer finished"),
    ("errevent", ExitCode.FAILED, "the engine stopped with an error: engine fault: Xid 13"),
])
def test_failures_say_so_on_stderr_with_a_non_zero_exit(scripted: str, prompt: str, code: int, says: str) -> None:
    out = cli("--url", scripted, prompt)
    assert out.returncode == code, (out.stdout, out.stderr)
    assert says in out.stderr and ESC not in out.stderr
    assert "Traceback" not in out.stderr


def test_nothing_listening_is_unavailable() -> None:
    out = cli("--url", "http://127.0.0.1:9", "hi")
    assert out.returncode == ExitCode.UNAVAILABLE and "nothing answers at http://127.0.0.1:9" in out.stderr


@pytest.mark.parametrize("args,says", [(["--url", "http://127.0.0.1:9"], "no prompt: stdin was empty"),
                                       (["--url", "ftp://x", "hi"], "expected http://HOST:PORT"),
                                       (["a", "b", "c"], "expected [RECIPE] [PROMPT]")])
def test_usage_errors(args: list[str], says: str) -> None:
    out = subprocess.run([sys.executable, "-m", "metralectl", "chat", *args], capture_output=True, text=True,
                         cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == ExitCode.USAGE and says in out.stderr


def test_help_imports_nothing_heavy() -> None:
    code = ("import sys, runpy\nsys.argv = ['metralectl', 'chat', '--help']\n"
            "try:\n    runpy.run_module('metralectl', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('HEAVY=' + ','.join(m for m in ('docker', 'httpx', 'textual') if m in sys.modules), file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.stderr.rstrip().endswith("HEAVY=") and "[RECIPE] [PROMPT]" in out.stdout


# -- the REPL, through a pseudo-terminal ----------------------------------------------------------------
class Pty:
    def __init__(self, *args: str) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the pty is its controlling terminal (Ctrl-C is a real SIGINT)
            os.chdir(REPO)
            os.environ["PYTHONPATH"] = str(REPO)
            os.execv(sys.executable, [sys.executable, "-m", "metralectl", "chat", *args])
        self.seen = ""
        self.pos = 0  # what expect() has matched so far: each expect looks only after it

    def expect(self, needle: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while needle not in self.seen[self.pos:]:
            left = deadline - time.monotonic()
            assert left > 0, f"{needle!r} never came; saw {self.seen!r}"
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.fd, 4096).decode(errors="replace")
                except OSError:
                    chunk = ""
                assert chunk, f"the pty closed before {needle!r}; saw {self.seen!r}"
                self.seen += chunk
        self.pos = self.seen.index(needle, self.pos) + len(needle)
        return self.seen

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def _drain(self) -> None:
        """What the process wrote before it ended and is still in the pty."""
        while True:
            try:
                ready, _, _ = select.select([self.fd], [], [], 0.2)
                chunk = os.read(self.fd, 4096) if ready else b""
            except OSError:
                return
            if not chunk:
                return
            self.seen += chunk.decode(errors="replace")

    def exit_code(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                ready, _, _ = select.select([self.fd], [], [], 0.1)
                if ready:
                    self.seen += os.read(self.fd, 4096).decode(errors="replace")
            except OSError:
                pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._drain()
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError(f"still running; saw {self.seen!r}")


def test_repl_keeps_the_history_and_ends_on_exit(scripted: str) -> None:
    term = Pty("--url", scripted, "--system", "sys")
    term.expect(">>> ")
    term.send("one\r")
    term.expect("roles=system,user last=one")
    term.expect(">>> ")
    term.send("two\r")
    term.expect("roles=system,user,assistant,user last=two")  # the first exchange went with the second question
    term.expect(">>> ")
    term.send("/clear\r")
    term.expect("forgotten")
    term.send("three\r")
    term.expect("roles=system,user last=three")
    term.send("/exit\r")
    assert term.exit_code() == ExitCode.OK


def test_repl_ctrl_c_stops_an_answer_and_ctrl_d_ends(scripted: str) -> None:
    term = Pty("--url", scripted)
    term.expect(">>> ")
    term.send("slow\r")
    term.expect("tok2 ")
    term.send("\x03")  # Ctrl-C: the terminal sends SIGINT to the process
    term.expect("cancelled")
    term.expect(">>> ")
    term.send("after\r")
    term.expect("roles=user last=after")  # the cancelled exchange is not in the history
    term.expect(">>> ")
    term.send("\x04")  # Ctrl-D
    assert term.exit_code() == ExitCode.OK
    assert "Traceback" not in term.seen


def test_json_on_a_terminal_without_a_prompt_is_a_usage_error() -> None:
    term = Pty("--json", "--url", "http://127.0.0.1:9")
    term.expect("--json answers one prompt")
    assert term.exit_code() == ExitCode.USAGE


# -- which endpoint: what metralectl serves (the daemon's labelled containers, faked here) ------------------
@pytest.fixture()
def served(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    from metralectl.app import chat

    found: list[tuple[str, str]] = []
    monkeypatch.setattr(chat, "served_engines", lambda: [(name, url, {}) for name, url in found])
    return found


def test_the_one_served_model_is_the_default(served: list[tuple[str, str]]) -> None:
    from metralectl.app.chat import ChatTarget, resolve

    served.append(("qwen3-8b", "http://127.0.0.1:8888"))
    assert resolve(None, None) == ChatTarget("http://127.0.0.1:8888", "qwen3-8b")
    assert resolve("qwen3-8b", None) == ChatTarget("http://127.0.0.1:8888", "qwen3-8b")
    assert resolve(None, "http://127.0.0.1:9000/v1/") == ChatTarget("http://127.0.0.1:9000", None)


def test_nothing_served_another_recipe_or_two_served(served: list[tuple[str, str]]) -> None:
    from metralectl.app.chat import resolve
    from metralectl.errors import MetralError

    with pytest.raises(MetralError, match="nothing is being served") as nothing:
        resolve(None, None)
    assert nothing.value.exit_code == ExitCode.FAILED  # Docker answered: nothing serves (docs/exit-codes.md)
    served.append(("qwen3-8b", "http://127.0.0.1:8888"))
    with pytest.raises(MetralError, match="demo-cpu is not being served \\(served now: qwen3-8b\\)") as other:
        resolve("demo-cpu", None)
    assert other.value.exit_code == ExitCode.FAILED
    with pytest.raises(MetralError, match="no recipe named 'gemma'") as unknown:
        resolve("gemma", None)  # no recipe at all: as `run gemma` says it
    assert unknown.value.exit_code == ExitCode.USAGE
    served.append(("gemma", "http://127.0.0.1:8889"))
    with pytest.raises(MetralError, match="2 models are served") as two:
        resolve(None, None)
    assert two.value.exit_code == ExitCode.USAGE
    assert resolve("gemma", None).url == "http://127.0.0.1:8889"


def test_one_word_is_a_recipe_only_when_it_names_one(served: list[tuple[str, str]]) -> None:
    from metralectl.cli.chat_cmd import _split_words

    served.append(("my-model", "http://127.0.0.1:8888"))
    assert _split_words(["my-model"], None) == ("my-model", None)  # served: the recipe, then a conversation
    assert _split_words(["hello"], None) == (None, "hello")
    # a catalog recipe that is not served is still the recipe (resolve then says it is not served), never a prompt
    assert _split_words(["gemma-4-26b-a4b"], None) == ("gemma-4-26b-a4b", None)
    assert _split_words(["what is 2+2?"], None) == (None, "what is 2+2?")
    assert _split_words(["my-model", "hi"], None) == ("my-model", "hi")
    assert _split_words(["my-model"], "http://127.0.0.1:1") == (None, "my-model")  # --url: all words are the prompt


def test_ctrl_c_during_a_one_prompt_answer_ends_interrupted(scripted: str) -> None:
    term = Pty("--url", scripted, "slow")
    term.expect("tok1 ")
    term.send("\x03")
    assert term.exit_code() == ExitCode.INTERRUPTED
    assert "metralectl: interrupted: the answer was stopped" in term.seen and "Traceback" not in term.seen
