"""llama.cpp's real `llama-server` in a container: readiness, streaming, metrics, flags, and `metralectl bench`.

Nothing here is a double. The image `metralectl-test/llama-server:<version>` holds the binary built from
llama.cpp's source (scripts/build-llama-server.sh, packaged by tests/real_llamacpp/image.sh); the model is a
tiny random-weight Llama GGUF (tests/real_llamacpp/build_tiny_gguf.py) in a Hugging Face cache layout,
mounted read-only and found with `-hf ORG/NAME:Q8_0 --offline`, as a user's cache would be. The container is
started with plain `docker run`; these tests pin the server facts
engine/llama-cpp.yaml relies on (test_llamacpp_lifecycle.py drives the same image through metralectl).

Skips with the reason when the image is absent and its binary is not built — except under CI (CI set),
where .ci/run builds it, so a missing image fails instead of passing as "skipped".
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.ports import HeldPort, PortTaken, port_in_use, start_retrying

pytestmark = [pytest.mark.docker, pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "scripts" / "build-llama-server.sh"
IMAGE_SH = REPO / "tests" / "real_llamacpp" / "image.sh"
# The flags the llama.cpp engine adapter will declare, each checked against the binary's --help below.
DECLARED_FLAGS = ["-m", "--model", "-hf", "--hf-repo", "--host", "--port", "--metrics", "-c", "--ctx-size",
                  "-np", "--parallel", "-ngl", "--n-gpu-layers", "--offline", "-a", "--alias", "--api-key"]
# Series of /metrics (with --metrics) that the adapter may read; all carry the `llamacpp:` prefix.
METRIC_SERIES = ["llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:requests_processing",
                 "llamacpp:requests_deferred", "llamacpp:n_decode_total"]


def _fail_or_skip(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}")
    pytest.skip(reason)


def _docker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def llama_image(docker_daemon: None) -> str:
    """The image tag; packaged here (seconds) when only the binary is cached, never built here (minutes)."""
    version = subprocess.run(["bash", str(BUILD), "--print-version"], capture_output=True, text=True,
                             check=True).stdout.strip()
    image = f"metralectl-test/llama-server:{version}"
    if _docker("image", "inspect", image).returncode != 0:
        packed = subprocess.run(["bash", str(IMAGE_SH), "--no-build", "--quiet"], capture_output=True, text=True,
                                timeout=300)
        if packed.returncode != 0:
            _fail_or_skip(f"no image {image} and no built llama-server to package: run "
                          f"`bash tests/real_llamacpp/image.sh` (builds llama.cpp once, ~10 min). "
                          f"{packed.stderr.strip()[-300:]}")
    return image


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    try:
        import gguf  # noqa: F401  (the writer's dependency)
    except ImportError:
        _fail_or_skip("the `gguf` package is missing (scripts/bootstrap.sh installs tests/realengines/requirements.txt)")
    sys.path.insert(0, str(REPO / "tests" / "real_llamacpp"))
    import build_tiny_gguf

    cache = tmp_path_factory.mktemp("llama-hf") / "hub"
    return cache, build_tiny_gguf.install(cache)


@dataclass
class Server:
    name: str
    port: int
    model: dict[str, Any]
    # what /health said while the server came up, in order: "refused", "503 <body>", "200 <body>"
    startup: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        out = _docker("logs", self.name)
        return (out.stdout + out.stderr)[-4000:]


def _watch_startup(srv: Server, timeout: float = 180) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    lifted = False
    while time.monotonic() < deadline:
        try:
            resp = httpx.get(srv.url + "/health", timeout=5)
            seen = f"{resp.status_code} {resp.text.strip()}"
        except httpx.TransportError:
            seen = "refused"
        if not srv.startup or srv.startup[-1] != seen:
            srv.startup.append(seen)
        if not lifted and seen != "refused":
            # the server answers: give it the CPU back (it started throttled so the loading phase is observable;
            # `--cpus 0` would leave the limit as it is)
            cpus = os.cpu_count() or 1
            lift = _docker("update", "--cpus", str(cpus), srv.name)
            assert lift.returncode == 0, lift.stderr
            lifted = True
        if seen.startswith("200 "):
            return
        state = _docker("inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", srv.name).stdout.split()
        if state and state[0] != "true":
            raise AssertionError(f"llama-server exited ({state}) while loading:\n{srv.logs()}")
        time.sleep(0.02)
    raise AssertionError(f"llama-server not ready after {timeout} s; /health said {srv.startup}\n{srv.logs()}")


def _run_server(image: str, cache: Path, model: dict[str, Any], port: int, cpus: str = "0.02") -> Server:
    """`docker run -d` of llama-server on `port`. Host networking, as metralectl launches engines
    (core/render.py), so the server listens on loopback only."""
    srv = Server(name=f"metralectl-test-llama-{uuid.uuid4().hex[:8]}", port=port, model=model)
    started = _docker("run", "-d", "--name", srv.name, "--network", "host", "--cpus", cpus,
                      "-v", f"{cache}:/hf-cache:ro", "-e", "HF_HUB_CACHE=/hf-cache",
                      image, "-hf", model["hf_arg"], "--offline", "--metrics",
                      "--host", "127.0.0.1", "--port", str(srv.port), "-c", "4096", "-np", "2",
                      "--alias", "tiny-llama")
    assert started.returncode == 0, started.stderr
    return srv


@pytest.fixture(scope="module")
def server(llama_image: str, hf_cache: tuple[Path, dict[str, Any]]) -> Iterator[Server]:
    cache, model = hf_cache

    def start(port: int) -> Server:
        """Started with 2 % of a CPU: loading the tiny model then takes long enough to see the server answer
        /health before the model is in (lifted as soon as it answers). llama-server binds the port itself: a
        start that lost it to another program is tried again on another."""
        srv = _run_server(llama_image, cache, model, port)
        try:
            _watch_startup(srv)
        except BaseException:
            said = srv.logs()
            _docker("rm", "-f", srv.name)
            if port_in_use(said, "llama-cpp"):
                raise PortTaken(said) from None
            raise
        return srv

    srv = start_retrying(start)
    try:
        yield srv
    finally:
        _docker("rm", "-f", srv.name)


def test_llama_server_listens_beside_a_held_port(llama_image: str, hf_cache: tuple[Path, dict[str, Any]]) -> None:
    """It sets SO_REUSEADDR, as most servers do: a test may hold its port (tests/ports.py) while llama-server
    comes and goes on it (test_llamacpp_lifecycle.py swaps on one held port)."""
    cache, model = hf_cache
    with HeldPort() as held:
        srv = _run_server(llama_image, cache, model, held.port, cpus=str(os.cpu_count() or 1))
        try:
            _watch_startup(srv)
            assert srv.startup[-1].startswith("200 "), srv.logs()
        finally:
            _docker("rm", "-f", srv.name)


def test_help_lists_every_flag_the_adapter_declares(llama_image: str) -> None:
    out = _docker("run", "--rm", "--network", "none", llama_image, "--help", timeout=120)
    assert out.returncode == 0, out.stderr
    listed = set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", out.stdout + out.stderr))
    missing = [flag for flag in DECLARED_FLAGS if flag not in listed]
    assert not missing, f"llama-server --help lacks {missing}"


def test_health_says_loading_model_until_the_model_is_in_then_ok(server: Server) -> None:
    states = server.startup
    assert states[-1] == '200 {"status":"ok"}', states
    before = states[:-1]
    # HTTP is up before the model: while it loads, /health is 503 with llama.cpp's error object
    loading = [s for s in before if s.startswith("503 ")]
    assert loading, f"never saw the loading phase (the server started throttled): {states}"
    for seen in before:
        assert seen == "refused" or seen.startswith("503 "), states
    for seen in loading:
        body = json.loads(seen[4:])
        assert body["error"]["message"] == "Loading model" and body["error"]["code"] == 503, seen
    # once ready it stays ready
    import httpx
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def _stream_chat(server: Server, **extra: Any) -> tuple[list[dict[str, Any]], bool]:
    import httpx

    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 24, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, **extra}
    chunks: list[dict[str, Any]] = []
    done = False
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            if line[6:].strip() == "[DONE]":
                done = True
            else:
                chunks.append(json.loads(line[6:]))
    return chunks, done


def test_chat_completions_streams_tokens_then_usage(server: Server) -> None:
    chunks, done = _stream_chat(server)
    assert done, "the stream ends with data: [DONE]"
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks if c.get("choices")]
    text = [p for p in pieces if p]
    finish = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert text and all(p.isascii() for p in text), pieces  # the tiny model only emits ASCII word pieces
    assert "length" in finish  # it never emits EOS: runs to max_tokens
    assert usage and usage[-1]["completion_tokens"] == 24 and usage[-1]["prompt_tokens"] > 5, usage
    assert len(text) == 24  # one content chunk per generated token
    assert all(c["model"] == "tiny-llama" for c in chunks), {c["model"] for c in chunks}


def _metrics(server: Server) -> dict[str, float]:
    import httpx

    resp = httpx.get(server.url + "/metrics", timeout=10)
    assert resp.status_code == 200, resp.text
    values = {}
    for line in resp.text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def _settled_metrics(server: Server, timeout: float = 10) -> dict[str, float]:
    """/metrics once no slot is busy: the counters move when a slot is released, just after its last chunk."""
    deadline = time.monotonic() + timeout
    while True:
        values = _metrics(server)
        if values.get("llamacpp:requests_processing") == 0 or time.monotonic() > deadline:
            return values
        time.sleep(0.05)


def test_metrics_exposes_llamacpp_series(server: Server) -> None:
    before = _settled_metrics(server)
    assert before and all(name.startswith("llamacpp:") for name in before), sorted(before)
    missing = [s for s in METRIC_SERIES if s not in before]
    assert not missing, f"/metrics lacks {missing}; it has {sorted(before)}"
    _stream_chat(server, max_tokens=10)
    after = _settled_metrics(server)
    # the counter follows the server's own generation: +10 tokens for a 10-token answer
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == 10


def _raw_stream_requests(server: Server, count: int) -> list[str]:
    """Send `count` streamed chat requests back to back over one kept-alive connection (a new one only when
    the server closed it); returns per request "complete", or "closed" when the connection ended before any
    response byte. Also checks that no response announced the close."""
    import socket

    body = json.dumps({"model": "tiny-llama", "messages": [{"role": "user", "content": "Hello there"}],
                       "max_tokens": 4, "temperature": 0, "stream": True}).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    outcomes = []
    conn = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    try:
        for _ in range(count):
            conn.sendall(request)
            buf = b""
            while not buf.endswith(b"\r\n0\r\n\r\n"):
                data = conn.recv(65536)
                if not data:
                    break
                buf += data
            if buf.endswith(b"\r\n0\r\n\r\n"):
                head = buf.split(b"\r\n\r\n", 1)[0].lower()
                assert b"connection: close" not in head and b"transfer-encoding: chunked" in head, head
                outcomes.append("complete")
            else:
                assert buf == b"", buf[:200]  # nothing at all, not half a response
                outcomes.append("closed")
                conn.close()
                conn = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    finally:
        conn.close()
    return outcomes


def test_server_closes_some_kept_alive_connections_after_a_streamed_response(server: Server) -> None:
    """A fact for every client of llama-server (the benchmark's transport, the engine adapter's probes):
    after a streamed response it often closes the kept-alive connection without `Connection: close`
    (its content provider ends with `sink.done()` and then returns false, which cpp-httplib treats as a
    cancelled write). The next request sent on that connection gets no response at all. Seen here on
    about a third of back-to-back streamed requests; never on non-streamed ones."""
    outcomes = _raw_stream_requests(server, 30)
    assert "complete" in outcomes and "closed" in outcomes, outcomes


def test_bench_decode_counts_every_request_with_the_servers_usage(server: Server) -> None:
    from metralectl.bench.dialect import PROBE_TOKENS

    before = _settled_metrics(server)
    # client_bound=warn: the tiny model streams a token every ~0.3 ms from the same two cores the client runs
    # on, so the client-bound guard (rightly) flags the stamps; timing accuracy is not what this test checks
    out = subprocess.run([sys.executable, "-m", "metralectl", "bench", "run", "decode", "--url", server.url,
                          "-p", "client_bound=warn", "--format", "json"], capture_output=True, text=True, cwd=REPO,
                         env=dict(os.environ), timeout=600)
    record = json.loads(out.stdout) if out.stdout.strip() else {}
    assert record, out.stderr
    [run_dir] = Path(os.environ["METRALE_HOME"]).glob(f"runs/decode/{record['run_id']}")
    lines = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines() if line.strip()]
    measured = [r for r in lines if r["phase"] == "measure"]
    stage = record["stages"][0]["summary"]
    assert measured and len(measured) == stage["requests"] == 10, stage
    # llama.cpp refuses no field of the full dialect (it ignores what it does not know): one probe, nothing dropped
    assert record["dialect"]["source"] == "probe" and record["dialect"]["refused"] == [], record["dialect"]
    answered = [r for r in lines if r["ok"]]
    # tokens as the server counted them (its usage), never guessed from stream events ...
    assert answered and all(r["count_method"] in {"usage", "continuous-usage"} for r in answered), answered[:1]
    # ... and equal to what it was asked for (llama.cpp honours ignore_eos; the model never says EOS anyway)
    assert all(r["output_tokens"] == r["asked_tokens"] for r in answered), [
        (r["output_tokens"], r["asked_tokens"]) for r in answered]
    assert record["stages"][0]["model"] == "tiny-llama"
    # every request answered, none lost to a connection llama-server closed after a streamed response (the
    # test above): a request sent on such a connection is sent again on a fresh one, and says so
    lost = [(r["phase"], r["error_kind"], r["error"]) for r in lines if not r["ok"]]
    assert not lost, lost
    retried = [r for r in lines if r["retried"]]
    assert all(r["retry_reason"] and r["retry_ms"] is not None for r in retried), retried[:1]
    assert stage["retried"] == sum(1 for r in measured if r["retried"])
    print(f"llama-server bench decode: {len(lines)} requests, {len(retried)} sent again on a fresh "
          f"connection ({stage['retried']} of {len(measured)} measured), "
          f"{record['stages'][0]['client_health']['idle_closed']} closed idle connection(s) not reused")
    assert out.returncode == 0 and record["status"] == "completed" and "✘" not in out.stderr, out.stderr
    assert len(measured) == stage["ok"] and stage["errors"] == 0
    # the server's own counter agrees with the record: every request on record plus the one probe request
    after = _settled_metrics(server)
    predicted = after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"]
    assert predicted == sum(r["output_tokens"] for r in answered) + PROBE_TOKENS, (
        predicted, [(r["phase"], r["output_tokens"]) for r in lines])


def test_bench_sizes_prompts_with_llamas_tokenize(server: Server) -> None:
    """llama-server's /tokenize reads only `content` (a chat's `messages` give {"tokens": []}); the sizer
    must still reach the asked prompt length, which the server's own usage then confirms. Before the
    seam learnt /apply-template, a 128-token ISL became a ~5000-token prompt and every request a 400."""
    from metralectl.seams.endpoint import EngineClient

    with EngineClient(server.url, timeout=30) as client:
        counted = client.tokenize_messages("tiny-llama", [{"role": "user", "content": "Hello there"}])
    chunks, _ = _stream_chat(server, max_tokens=1, messages=[{"role": "user", "content": "Hello there"}])
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert usage and counted == usage[-1]["prompt_tokens"], (counted, usage)

    out = subprocess.run([sys.executable, "-m", "metralectl", "bench", "run", "concurrency-sweep", "--url",
                          server.url, "-p", "concurrencies=2", "-p", "isls=96", "-p", "osl=8", "-p", "duration_s=2",
                          "-p", "warmup_s=0.5", "-p", "client_bound=warn", "--format", "json"],
                         capture_output=True, text=True, cwd=REPO, env=dict(os.environ), timeout=600)
    record = json.loads(out.stdout) if out.stdout.strip() else {}
    assert record, out.stderr
    [run_dir] = Path(os.environ["METRALE_HOME"]).glob(f"runs/concurrency-sweep/{record['run_id']}")
    lines = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines() if line.strip()]
    measured = [r for r in lines if r["phase"] == "measure"]
    assert measured and all(r["ok"] for r in measured), [(r["error_kind"], r["error"]) for r in measured][:3]
    # sized to 96 (or one below, when the last word is two tokens), and the server counted exactly that
    expected = {r["expected_prompt_tokens"] for r in measured}
    assert len(expected) == 1 and 95 <= expected.pop() <= 96, expected
    assert all(r["prompt_tokens"] == r["expected_prompt_tokens"] for r in measured), [
        (r["prompt_tokens"], r["expected_prompt_tokens"]) for r in measured][:5]
    assert out.returncode == 0 and record["status"] == "completed", out.stderr


def test_chat_gets_an_answer_from_llama_server(server: Server) -> None:
    """`metralectl chat` against the real llama-server: one streamed answer that ends with a finish_reason,
    and --json with the server's own usage."""
    out = subprocess.run([sys.executable, "-m", "metralectl", "chat", "--url", server.url, "--max-tokens", "8",
                          "--temperature", "0", "Hello"], capture_output=True, text=True, cwd=REPO,
                         env=dict(os.environ), timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() and "\x1b" not in out.stdout, (out.stdout, out.stderr)
    out = subprocess.run([sys.executable, "-m", "metralectl", "chat", "--url", server.url, "--max-tokens", "8",
                          "--json", "Hello"], capture_output=True, text=True, cwd=REPO, env=dict(os.environ),
                         timeout=300)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["model"] == "tiny-llama" and doc["finish_reason"] in ("length", "stop"), doc
    assert doc["usage"]["completion_tokens"] <= 8 and doc["message"]["role"] == "assistant", doc
