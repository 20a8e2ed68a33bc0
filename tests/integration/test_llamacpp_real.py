"""llama.cpp's real `llama-server` in a container: readiness, streaming, metrics, flags, and `metralectl bench`.

Nothing here is a double. The image `metralectl-test/llama-server:<version>` holds the binary built from
llama.cpp's source (scripts/build-llama-server.sh, packaged by tests/real_llamacpp/image.sh); the model is a
tiny random-weight Llama GGUF (tests/real_llamacpp/build_tiny_gguf.py) in a Hugging Face cache layout,
mounted read-only and found with `-hf ORG/NAME:Q8_0 --offline`, as a user's cache would be. The container is
started with plain `docker run` (metralectl's engine adapter for llama.cpp comes later); these tests pin
what that adapter will rely on.

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

from tests.integration.conftest import free_port

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
            # the server answers: give it the CPU back (it started throttled so the loading phase is observable)
            _docker("update", "--cpus", "0", srv.name)
            lifted = True
        if seen.startswith("200 "):
            return
        state = _docker("inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", srv.name).stdout.split()
        if state and state[0] != "true":
            raise AssertionError(f"llama-server exited ({state}) while loading:\n{srv.logs()}")
        time.sleep(0.02)
    raise AssertionError(f"llama-server not ready after {timeout} s; /health said {srv.startup}\n{srv.logs()}")


@pytest.fixture(scope="module")
def server(llama_image: str, hf_cache: tuple[Path, dict[str, Any]]) -> Iterator[Server]:
    cache, model = hf_cache
    srv = Server(name=f"metralectl-test-llama-{uuid.uuid4().hex[:8]}", port=free_port(), model=model)
    # Started with 2 % of a CPU: loading the tiny model then takes long enough to see the server answer
    # /health before the model is in (lifted as soon as it answers). Published on loopback only.
    started = _docker("run", "-d", "--name", srv.name, "--cpus", "0.02",
                      "-p", f"127.0.0.1:{srv.port}:{srv.port}",
                      "-v", f"{cache}:/hf-cache:ro", "-e", "HF_HUB_CACHE=/hf-cache",
                      llama_image, "-hf", model["hf_arg"], "--offline", "--metrics",
                      "--host", "0.0.0.0", "--port", str(srv.port), "-c", "4096", "-np", "2",
                      "--alias", "tiny-llama")
    assert started.returncode == 0, started.stderr
    try:
        _watch_startup(srv)
        yield srv
    finally:
        _docker("rm", "-f", srv.name)


def test_help_lists_every_flag_the_adapter_declares(llama_image: str) -> None:
    out = _docker("run", "--rm", llama_image, "--help", timeout=120)
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


def test_metrics_exposes_llamacpp_series(server: Server) -> None:
    before = _metrics(server)
    assert before and all(name.startswith("llamacpp:") for name in before), sorted(before)
    missing = [s for s in METRIC_SERIES if s not in before]
    assert not missing, f"/metrics lacks {missing}; it has {sorted(before)}"
    _stream_chat(server, max_tokens=10)
    after = _metrics(server)
    # the counter follows the server's own generation: +10 tokens for a 10-token answer
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == 10


def test_bench_decode_counts_every_request_with_the_servers_usage(server: Server) -> None:
    from metralectl.bench.dialect import PROBE_TOKENS

    before = _metrics(server)
    out = subprocess.run([sys.executable, "-m", "metralectl", "bench", "run", "decode", "--url", server.url,
                          "--format", "json"], capture_output=True, text=True, cwd=REPO, env=dict(os.environ),
                         timeout=600)
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    assert record["status"] == "completed" and "✘" not in out.stderr, out.stderr
    [run_dir] = Path(os.environ["METRALE_HOME"]).glob(f"runs/decode/{record['run_id']}")
    lines = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines() if line.strip()]
    measured = [r for r in lines if r["phase"] == "measure"]
    stage = record["stages"][0]["summary"]
    assert measured and len(measured) == stage["requests"] == stage["ok"] and stage["errors"] == 0
    assert all(r["ok"] for r in measured), [r["error"] for r in measured if not r["ok"]][:3]
    # tokens as the server counted them (its usage), never guessed from stream events ...
    assert all(r["count_method"] in {"usage", "continuous-usage"} for r in lines), {r["count_method"] for r in lines}
    # ... and equal to what it was asked for (llama.cpp honours ignore_eos; the model never says EOS anyway)
    assert all(r["output_tokens"] == r["asked_tokens"] for r in measured), [
        (r["output_tokens"], r["asked_tokens"]) for r in measured]
    # llama.cpp refuses no field of the full dialect (it ignores what it does not know): one probe, nothing dropped
    assert record["dialect"]["source"] == "probe" and record["dialect"]["refused"] == [], record["dialect"]
    # the server's own counter agrees with the record: every request on record plus the one probe request
    after = _metrics(server)
    predicted = after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"]
    assert predicted == sum(r["output_tokens"] for r in lines if r["ok"]) + PROBE_TOKENS, (
        predicted, [(r["phase"], r["output_tokens"]) for r in lines])
    assert record["stages"][0]["model"] == "tiny-llama"
