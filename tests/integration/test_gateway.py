"""`metralectl gateway` without an engine: the real CLI in a subprocess on a box of the test's own (no Docker).

The wait queue of a model that is starting (a `run R` holding the lifecycle lock, held here by the test itself
as `metralectl run` holds it): over its bound, 503 with Retry-After at once; past its stall deadline, 503 with
Retry-After; once the start ended without the model, 404 listing what is served. The request's caps and errors
in OpenAI's shape; a non-loopback --listen refused without --allow-remote; a taken port refused.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from metralectl.seams import store
from tests.integration.gateway_client import REPO, Gateway, box_env

pytestmark = [pytest.mark.integration]


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    return box_env(tmp_path / "box")


def test_requests_for_a_starting_model_wait_bounded_then_get_503_with_retry_after(env: dict[str, str]) -> None:
    gateway = Gateway(env, "--queue-size", "1", "--queue-timeout", "1.5")
    try:
        assert gateway.first["models"] == [] and gateway.first["starting"] == []
        with store.lifecycle_lock("run proc-x", Path(env["METRALECTL_LOCK_DIR"]) / "metralectl-lifecycle.lock"):
            gateway.wait_line(lambda line: line["starting"] == ["proc-x"])
            first: list[tuple[int, dict[str, str], bytes]] = []
            began = time.monotonic()
            waiter = threading.Thread(target=lambda: first.append(gateway.chat("proc-x")))
            waiter.start()
            deadline = time.monotonic() + 10
            while gateway.metric("metralectl_gateway_queue_depth", model="proc-x") < 1:
                assert time.monotonic() < deadline, "the first request never queued"
                time.sleep(0.05)
            status, headers, body = gateway.chat("proc-x")  # the queue (1) is full: refused at once
            assert status == 503 and headers["retry-after"] == "5", body
            assert json.loads(body)["error"]["code"] == "model_starting"
            waiter.join(timeout=30)
            waited = time.monotonic() - began
            [(status, headers, body)] = first
            assert status == 503 and headers["retry-after"] == "10", body  # no progress for 1.5 s: a stall
            assert "no progress in 1.5 s" in json.loads(body)["error"]["message"]
            assert 1.4 < waited < 10, waited
        gateway.wait_line(lambda line: line["starting"] == [])
        status, _, body = gateway.chat("proc-x")  # the start is over and nothing serves it
        error = json.loads(body)["error"]
        assert status == 404 and error["code"] == "model_not_found" and error["served"] == [], body
        assert gateway.metric("metralectl_gateway_errors_total", model="proc-x", reason="queue-full") == 1
        assert gateway.metric("metralectl_gateway_errors_total", model="proc-x", reason="queue-stalled") == 1
        assert gateway.metric("metralectl_gateway_queue_wait_seconds_count", model="proc-x") == 1
    finally:
        said = gateway.stop()
    assert gateway.proc.returncode == 130 and "Traceback" not in said, said


def test_bad_requests_are_answered_in_openais_shape_and_the_body_is_capped(env: dict[str, str]) -> None:
    gateway = Gateway(env, "--max-body", "1000")
    try:
        status, _, body = gateway.request("POST", "/v1/chat/completions", b"x" * 1001)
        assert status == 413 and "over the gateway's cap of 1000 bytes" in json.loads(body)["error"]["message"]
        status, _, body = gateway.request("POST", "/v1/chat/completions", b"not json")
        assert status == 400 and json.loads(body)["error"]["code"] == "model_missing"
        status, _, body = gateway.request("GET", "/v1/chat/completions")
        assert status == 405, body
        status, _, body = gateway.request("POST", "/v1/nothing", {"model": "m"})
        assert status == 404 and json.loads(body)["error"]["code"] == "unknown_url"
        status, _, body = gateway.request("GET", "/v1/models")
        assert status == 200 and json.loads(body) == {"object": "list", "data": []}
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as raw:  # a head past its cap
            raw.sendall(b"POST /v1/completions HTTP/1.1\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n")
            assert raw.recv(100).startswith(b"HTTP/1.1 431 ")
    finally:
        gateway.stop()


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", "gateway", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=60)


def test_a_non_loopback_address_needs_allow_remote_and_a_taken_port_is_refused(env: dict[str, str]) -> None:
    out = _cli(env, "--listen", "0.0.0.0:8090")
    assert out.returncode == 64 and "0.0.0.0 is not a loopback address" in out.stderr, out.stderr
    assert "--allow-remote" in out.stderr and "Traceback" not in out.stderr
    out = _cli(env, "--listen", "localhost")
    assert out.returncode == 64 and "is not HOST:PORT" in out.stderr, out.stderr
    with socket.socket() as taken:  # listening, without SO_REUSEADDR: nobody binds beside it
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        out = _cli(env, "--listen", f"127.0.0.1:{taken.getsockname()[1]}")
    assert out.returncode == 69 and "the gateway cannot listen on 127.0.0.1:" in out.stderr, out.stderr
    assert out.stdout == ""


def _cpus_of(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("Cpus_allowed_list"))


def test_the_gateway_runs_on_its_own_cpus_from_cpus_or_box_yaml_and_a_wrong_list_is_refused(
        env: dict[str, str]) -> None:
    """`--cpus` (else box.yaml's gateway-cpus): the gateway's process on those CPUs only, said in its listening
    line; a list it cannot take refused before anything listens, with the fix (seams/affinity.py says why)."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("one CPU: the gateway could not leave the engines any")
    for cpus, said in (("two", "--cpus: 'two' is not a CPU or a range"), ("4095", "CPU 4095 is not one this process"),
                       (",".join(map(str, allowed)), "none would be left for engines")):
        out = _cli(env, "--cpus", cpus)
        assert out.returncode == 64 and said in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert out.stdout == ""
    last = str(allowed[-1])
    gateway = Gateway(env, "--cpus", last)
    try:
        assert gateway.first["cpus"] == last and _cpus_of(gateway.proc.pid) == last, gateway.first
        [shown] = json.loads(_ps(env, "--json").stdout)["gateways"]
        assert shown["cpus"] == last and f"; on CPUs {last}" in _ps(env).stderr, shown
    finally:
        gateway.stop()
    (Path(env["METRALECTL_CONFIG_DIR"]) / "box.yaml").write_text(f'gateway-cpus: "{allowed[0]}"\n')
    gateway = Gateway(env)
    try:
        assert gateway.first["cpus"] == str(allowed[0]) and _cpus_of(gateway.proc.pid) == str(allowed[0])
    finally:
        gateway.stop()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # the loop's thread
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_busy_poll_keeps_the_gateways_loop_running_after_a_read_and_lets_it_sleep_after_the_window(
        env: dict[str, str]) -> None:
    """`--busy-poll MS` (gateway/busy.py): after a read its loop runs flat out (its CPU time grows by most of the
    time that passes), and once the window has passed with no read it sleeps again (its CPU time stands still);
    said in its listening line. Bad values refused before anything listens (box.yaml's by line)."""
    for bad in ("nan", "20000", "-1"):
        said = f"--busy-poll: {float(bad):g} is not a number of milliseconds from 0 to 10000"
        out = _cli(env, "--busy-poll", bad)
        assert out.returncode == 64 and said in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert out.stdout == ""
    box_yaml = Path(env["METRALECTL_CONFIG_DIR"]) / "box.yaml"
    box_yaml.write_text("gateway-busy-poll: fast\n")
    out = _cli(env)
    assert out.returncode != 0 and "box.yaml:1" in out.stderr and "gateway-busy-poll" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    box_yaml.write_text("gateway-busy-poll: 1500\n")
    gateway = Gateway(env)
    try:
        assert gateway.first["busy_poll_ms"] == 1500, gateway.first
        [shown] = json.loads(_ps(env, "--json").stdout)["gateways"]
        assert shown["busy_poll_ms"] == 1500 and "; busy-polling 1500 ms after each read" in _ps(env).stderr, shown
        time.sleep(2)  # past the window of its start's reads (none: it only wakes on a read)
        began = _cpu_seconds(gateway.proc.pid)
        time.sleep(0.5)
        assert _cpu_seconds(gateway.proc.pid) - began < 0.2  # idle: asleep, as without --busy-poll
        for _ in range(3):  # again if this test itself was held past the window (a busy box): it cannot tell then
            read_at = time.monotonic()
            assert gateway.request("GET", "/health")[0] == 200  # a read: awake for 1.5 s
            began = _cpu_seconds(gateway.proc.pid)
            time.sleep(0.8)
            spent = _cpu_seconds(gateway.proc.pid) - began
            if time.monotonic() - read_at < 1.4:
                break
        assert spent > 0.2, spent  # flat out (a share of a core on a busy box)
        time.sleep(max(0.0, read_at + 2.0 - time.monotonic()))
        began = _cpu_seconds(gateway.proc.pid)
        time.sleep(0.5)
        assert _cpu_seconds(gateway.proc.pid) - began < 0.2  # past the window: asleep again
    finally:
        gateway.stop()


def _ps(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    # a box whose engines run as host processes (no Docker): `ps` reads their state directory
    (Path(env["METRALE_HOME"]) / "state" / "processes").mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "metralectl", "ps", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=60)


def test_ps_shows_a_running_gateway_and_forgets_it_when_it_stops(env: dict[str, str]) -> None:
    assert json.loads(_ps(env, "--json").stdout)["gateways"] == []
    gateway = Gateway(env)
    try:
        [shown] = json.loads(_ps(env, "--json").stdout)["gateways"]
        assert shown["url"] == f"http://127.0.0.1:{gateway.port}" and shown["pid"] == gateway.proc.pid, shown
        assert shown["answering"] is True and shown["models"] == 0 and shown["keys"] == 0, shown
        out = _ps(env)
        assert f"gateway http://127.0.0.1:{gateway.port} (pid {gateway.proc.pid}): routes 0 names; no API key" \
            in out.stderr, out.stderr
        gateway.proc.send_signal(signal.SIGSTOP)  # alive, not answering: said so, within ps's 0.5 s
        try:
            [shown] = json.loads(_ps(env, "--json").stdout)["gateways"]
            assert shown["answering"] is False, shown
        finally:
            gateway.proc.send_signal(signal.SIGCONT)
    finally:
        gateway.stop()
    assert json.loads(_ps(env, "--json").stdout)["gateways"] == []
    assert list((Path(env["METRALE_HOME"]) / "state" / "gateways").glob("*.json")) == []  # removed as it stopped


def test_ps_on_a_box_without_docker_or_host_processes_still_names_the_gateway(env: dict[str, str]) -> None:
    """No engine can be listed (Docker unreachable, no host process ever ran): exit 69 with Docker's error, as
    before; the gateway that runs here was not shown at all."""
    gateway = Gateway(env)
    try:
        out = subprocess.run([sys.executable, "-m", "metralectl", "ps"], capture_output=True, text=True, env=env,
                             cwd=REPO, timeout=60)
    finally:
        gateway.stop()
    assert out.returncode == 69 and "nothing listens at DOCKER_HOST" in out.stderr, out.stderr
    assert f"gateway http://127.0.0.1:{gateway.port} (pid {gateway.proc.pid}): routes 0 names" in out.stderr, out.stderr
    assert out.stdout == ""


def test_a_gateway_killed_leaves_a_record_nobody_shows_and_the_next_removes_it(env: dict[str, str]) -> None:
    gateway = Gateway(env)
    records = Path(env["METRALE_HOME"]) / "state" / "gateways"
    killed = records / f"{gateway.proc.pid}.json"
    assert killed.exists()
    gateway.proc.kill()
    gateway.proc.wait()
    gateway.stop()
    assert killed.exists() and json.loads(_ps(env, "--json").stdout)["gateways"] == []
    (records / "1.json").write_text('{"schema": 1, "url": "http://127.0.0.1:1", "keys": 0, "identity": {"pid": 1}}')
    (records / "2.json").write_text("x" * 5_000_000)  # hostile leftovers: ignored, never a crash
    out = _ps(env, "--json")
    assert out.returncode in (0, 1) and json.loads(out.stdout)["gateways"] == [] and "Traceback" not in out.stderr
    second = Gateway(env)
    try:
        assert not killed.exists() and [p.name for p in records.glob("*.json")] == [f"{second.proc.pid}.json"]
    finally:
        second.stop()


def test_the_gateway_lifts_its_descriptor_limit_and_closes_idle_clients_after_client_timeout(
        env: dict[str, str]) -> None:
    """A soft limit of 256 (inherited) is lifted to the hard one, as the agent does; a client that connects and
    sends nothing is closed after --client-timeout, and the gateway serves on."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
    try:
        gateway = Gateway(env, "--client-timeout", "0.3")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        limits = Path(f"/proc/{gateway.proc.pid}/limits").read_text()
        [line] = [line for line in limits.splitlines() if line.startswith("Max open files")]
        wanted = "unlimited" if hard == resource.RLIM_INFINITY else str(min(hard, 1 << 20))
        assert line.split()[3] == wanted, line
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as idle:
            assert idle.recv(1) == b""  # closed by the gateway, nothing said
        status, _, _ = gateway.request("GET", "/health")
        assert status == 200
    finally:
        gateway.stop()
