"""The engine TEST DOUBLE speaking today's engine (its default): tracing-prefixed lines with today's wording,
the ready line `Server live and ready at HOST:PORT running MODEL`, an HTTP port bound only once loaded, today's
/health bodies, a GPU-fault mode, a silent mode, and the double's own record of when it turned ready.
Run directly as a subprocess on loopback (no Docker); the book's format is in test_engine_double_local.py."""

from __future__ import annotations

import re
import signal
import time

import httpx
import pytest

from metralectl.lifecycle.boot import BootLog
from tests.unit.recipe_helpers import catalog
from tests.unit.test_engine_double_local import Double, clean_env

TRACING = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z  INFO \S")
TRACING_MODULE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z  INFO spark::main_modules::serve: \S")
READY = "Server live and ready at"


def today_env(fmt: str = "tracing", **extra: str) -> dict[str, str]:
    return clean_env(DOUBLE_LOG_FORMAT=fmt, **extra)


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


def test_tracing_is_the_default_and_reads_as_today(spawn):
    env = clean_env()
    env.pop("DOUBLE_LOG_FORMAT")
    d = spawn("serve", "Org/Model-7B", "--model-name", "served-7b", env=env)
    assert d.wait_for(READY), d.text
    assert all(TRACING.match(line) for line in d.lines), d.text
    assert f"Server live and ready at 127.0.0.1:{d.port} running served-7b" in d.text
    assert "Listening on" not in d.text and "captured graph" not in d.text
    messages = [line.split("  INFO ", 1)[1] for line in d.lines]
    order = [next(i for i, m in enumerate(messages) if m.startswith(k)) for k in
             ("Metrale Engine starting...", "Selected kernel target: (", "Fast-loaded 1234 weight tensors",
              "KV cache: ", "API reachable only from this machine", READY)]
    assert order == sorted(order)


def test_metralectl_reads_every_phase_of_the_doubles_lines(spawn):
    """The double's lines and metralectl's patterns are checked against each other, both prefixes."""
    for fmt in ("tracing", "tracing-module"):
        d = spawn("serve", "m", env=today_env(fmt))
        assert d.wait_for(READY), d.text
        if fmt == "tracing-module":
            assert all(TRACING_MODULE.match(line) for line in d.lines), d.text
        log = BootLog(catalog().engines["metrale"], "127.0.0.1", d.port)
        phases = [p for p in (log.feed(line) for line in d.lines) if p]
        assert phases == ["kernel-select", "loading", "kv-sizing", "ready"] and log.ready_line_seen


def test_http_binds_late_then_health_is_200_from_its_first_answer(spawn):
    d = spawn("serve", "m", env=today_env(DOUBLE_FAULT="slow-ready", DOUBLE_READY_DELAY="1.0"))
    assert d.wait_for("Fast-loaded")
    with pytest.raises(httpx.ConnectError):  # loading: the port is not bound yet
        httpx.get(d.url + "/health", timeout=1)
    assert d.wait_for(READY)
    answer = httpx.get(d.url + "/health")
    assert answer.status_code == 200 and answer.json() == {"status": "ready", "model": "m"}
    assert httpx.get(d.url + "/health/live").text == "ok"


def test_early_bind_answers_todays_loading_body(spawn):
    d = spawn("serve", "m", env=today_env(DOUBLE_HTTP_BIND="early", DOUBLE_FAULT="slow-ready",
                                          DOUBLE_READY_DELAY="1.5"))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(d.url + "/health", timeout=1)
            break
        except httpx.TransportError:
            time.sleep(0.02)
    assert answer.status_code == 503 and answer.json() == {"status": "loading"}
    assert READY not in d.text


def test_ready_at_is_recorded_before_any_200(spawn):
    d = spawn("serve", "m", env=today_env("silent"))
    first_200 = None
    deadline = time.monotonic() + 10
    while first_200 is None and time.monotonic() < deadline:
        try:
            if httpx.get(d.url + "/health", timeout=1).status_code == 200:
                first_200 = time.time()
        except httpx.TransportError:
            time.sleep(0.01)
    state = httpx.get(d.url + "/_double/state").json()
    assert first_200 is not None and state["ready_at"] is not None and state["ready_at"] <= first_200
    assert state["log_format"] == "silent" and state["http_bind"] == "late"
    assert d.lines == []  # silent: not a single boot line, no ready line


def test_gpu_fault_latches_a_faulted_health_and_keeps_running(spawn):
    d = spawn("serve", "m", env=today_env(DOUBLE_FAULT="gpu-fault", DOUBLE_FAULT_REASON="Xid 79: fell off the bus"))
    assert d.wait_for("GPU fault latched"), d.text
    answer = httpx.get(d.url + "/health")
    assert answer.status_code == 503 and answer.json() == {"status": "faulted", "reason": "Xid 79: fell off the bus"}
    assert httpx.get(d.url + "/health/live").status_code == 503
    assert READY not in d.text and d.proc.poll() is None
    assert " ERROR GPU fault latched" in d.text


def test_ansi_colours_on_request(spawn):
    d = spawn("serve", "m", env=today_env(DOUBLE_LOG_ANSI="1"))
    assert d.wait_for(READY)
    assert all(line.startswith("\x1b[2m") and "\x1b[32m INFO\x1b[0m " in line for line in d.lines), d.text


def test_wildcard_bind_prints_loopback_and_warns(spawn):
    d = spawn("serve", "m", "--bind", "0.0.0.0", env=today_env())
    assert d.wait_for(READY)
    assert f"Server live and ready at 127.0.0.1:{d.port} running m" in d.text
    assert f" WARN Metrale Engine is listening on 0.0.0.0:{d.port} — reachable from any host" in d.text


@pytest.mark.parametrize("fault,needle", [
    ("loaded-zero", " ERROR Error: Snapshot '0000000' has no weight files (metadata-only)"),
    ("oom", " ERROR OOM watchdog: 3 consecutive readings below threshold."),
    ("exit-at-start", " ERROR Error: failed to start"),
])
def test_todays_failure_lines(spawn, fault, needle):
    d = spawn("serve", "m", env=today_env(DOUBLE_FAULT=fault))
    assert d.wait(timeout=10) == 1
    assert needle in d.text and READY not in d.text


def test_silent_still_prints_its_failure(spawn):
    d = spawn("serve", "m", env=today_env("silent", DOUBLE_FAULT="loaded-zero"))
    assert d.wait(timeout=10) == 1
    assert len(d.lines) == 1 and "has no weight files" in d.text


def test_sigterm_in_todays_format(spawn):
    d = spawn("serve", "m", env=today_env())
    assert d.wait_for(READY)
    d.proc.send_signal(signal.SIGTERM)
    assert d.wait(timeout=5) == 0
    assert d.lines[-1].endswith(" INFO Shutdown complete")


def test_unknown_log_format_is_a_usage_error(spawn):
    d = spawn("serve", "m", env=today_env("json"))
    assert d.wait() == 2 and "DOUBLE_LOG_FORMAT" in d.text
