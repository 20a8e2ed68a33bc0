"""The engine TEST DOUBLE in its locally built Docker image (metralectl-test/engine-double:latest),
run in real containers with host networking. Needs a Docker daemon: CI starts one with
tests/docker_image/start-dockerd.sh; without one every test here is skipped with the reason.

Every container is named ``mdt-<run>-<n>``, labelled ``metralectl-test=engine-double`` and removed by
a finalizer. These run the double in the book's format (DOUBLE_LOG_FORMAT=book) unless a test asks for
today's (the double's default: tracing lines, late HTTP bind, today's /health bodies)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.ports import own_port

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[1]
DOUBLE = ROOT / "engine_double" / "metrale_double.py"
MARKER = "Listening on"
LABEL = {"metralectl-test": "engine-double"}
RUN_ID = uuid.uuid4().hex[:8]


def _load_mounts():
    spec = importlib.util.spec_from_file_location("engine_double_mounts", ROOT / "docker_image" / "mounts.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


mounts = _load_mounts()


@pytest.fixture(scope="module")
def client():
    docker = pytest.importorskip("docker")
    try:
        c = docker.from_env(timeout=30)
        c.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means "no daemon here"
        pytest.skip(f"no Docker daemon reachable ({type(exc).__name__}: {exc}); "
                    "start one with tests/docker_image/start-dockerd.sh")
    yield c
    c.close()


@pytest.fixture(scope="module")
def image(client):
    mounts.build_image()
    return client.images.get(mounts.IMAGE)


class Run:
    """One container of the double, with helpers to read its logs and reach its port."""

    def __init__(self, container, port: int):
        self.c = container
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def logs(self) -> str:
        return self.c.logs().decode(errors="replace")

    def wait_log(self, needle: str, timeout: float = 15.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.logs():
                return True
            self.c.reload()
            if self.c.status == "exited":
                return needle in self.logs()
            time.sleep(0.05)
        return False

    def exit_code(self, timeout: float = 20.0) -> int:
        return int(self.c.wait(timeout=timeout)["StatusCode"])


@pytest.fixture
def start(client, image):
    made = []
    counter = iter(range(1000))

    def _start(*args: str, env: dict | None = None, port: int | None = None, serve: bool = True) -> Run:
        port = port or own_port()
        command = list(args)
        if serve:
            command = ["serve", *command, "--port", str(port)]
        c = client.containers.run(
            mounts.IMAGE, command, detach=True, name=f"mdt-{RUN_ID}-{next(counter)}",
            network_mode="host", labels=LABEL, volumes=mounts.docker_volumes(),
            environment={**mounts.container_env(), "DOUBLE_READY_DELAY": "0.3", "DOUBLE_LOG_FORMAT": "book",
                         **(env or {})})
        made.append(c)
        return Run(c, port)

    yield _start
    for c in made:
        with contextlib.suppress(Exception):  # already gone is fine
            c.remove(force=True)


# ----------------------------------------------------------------------------------------- image


def test_image_labels_platform_entrypoint(client, image):
    sha = hashlib.sha256(DOUBLE.read_bytes()).hexdigest()
    assert image.labels["org.opencontainers.image.revision"] == f"test-double-{sha}"
    version = client.version()
    assert image.attrs["Os"] == version["Os"] and image.attrs["Architecture"] == version["Arch"]
    assert image.attrs["Config"]["Entrypoint"] == ["/usr/local/bin/met"]


def test_build_is_idempotent_and_fast(image):
    t0 = time.monotonic()
    mounts.build_image()
    assert time.monotonic() - t0 < 30  # the same image kept (below), not made again
    import docker

    assert docker.from_env().images.get(mounts.IMAGE).id == image.id


def test_version_in_container(start):
    r = start("--version", serve=False)
    assert r.exit_code() == 0
    assert r.logs().strip() == "met 1.0.0-beta-preview (test double)"


# ----------------------------------------------------------------------------------------- serve


def test_serve_health_stream_metrics_stop(start):
    text_string_to_metric_families = pytest.importorskip(
        "prometheus_client.parser").text_string_to_metric_families

    r = start("Sehyo/Qwen3.5-35B-A3B-NVFP4", "--max-seq-len", "8192", "--kv-cache-dtype", "nvfp4",
              "--speculative", "--mtp-quantization", "nvfp4",
              env={"DOUBLE_FAULT": "slow-ready", "DOUBLE_READY_DELAY": "2"})
    # /health answers 503 model_not_loaded before the marker...
    seen_503 = False
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not seen_503:
        try:
            h = httpx.get(r.url + "/health", timeout=1)
        except httpx.TransportError:
            time.sleep(0.05)
            continue
        assert h.status_code == 503, h.text
        assert h.json()["error"]["type"] == "model_not_loaded"
        seen_503 = True
    assert seen_503 and MARKER not in r.logs()
    # ...then the marker, then 200
    assert r.wait_log(f"Listening on 127.0.0.1:{r.port}"), r.logs()
    assert r.wait_log("loopback-only")  # the line after the marker
    logs = r.logs()
    assert logs.index("loading Sehyo/") < logs.index("loaded 1234 tensors in ") < logs.index(
        "captured graph for batch=1") < logs.index(MARKER)
    assert httpx.get(r.url + "/health").status_code == 200
    assert httpx.get(r.url + "/v1/models").json()["data"][0]["id"] == "Sehyo/Qwen3.5-35B-A3B-NVFP4"

    body = {"model": "x", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 12,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    events = []
    with httpx.stream("POST", r.url + "/v1/chat/completions", json=body, timeout=10) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line:
                assert line.startswith("data: ")
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas)
    assert "".join(d.get("content", "") for d in deltas).startswith("Paris")
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12

    fams = {f.name: f for f in text_string_to_metric_families(httpx.get(r.url + "/metrics").text)}
    for name in ("metrale_requests", "metrale_requests_active", "metrale_time_to_first_token_seconds",
                 "metrale_prompt_tokens", "metrale_generation_tokens", "metrale_decoded_tokens",
                 "metrale_spec_decode_verify", "metrale_tool_calls", "metrale_prefix_cache_hits",
                 "metrale_prefix_cache_misses", "metrale_prefix_cache_hit_rate"):
        assert name in fams, name
    assert fams["metrale_generation_tokens"].samples[0].value == 12
    assert fams["metrale_requests_active"].samples[0].value == 0

    cfg = httpx.get(r.url + "/serve-config").json()
    assert cfg["argv"][:2] == ["serve", "Sehyo/Qwen3.5-35B-A3B-NVFP4"]
    assert cfg["args_sha256"] == hashlib.sha256("\0".join(cfg["argv"]).encode()).hexdigest()
    assert httpx.get(r.url + "/hardware").json()["hardware_class"] == "test-double"

    t0 = time.monotonic()
    r.c.stop(timeout=10)
    assert r.exit_code() == 0  # SIGTERM handled: a SIGKILL at the 10 s timeout would be 137
    assert time.monotonic() - t0 < 9
    assert "shutdown complete" in r.logs()


def test_todays_format_in_a_container(start):
    """The default format in a container (no TTY, so no colour): tracing lines, late bind, today's bodies."""
    r = start("m", "--bind", "0.0.0.0", env={"DOUBLE_LOG_FORMAT": "tracing"})
    assert r.wait_log(f"Server live and ready at 127.0.0.1:{r.port} running m"), r.logs()
    assert "\x1b" not in r.logs() and "Listening on" not in r.logs()
    assert all(line[:4].isdigit() and line[19:26] in ("Z  INFO", "Z  WARN") for line in r.logs().splitlines())
    answer = httpx.get(r.url + "/health")
    assert answer.status_code == 200 and answer.json() == {"status": "ready", "model": "m"}
    state = httpx.get(r.url + "/_double/state").json()
    assert state["http_bind"] == "late" and state["ready_at"] <= time.time()


def test_bind_all_interfaces(start):
    r = start("m", "--bind", "0.0.0.0")
    assert r.wait_log(f"Listening on 0.0.0.0:{r.port}"), r.logs()
    assert r.wait_log("LAN")
    assert httpx.get(r.url + "/health").status_code == 200


# ---------------------------------------------------------------------------------------- faults


@pytest.mark.parametrize("fault,code,needle", [
    ("exit-at-start", 1, "error:"),
    ("exit-137", 137, "loading m"),
    ("loaded-zero", 1, "loaded 0 tensors in 0.1s"),
    ("oom", 1, "error: out of memory"),
])
def test_exit_faults(start, fault, code, needle):
    r = start("m", env={"DOUBLE_FAULT": fault})
    assert r.exit_code() == code, r.logs()
    assert needle in r.logs()
    assert MARKER not in r.logs()


def test_never_ready_and_stall(start):
    never = start("m", env={"DOUBLE_FAULT": "never-ready"})
    stall = start("m", env={"DOUBLE_FAULT": "stall"})
    assert never.wait_log("step 3", timeout=10), never.logs()
    assert stall.wait_log("loading m")
    time.sleep(0.5)
    stall_lines = stall.logs()
    time.sleep(1.0)
    assert stall.logs() == stall_lines  # silent
    for r in (never, stall):
        r.c.reload()
        assert r.c.status == "running"
        assert MARKER not in r.logs()
        assert httpx.get(r.url + "/health", timeout=2).status_code == 503
    t0 = time.monotonic()
    stall.c.stop(timeout=10)  # SIGTERM while loading: prompt, clean exit
    assert stall.exit_code() == 0 and time.monotonic() - t0 < 9  # not the SIGKILL at 10 s (137)


def test_ignore_sigterm_needs_sigkill(start):
    r = start("m", env={"DOUBLE_FAULT": "ignore-sigterm"})
    assert r.wait_log(MARKER)
    r.c.stop(timeout=1)
    assert r.exit_code() == 137
    assert "ignoring" in r.logs()


def test_undeclared_metrale_env_refused(start):
    r = start("m", env={"METRALE_NOT_A_LEVER": "1", "METRALE_RATE_LIMIT_RPM": "60"})
    assert r.exit_code() == 2
    assert "METRALE_NOT_A_LEVER" in r.logs()
    assert MARKER not in r.logs()


def test_worker_rank_in_container(start):
    master = str(own_port())
    rank = ("--world-size", "2", "--master-addr", "127.0.0.1", "--master-port", master)
    head = start("m", "--rank", "0", *rank)
    r = start("m", "--rank", "1", *rank)
    assert r.wait_log("(worker): ready"), r.logs()
    assert head.wait_log(MARKER), head.logs()
    assert MARKER not in r.logs()
    r.c.stop(timeout=5)
    assert r.exit_code() == 0
