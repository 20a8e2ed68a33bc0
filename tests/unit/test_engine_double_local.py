"""Quick checks of the engine TEST DOUBLE (tests/engine_double/metrale_double.py), run directly as a
subprocess on loopback: no Docker. The Docker-image behaviour is in
tests/integration/test_engine_double.py.

These run the double in the book's format (DOUBLE_LOG_FORMAT=book: `Listening on`, HTTP bound early,
the book's /health bodies); today's formats (the double's default) are checked in
test_engine_double_today.py."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.ports import own_port

DOUBLE = Path(__file__).resolve().parents[1] / "engine_double" / "metrale_double.py"
MARKER = "Listening on"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("METRALE_", "DOUBLE_"))}
    env.update({"DOUBLE_READY_DELAY": "0.2", "DOUBLE_TTFT_MS": "5", "DOUBLE_ITL_MS": "1", "DOUBLE_LOG_FORMAT": "book"})
    env.update(extra)
    return env


class Double:
    """The double in a subprocess, its stdout collected line by line by a reader thread."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, port: int | None = None):
        self.port = port or own_port()
        argv = list(args)
        if argv and argv[0] == "serve" and "--port" not in argv:
            argv += ["--port", str(self.port)]
        self.argv = argv
        self.proc = subprocess.Popen([sys.executable, "-u", str(DOUBLE), *argv], env=env or clean_env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.url = f"http://127.0.0.1:{self.port}"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    @property
    def text(self) -> str:
        with self.cond:
            return "\n".join(self.lines)

    def wait_for(self, needle: str, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                if any(needle in ln for ln in self.lines):
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self.reader.is_alive()):
                    return any(needle in ln for ln in self.lines)
                self.cond.wait(min(left, 0.1))

    def wait(self, timeout: float = 10.0) -> int:
        rc = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=5)
        return rc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.wait()


@pytest.fixture
def spawn():
    started: list[Double] = []

    def _spawn(*args: str, **kw) -> Double:
        d = Double(*args, **kw)
        started.append(d)
        return d

    yield _spawn
    for d in started:
        d.stop()


@pytest.fixture
def server(spawn):
    d = spawn("serve", "Org/Model-7B", "--model-name", "served-7b", "--max-batch-size", "2",
              "--enable-prefix-caching", "--speculative", "--num-drafts", "2")
    assert d.wait_for(MARKER), d.text
    return d


def sse_events(resp: httpx.Response) -> list:
    events = []
    for line in resp.iter_lines():
        if not line:
            continue
        assert line.startswith("data: "), line
        data = line[len("data: "):]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


# ------------------------------------------------------------------------------------- basics


def test_version():
    out = subprocess.run([sys.executable, str(DOUBLE), "--version"], capture_output=True, text=True,
                         env=clean_env(), timeout=10, check=False)
    assert out.returncode == 0
    assert out.stdout.strip() == "met 1.0.0-beta-preview (test double)"


def test_docstring_says_test_fixture():
    head = DOUBLE.read_text().split('"""')[1]
    assert "TEST FIXTURE" in head and "DOUBLE_FAULT" in head


def test_startup_log_lines_in_order(server):
    assert server.wait_for("loopback-only")  # printed just after the marker
    lines = server.lines
    idx = {k: next(i for i, ln in enumerate(lines) if ln.startswith(k))
           for k in ("loading Org/Model-7B", "loaded 1234 tensors in ", "captured graph for batch=1",
                     f"Listening on 127.0.0.1:{server.port}")}
    assert idx["loading Org/Model-7B"] < idx["loaded 1234 tensors in "] < idx["captured graph for batch=1"]
    assert idx["captured graph for batch=1"] < idx[f"Listening on 127.0.0.1:{server.port}"]
    assert any("captured graph for batch=2" in ln for ln in lines)
    assert not any("batch=4" in ln for ln in lines)  # --max-batch-size 2
    after = lines[idx[f"Listening on 127.0.0.1:{server.port}"] + 1]
    assert "loopback-only" in after


def test_health_503_until_ready_then_200(spawn):
    # a ready delay far longer than the double's start on a loaded box, so the first answer is the 503 one
    d = spawn("serve", "m", env=clean_env(DOUBLE_FAULT="slow-ready", DOUBLE_READY_DELAY="6.0"))
    body = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            r = httpx.get(d.url + "/health", timeout=1)
        except httpx.TransportError:
            time.sleep(0.02)
            continue
        body = r.json()
        assert r.status_code == 503
        break
    assert body["error"]["type"] == "model_not_loaded"
    assert MARKER not in d.text
    assert httpx.get(d.url + "/health/live").status_code == 200
    assert httpx.post(d.url + "/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": "hi"}]}).status_code == 503
    assert d.wait_for(MARKER, timeout=60)
    assert httpx.get(d.url + "/health").status_code == 200  # the marker implies ready


def test_bind_all_interfaces_warns(spawn):
    d = spawn("serve", "m", "--bind", "0.0.0.0")
    assert d.wait_for(MARKER)
    assert f"Listening on 0.0.0.0:{d.port}" in d.text
    assert d.wait_for("LAN")


def test_models_and_serve_config(server):
    models = httpx.get(server.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["served-7b"]
    cfg = httpx.get(server.url + "/serve-config").json()
    assert cfg["argv"] == server.argv
    assert cfg["args_sha256"] == hashlib.sha256("\0".join(server.argv).encode()).hexdigest()
    assert cfg["binary_sha256"] == hashlib.sha256(DOUBLE.read_bytes()).hexdigest()
    assert cfg["flags"]["enable-prefix-caching"] is True
    assert cfg["flags"]["num-drafts"] == "2"
    hw = httpx.get(server.url + "/hardware").json()
    assert hw["hardware_class"] == "test-double"


def test_unknown_flags_recorded(spawn):
    d = spawn("serve", "m", "--frobnicate", "--level", "3", "--neg", "-1", "--x=y")
    assert d.wait_for(MARKER), d.text
    flags = httpx.get(d.url + "/serve-config").json()["flags"]
    assert flags["frobnicate"] is True and flags["level"] == "3" and flags["neg"] == "-1" and flags["x"] == "y"


# ----------------------------------------------------------------------------------- inference


def test_streaming_chat_reasoning_content_usage(server):
    body = {"model": "anything", "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": 8, "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=10) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    reasoning = [d["reasoning_content"] for d in deltas if "reasoning_content" in d]
    content = [d["content"] for d in deltas if "content" in d]
    assert len(reasoning) == 2 and len(content) == 6
    first_content = next(i for i, d in enumerate(deltas) if "content" in d)
    assert all("reasoning_content" in d for d in deltas[:first_content])
    assert "".join(content).startswith("Paris")
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finish[-1] == "length" and set(finish[:-1]) == {None}
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 8
    assert usage_chunk["usage"]["prompt_tokens"] == 6
    assert all(c["model"] == "served-7b" for c in chunks)


def test_stream_without_usage_and_natural_stop(server):
    body = {"stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    assert all(c["choices"] for c in events[:-1])  # no usage-only chunk
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


def test_non_streaming_chat_and_ignore_eos(server):
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "a b c"}], "max_tokens": 40,
                         "ignore_eos": True})
    j = r.json()
    assert j["usage"]["completion_tokens"] == 40
    assert j["choices"][0]["finish_reason"] == "length"
    assert j["choices"][0]["message"]["reasoning_content"]
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "x"}],
                         "chat_template_kwargs": {"enable_thinking": False}})
    msg = r.json()["choices"][0]["message"]
    assert "reasoning_content" not in msg and msg["content"]


def test_completions_and_tool_calls(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "Once upon", "max_tokens": 3})
    assert r.json()["choices"][0]["text"] == "Paris is the"
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "weather?"}], "tools": tools,
                         "tool_choice": "required"})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_tokenize_unsupported_and_404(server):
    r = httpx.post(server.url + "/tokenize", json={"prompt": "one two  three\nfour"})
    assert r.json()["count"] == 4
    back = httpx.post(server.url + "/detokenize", json={"tokens": r.json()["tokens"]}).json()
    assert back["prompt"] == "one two three four"
    r = httpx.post(server.url + "/v1/embeddings", json={"input": "x"})
    assert r.status_code == 501 and "not supported" in r.json()["error"]["message"]
    assert httpx.get(server.url + "/nope").status_code == 404


def test_metrics_parse_and_track(server):
    parser = pytest.importorskip("prometheus_client.parser")
    text_string_to_metric_families = parser.text_string_to_metric_families

    slow = {"stream": True, "max_tokens": 30, "ignore_eos": True,
            "messages": [{"role": "user", "content": " ".join(["w"] * 40)}]}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=slow, timeout=20) as r:
        assert sse_events(r)[-1] == "[DONE]"
    # a second request with the same prompt hits the prefix cache
    httpx.post(server.url + "/v1/chat/completions", json={**slow, "stream": False})
    text = httpx.get(server.url + "/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams["metrale_requests_active"].samples[0].value == 0
    assert sum(s.value for s in fams["metrale_requests"].samples) == 2
    assert fams["metrale_prompt_tokens"].samples[0].value == 80
    assert fams["metrale_generation_tokens"].samples[0].value == 60
    assert fams["metrale_decoded_tokens"].samples[0].value > 60  # rejected drafts
    ttft = fams["metrale_time_to_first_token_seconds"]
    count = [s for s in ttft.samples if s.name.endswith("_count")]
    assert count[0].labels == {"model": "served-7b"} and count[0].value == 2
    spec = {(s.labels["k"], s.labels["outcome"]): s.value for s in fams["metrale_spec_decode_verify"].samples}
    assert spec[("2", "accepted")] > 0 and spec[("2", "rejected")] > 0
    assert fams["metrale_prefix_cache_hits"].samples[0].value == 1
    assert fams["metrale_prefix_cache_misses"].samples[0].value == 1
    assert fams["metrale_prefix_cache_hit_rate"].samples[0].value == 0.5
    assert "metrale_tool_calls_total 0" in text


def test_requests_active_with_slow_tokens(spawn):
    d = spawn("serve", "m", env=clean_env(DOUBLE_ITL_MS="100"))
    assert d.wait_for(MARKER)
    body = {"stream": True, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", d.url + "/v1/chat/completions", json=body, timeout=10) as r:
        it = r.iter_lines()
        next(it)
        assert "metrale_requests_active 1" in httpx.get(d.url + "/metrics").text
        list(it)
    assert "metrale_requests_active 0" in httpx.get(d.url + "/metrics").text


def test_auth_and_body_limit(spawn):
    d = spawn("serve", "m", "--require-auth", "--auth-token", "sekrit",
              env=clean_env(METRALE_MAX_BODY_BYTES="200"))
    assert d.wait_for(MARKER)
    msg = {"messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(d.url + "/v1/chat/completions", json=msg).status_code == 401
    ok = httpx.post(d.url + "/v1/chat/completions", json=msg, headers={"Authorization": "Bearer sekrit"})
    assert ok.status_code == 200
    big = {"messages": [{"role": "user", "content": "x" * 500}]}
    r = httpx.post(d.url + "/v1/chat/completions", json=big, headers={"Authorization": "Bearer sekrit"})
    assert r.status_code == 413
    assert httpx.get(d.url + "/health").status_code == 200  # GET needs no token


def test_auto_swap(spawn):
    d = spawn("serve", "org/a", "--auto-swap",
              env=clean_env(DOUBLE_KNOWN_MODELS="org/b", DOUBLE_SWAP_DELAY="0.3"))
    assert d.wait_for(MARKER)
    msg = {"messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(d.url + "/v1/chat/completions", json={**msg, "model": "org/unknown"})
    assert r.json()["model"] == "org/a"  # unknown names are served by the current model
    r = httpx.post(d.url + "/v1/chat/completions", json={**msg, "model": "org/b"}, timeout=10)
    assert r.json()["model"] == "org/b"
    assert d.wait_for("swap complete: serving org/b")
    assert httpx.get(d.url + "/v1/models").json()["data"][0]["id"] == "org/b"


# ------------------------------------------------------------------------ signals and failures


def test_sigterm_exits_zero_promptly(server):
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait(timeout=5) == 0
    assert time.monotonic() - t0 < 2
    assert "shutting down" in server.text and "shutdown complete" in server.text


def test_sigterm_during_loading(spawn):
    d = spawn("serve", "m", env=clean_env(DOUBLE_FAULT="stall"))
    assert d.wait_for("loading m")
    d.proc.send_signal(signal.SIGTERM)
    assert d.wait(timeout=5) == 0


def test_ignore_sigterm(spawn):
    d = spawn("serve", "m", env=clean_env(DOUBLE_FAULT="ignore-sigterm"))
    assert d.wait_for(MARKER)
    d.proc.send_signal(signal.SIGTERM)
    assert d.wait_for("ignoring")
    time.sleep(0.3)
    assert d.proc.poll() is None
    d.proc.kill()
    assert d.wait() == -signal.SIGKILL


@pytest.mark.parametrize("fault,rc,needle", [
    ("exit-at-start", 1, "error:"),
    ("exit-137", -signal.SIGKILL, "loading m"),
    ("loaded-zero", 1, "loaded 0 tensors in 0.1s"),
    ("oom", 1, "error: out of memory"),
])
def test_exit_faults(spawn, fault, rc, needle):
    d = spawn("serve", "m", env=clean_env(DOUBLE_FAULT=fault))
    assert d.wait(timeout=10) == rc
    assert needle in d.text
    assert MARKER not in d.text


def test_never_ready_keeps_logging(spawn):
    d = spawn("serve", "m", env=clean_env(DOUBLE_FAULT="never-ready"))
    assert d.wait_for("step 2", timeout=5)
    assert d.proc.poll() is None and MARKER not in d.text
    assert httpx.get(d.url + "/health").status_code == 503


def test_stall_goes_silent(spawn):
    d = spawn("serve", "m", env=clean_env(DOUBLE_FAULT="stall"))
    assert d.wait_for("loading m")
    time.sleep(0.3)
    n = len(d.lines)
    time.sleep(1.0)
    assert len(d.lines) == n and d.proc.poll() is None and MARKER not in d.text


@pytest.mark.parametrize("args,env,needle", [
    (("serve", "m"), {"METRALE_TOTALLY_UNDECLARED": "1"}, "METRALE_TOTALLY_UNDECLARED"),
    (("serve", "m"), {"METRALE_RATE_LIMIT_RPM": "lots"}, "METRALE_RATE_LIMIT_RPM"),
    (("serve", "m", "--enable-prefix-caching", "true"), {}, "unexpected argument 'true'"),
    (("serve", "m", "--speculative=true"), {}, "presence-only"),
    (("serve", "m", "--dflash", "--speculative"), {}, "cannot be used with"),
    (("serve", "m", "--prompt-lookup-decoding"), {}, "requires '--speculative'"),
    (("serve", "m", "--port", "abc"), {}, "--port"),
    (("serve",), {}, "<MODEL>"),
    (("bogus",), {}, "unrecognized subcommand"),
    (("serve", "m"), {"DOUBLE_FAULT": "no-such-fault"}, "unknown DOUBLE_FAULT"),
])
def test_usage_errors_exit_2(spawn, args, env, needle):
    d = spawn(*args, env=clean_env(**env))
    assert d.wait() == 2
    assert needle in d.text


def test_declared_metrale_env_accepted(spawn):
    d = spawn("serve", "m", env=clean_env(METRALE_RATE_LIMIT_RPM="60", METRALE_HOME="/tmp/x"))
    assert d.wait_for(MARKER), d.text
    assert httpx.get(d.url + "/serve-config").json()["env"] == {"METRALE_RATE_LIMIT_RPM": "60",
                                                                "METRALE_HOME": "/tmp/x"}


def test_port_in_use_exits_1(spawn):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        d = spawn("serve", "m", port=s.getsockname()[1])
        assert d.wait() == 1
    assert "failed to bind" in d.text


def _pair_args(master_port: int, rank: int, *extra: str) -> tuple[str, ...]:
    return ("serve", "m", "--rank", str(rank), "--world-size", "2", "--master-addr", "127.0.0.1",
            "--master-port", str(master_port), *extra)


def test_worker_rank_serves_no_http(spawn):
    """A real TCP rendezvous: the head listens on master-addr:master-port, the worker joins it."""
    master = own_port()
    head = spawn(*_pair_args(master, 0))
    worker = spawn(*_pair_args(master, 1))
    assert worker.wait_for("(worker): ready"), worker.text
    assert head.wait_for(MARKER), head.text
    assert f"connecting to master 127.0.0.1:{master}" in worker.text
    assert f"waiting for 1 worker(s) on 127.0.0.1:{master}" in head.text
    assert "all ranks ready" in head.text and "all ranks ready" in worker.text
    assert MARKER not in worker.text
    with pytest.raises(httpx.TransportError):
        httpx.get(worker.url + "/health", timeout=1)
    assert httpx.get(head.url + "/health", timeout=2).status_code == 200
    time.sleep(1.0)  # the rendezvous link stays up while both run
    assert "lost" not in worker.text and "lost" not in head.text
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait() == 0


def test_head_rank_and_rendezvous_timeout(spawn):
    """Nobody joins in time: the head (and a worker with no head to reach) time out, exit 1."""
    fast = clean_env(DOUBLE_RENDEZVOUS_TIMEOUT="1")
    master = own_port()
    head = spawn(*_pair_args(master, 0), env=fast)
    assert head.wait() == 1
    assert "rendezvous timeout" in head.text and MARKER not in head.text
    lonely = spawn(*_pair_args(own_port(), 1), env=fast)
    assert lonely.wait() == 1
    assert "rendezvous timeout" in lonely.text and "port blocked" in lonely.text
    bad = spawn("serve", "m", "--rank", "1", "--world-size", "2",
                env=clean_env(DOUBLE_FAULT="rendezvous-timeout"))
    assert bad.wait() == 1
    assert "rendezvous timeout" in bad.text


def test_rendezvous_flag_mismatch_kills_the_worker_and_the_head_keeps_waiting(spawn):
    master = own_port()
    head = spawn(*_pair_args(master, 0, "--speculative", "--num-drafts", "1", "--mtp-quantization", "nvfp4"))
    assert head.wait_for("waiting for 1 worker(s)")
    odd = spawn(*_pair_args(master, 1, "--speculative", "--num-drafts", "3", "--mtp-quantization", "nvfp4"))
    assert odd.wait() == 1
    assert "SSM intermediate-buffer error" in odd.text
    assert head.wait_for("refusing rank 1") and "--num-drafts 3" in head.text
    assert head.proc.poll() is None and MARKER not in head.text
    # the same mismatch reported through the knob (an engine build whose defaults differ)
    knob = spawn(*_pair_args(master, 1, "--speculative", "--num-drafts", "1", "--mtp-quantization", "nvfp4"),
                 env=clean_env(DOUBLE_RANK_OVERRIDE="num-drafts=2"))
    assert knob.wait() == 1 and "SSM intermediate-buffer error" in knob.text
    good = spawn(*_pair_args(master, 1, "--speculative", "--num-drafts", "1", "--mtp-quantization", "nvfp4"))
    assert head.wait_for(MARKER), head.text
    assert good.wait_for("(worker): ready")


def test_rendezvous_ifname_mismatch_is_stuck_at_all_ranks_ready(spawn):
    master = own_port()
    head = spawn(*_pair_args(master, 0), env=clean_env(NCCL_SOCKET_IFNAME="enp1s0f0np0"))
    worker = spawn(*_pair_args(master, 1), env=clean_env(NCCL_SOCKET_IFNAME="enp1s0f1np1"))
    assert head.wait_for("all ranks ready") and worker.wait_for("all ranks ready")
    time.sleep(1.5)
    assert MARKER not in head.text and "(worker): ready" not in worker.text
    assert head.proc.poll() is None and worker.proc.poll() is None
    assert httpx.get(head.url + "/health", timeout=2).status_code == 503


def test_lost_worker_makes_requests_hang_while_health_is_200(spawn):
    master = own_port()
    head = spawn(*_pair_args(master, 0))
    worker = spawn(*_pair_args(master, 1))
    assert head.wait_for(MARKER), head.text
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    assert httpx.post(head.url + "/v1/chat/completions", json=body, timeout=5).status_code == 200
    worker.proc.kill()
    worker.wait()
    assert head.wait_for("lost rank 1"), head.text
    assert httpx.get(head.url + "/health", timeout=2).status_code == 200
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(head.url + "/v1/chat/completions", json=body, timeout=1.5)


def test_master_addr_must_be_the_heads_own(spawn):
    head = spawn("serve", "m", "--rank", "0", "--world-size", "2", "--master-addr", "203.0.113.7",
                 "--master-port", str(own_port()))
    assert head.wait() == 1
    assert "cannot listen for the rendezvous on 203.0.113.7" in head.text
