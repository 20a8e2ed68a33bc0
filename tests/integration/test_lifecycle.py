"""run / ps / logs / stop on a real Docker daemon, against the engine test double in real containers."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time

import httpx
import pytest

from metralectl.errors import ExitCode

from tests.integration.conftest import Box

pytestmark = [pytest.mark.docker, pytest.mark.integration]


def test_run_ready_curl_ps_stop(box: Box) -> None:
    name = box.recipe("ok")
    box.weights_complete()
    out = box.cli("run", name, check=True)
    assert "endpoint  http://127.0.0.1:" in out.stdout and "curl -s" in out.stdout
    assert "▸ loading" in out.stderr and "✔ ready in" in out.stderr
    url = out.stdout.split("endpoint  ")[1].split()[0]
    reply = httpx.post(f"{url}/chat/completions", json={"model": "x", "messages": [{"role": "user", "content": "hi"}],
                                                         "max_tokens": 5}, timeout=10)
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
    ps = json.loads(box.cli("ps", "--json", check=True).stdout)
    [serving] = [s for s in ps["serving"] if s["recipe"] == name]
    assert serving["health"] == "ok" and serving["state"] == "running" and serving["image_revision"].startswith("test-double-")
    inspect = json.loads(subprocess.run(["docker", "inspect", serving["name"]], capture_output=True, text=True).stdout)[0]
    labels = inspect["Config"]["Labels"]
    assert labels["ai.metrale.metralectl.recipe"] == name and labels["ai.metrale.metralectl.run-id"]
    assert f"{labels['ai.metrale.metralectl.endpoint']}/v1" == url  # what ps, swap, bench and top read back
    assert inspect["HostConfig"]["NetworkMode"] == "host" and inspect["HostConfig"]["IpcMode"] == "host"
    assert any(m["Destination"] == "/root/.cache/huggingface" for m in inspect["Mounts"])
    stopped = box.cli("stop", name, check=True)
    assert "stopped" in stopped.stdout and "removed: yes" in stopped.stdout
    assert box.containers() == []


def test_run_refuses_missing_weights_with_the_pull_command(box: Box) -> None:
    name = box.recipe("noweights")
    out = box.cli("run", name, "--no-pull")
    assert out.returncode == 1 and "weights incomplete" in out.stderr and f"metralectl pull {name}" in out.stderr
    assert box.containers() == []


def test_run_downloads_missing_weights_then_serves(box: Box) -> None:
    """No weights in the cache: run stages them from the Hub (a local stand-in) with verification first."""
    from tests.fakehub.server import FakeHub, FakeRepo

    repo = FakeRepo.flagship()
    with FakeHub([repo]) as hub:
        box.env.update({"HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_XET": "1"})
        name = box.recipe("pulls")
        out = box.cli("run", name, check=True)
    assert "endpoint  http://127.0.0.1:" in out.stdout
    listed = {r["name"]: r for r in json.loads(box.cli("list", "--json", check=True).stdout)["recipes"]}
    assert listed[name]["weights"] == "complete"


@pytest.mark.parametrize("image,cause,extra_args", [
    ("exit-at-start", "exited", []),
    ("exit-137", "out-of-memory", []),
    ("loaded-zero", "empty-cache", []),
    ("oom", "out-of-memory", []),
    ("stall", "stalled", ["--stall-timeout", "2"]),
    ("never-ready", "timeout", ["--boot-timeout", "4"]),
])
def test_failed_starts_are_classified_logged_and_removed(box: Box, image: str, cause: str, extra_args: list[str]) -> None:
    name = box.recipe(image, image=image)
    box.weights_complete()
    started = time.monotonic()
    out = box.cli("run", name, *extra_args, timeout=60)
    assert out.returncode == 1, out.stderr
    assert f"start failed ({cause})" in out.stderr, out.stderr
    assert "hint:" in out.stderr and "Traceback" not in out.stderr
    assert box.containers() == []  # the failed container is gone
    log_file = out.stderr.split("logs kept in ")[1].split(";")[0].split()[0]
    assert open(log_file).read().strip()  # and its logs were kept
    if image in ("exit-at-start", "exit-137"):
        assert time.monotonic() - started < 20  # an exit while starting fails at once, not on a timer


def test_keep_failed_keeps_the_container(box: Box) -> None:
    name = box.recipe("keep", image="exit-at-start")
    box.weights_complete()
    out = box.cli("run", name, "--keep-failed")
    assert out.returncode == 1 and "kept" in out.stderr
    assert len(box.containers()) == 1


def test_gpu_runtime_missing_is_classified(box: Box) -> None:
    name = box.recipe("gpu")
    box.weights_complete()
    out = box.cli("run", name, "--set", "resources.gpus=all")
    assert out.returncode == 1
    assert "gpu-runtime-missing" in out.stderr and "nvidia-ctk" in out.stderr
    assert box.containers() == []


def test_port_in_use_is_refused_before_starting(box: Box) -> None:
    port = box.own_port()  # held beside the listener: the number is ours before, during and after
    with socket.create_server(("127.0.0.1", port)):
        name = box.recipe("port", port=port)
        box.weights_complete()
        out = box.cli("run", name)
    assert out.returncode == 1 and f"port {port} on 127.0.0.1 is already in use" in out.stderr
    assert box.containers() == []


def test_ctrl_c_during_start_leaves_nothing(box: Box) -> None:
    name = box.recipe("ctrlc", image="slow")
    box.weights_complete()
    proc = box.popen("run", name)
    box.wait_for_container()
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert box.containers() == []


def test_logs_follow_returns_when_the_container_exits(box: Box) -> None:
    name = box.recipe("logs")
    box.weights_complete()
    box.cli("run", name, check=True)
    container = box.containers()[0]
    follower = box.popen("logs", "-f", name)
    time.sleep(1.0)
    subprocess.run(["docker", "kill", container], capture_output=True, check=True)
    killed_at = time.monotonic()
    out, _ = follower.communicate(timeout=15)
    assert time.monotonic() - killed_at < 10  # on the exit, not the 15 s backstop (a loaded box is slow to tell)
    assert "Server live and ready at" in out


def test_stop_kills_an_engine_that_ignores_sigterm(box: Box) -> None:
    name = box.recipe("stubborn", image="ignore-sigterm")
    box.weights_complete()
    box.cli("run", name, check=True)
    out = box.cli("stop", name, "--timeout", "2", "--json", check=True)
    [result] = json.loads(out.stdout)
    assert result["killed"] is True and result["removed"] is True
    assert box.containers() == []


def test_second_model_beside_within_the_budget_else_refused_with_the_numbers(box: Box) -> None:
    (box.config / "box.yaml").write_text("budget: 100\n")  # GB; each takes 80 GB × 0.88 (its engine's share)
    first, second = box.recipe("first"), box.recipe("second")
    box.weights_complete()
    box.cli("run", first, check=True)
    out = box.cli("run", second)
    assert out.returncode == 1 and f"{second} needs 70.40 GB, free 29.60 GB of budget 100.00 GB" in out.stderr
    assert f"held by {first} 70.40 GB" in out.stderr and "metralectl swap" in out.stderr, out.stderr
    box.cli("run", second, "--budget", "150", check=True)  # fits beside: started on its own port
    assert sorted(box.containers()) == [f"metralectl-{first}", f"metralectl-{second}"]
    assert box.cli("stop").returncode == 64  # which one?
    replaced = box.cli("run", second, "--replace", check=True)
    assert "endpoint" in replaced.stdout
    assert [n for n in box.containers()] == [f"metralectl-{second}"]


def test_docker_not_running_is_a_distinct_message_without_hanging(box: Box, tmp_path) -> None:
    box.env["DOCKER_HOST"] = f"unix://{tmp_path}/no-such-docker.sock"
    started = time.monotonic()
    out = box.cli("ps", timeout=20)
    assert time.monotonic() - started < 5
    assert out.returncode == ExitCode.UNAVAILABLE and f"nothing listens at DOCKER_HOST=unix://{tmp_path}" in out.stderr
    assert "unset DOCKER_HOST" in out.stderr
    assert "Traceback" not in out.stderr
