"""`export compose` for real: Debian's docker-compose brings the recipe's container up on the local daemon (the
engine double as its image, tests/docker_image), the engine serves /health, and `docker-compose down` leaves
nothing behind (no container, no network of the project)."""

from __future__ import annotations

import shutil
import subprocess
import time

import httpx
import pytest
import yaml

pytestmark = pytest.mark.docker


def _compose(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker-compose", *args], capture_output=True, text=True, timeout=timeout)


def _left(project: str) -> list[str]:
    label = f"label=com.docker.compose.project={project}"
    names = []
    for kind in (["ps", "-a"], ["network", "ls"], ["volume", "ls"]):
        out = subprocess.run(["docker", *kind, "-q", "--filter", label], capture_output=True, text=True)
        names += out.stdout.split()
    return names


def test_export_compose_serves_and_down_leaves_nothing(box, tmp_path) -> None:  # type: ignore[no-untyped-def]
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is missing (.ci/run installs Debian's docker-compose)")
    box.weights_complete()
    port = box.own_port()
    name = box.recipe("compose", port=port)
    file = tmp_path / "compose.yaml"
    box.cli("export", "compose", name, "-o", str(file), check=True)
    service = next(iter(yaml.safe_load(file.read_text())["services"].values()))
    printed = __import__("json").loads(box.cli("run", name, "--print", "--json", check=True).stdout)
    assert service["command"] == printed["command"] and service["image"] == printed["image"]
    project = box.prefix
    up = _compose("-f", str(file), "-p", project, "up", "-d")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        deadline, status = time.monotonic() + 90, None
        while time.monotonic() < deadline:
            try:
                status = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code
            except httpx.HTTPError:
                status = None
            if status == 200:
                break
            time.sleep(0.5)
        assert status == 200, _compose("-f", str(file), "-p", project, "logs").stdout[-3000:]
        # the labels `ps` reads are on the container compose made
        ps = box.cli("ps", "--json")
        assert name in ps.stdout, ps.stdout + ps.stderr
    finally:
        down = _compose("-f", str(file), "-p", project, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert _left(project) == []
    assert box.containers() == []
