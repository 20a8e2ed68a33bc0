"""Integration fixtures: a real Docker daemon, locally built engine-double images, user recipes.

Docker tests skip with a reason when no daemon can be had — except under CI (CI=true), where a
missing daemon is a failure, so a broken setup can never pass as "all skipped".
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ports import HeldPort

REPO = Path(__file__).resolve().parents[2]
START_DOCKERD = REPO / "tests" / "docker_image" / "start-dockerd.sh"
TEST_HARDWARE = "hopper"  # an x86_64 class, like this machine; the recipes request no GPU


def _daemon_answers() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def docker_daemon() -> None:
    if not _daemon_answers() and os.geteuid() == 0:
        subprocess.run(["bash", str(START_DOCKERD)], capture_output=True, timeout=300)
    if not _daemon_answers():
        if os.environ.get("CI"):
            pytest.fail("CI: no Docker daemon answers (tests/docker_image/start-dockerd.sh failed)")
        pytest.skip("no Docker daemon reachable; start one with tests/docker_image/start-dockerd.sh")


@pytest.fixture(scope="session")
def engine_images(docker_daemon: None) -> dict[str, str]:
    """Image tags of the bundled engine double: the normal one and one per failure mode."""
    sys.path.insert(0, str(REPO / "tests" / "docker_image"))
    import bundle

    images = {"ok": bundle.build_bundled()}
    variants = {
        "exit-at-start": {"DOUBLE_FAULT": "exit-at-start"},
        "exit-137": {"DOUBLE_FAULT": "exit-137"},
        "loaded-zero": {"DOUBLE_FAULT": "loaded-zero"},
        "oom": {"DOUBLE_FAULT": "oom"},
        "stall": {"DOUBLE_FAULT": "stall"},
        "never-ready": {"DOUBLE_FAULT": "never-ready"},
        "ignore-sigterm": {"DOUBLE_FAULT": "ignore-sigterm"},
        "slow": {"DOUBLE_READY_DELAY": "30"},
        "slow3": {"DOUBLE_READY_DELAY": "3"},
        # today's engine is the double's default format; these pick the others (docs/development.md)
        "silent3": {"DOUBLE_LOG_FORMAT": "silent", "DOUBLE_READY_DELAY": "3"},
        "early3": {"DOUBLE_HTTP_BIND": "early", "DOUBLE_READY_DELAY": "3"},
        "module-ansi": {"DOUBLE_LOG_FORMAT": "tracing-module", "DOUBLE_LOG_ANSI": "1", "DOUBLE_READY_DELAY": "2"},
        "book": {"DOUBLE_LOG_FORMAT": "book"},
        "gpu-fault": {"DOUBLE_FAULT": "gpu-fault", "DOUBLE_FAULT_REASON": "Xid 79: GPU has fallen off the bus"},
        "oom-after-ready": {"DOUBLE_FAULT": "oom-after-ready"},
    }
    for name, env in variants.items():
        images[name] = bundle.build_variant(bundle.variant_tag(name), env)
    return images


class Box:
    """One test's machine: its own config dir, HF cache, state, and recipes served by the double."""

    def __init__(self, home: Path, images: dict[str, str]) -> None:
        self.home = home
        self.images = images
        self.prefix = f"it{uuid.uuid4().hex[:6]}"
        self.held: list[HeldPort] = []
        self.config = home / "config"
        (self.config / "images").mkdir(parents=True, exist_ok=True)
        (self.config / "recipes").mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "METRALECTL_CONFIG_DIR": str(self.config), "HF_HOME": str(home / "hf"),
                    "METRALE_HOME": str(home / "metrale"), "METRALECTL_CACHE_DIR": str(home / "cache"),
                    "METRALECTL_LOCK_DIR": str(home), "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}
        for name, tag in images.items():
            (self.config / "images" / f"double-{name}.yaml").write_text(
                f"schema: 1\nid: double-{name}\nref: {tag}\nengine: metrale\nhardware: [{TEST_HARDWARE}]\n"
                "platform: linux/amd64\nrevision-label: org.opencontainers.image.revision\n")

    def own_port(self) -> int:
        """A loopback port this box holds until cleanup (tests/ports.py): the engine double in its container
        (host network) listens on it beside the held socket; nobody else can take it meanwhile."""
        self.held.append(HeldPort())
        return self.held[-1].port

    def recipe(self, short: str, image: str = "ok", port: int | None = None, extra: str = "") -> str:
        """A user recipe served by the double (the flagship's settings on the test class, no GPU)."""
        name = f"{self.prefix}-{short}"
        port = port or self.own_port()
        (self.config / "recipes" / f"{name}.yaml").write_text(
            f"extends: qwen3.5-35b-a3b-hopper\nname: {name}\ndescription: served by the engine test double\n"
            f"image: double-{image}\nresources:\n  port: {port}\n  gpus: none\n{extra}")
        return name

    def weights_complete(self, repo: str = "Sehyo/Qwen3.5-35B-A3B-NVFP4") -> None:
        """A verified snapshot in this box's HF cache, exactly as `metralectl pull` leaves one."""
        import hashlib

        from metralectl.seams.hf import cache as hfcache, listing as hflisting
        commit = "0" * 40
        base = self.home / "hf" / "hub" / ("models--" + repo.replace("/", "--"))
        snap = base / "snapshots" / commit
        snap.mkdir(parents=True, exist_ok=True)
        (base / "refs").mkdir(exist_ok=True)
        (base / "refs" / "main").write_text(commit)
        files = {"config.json": b"{}", "model.safetensors": b"\0" * 16}
        listing = []
        for name, data in files.items():
            (snap / name).write_bytes(data)
            listing.append(hflisting.RepoFile(name, len(data), hashlib.sha256(data).hexdigest()))
        hfcache.write_json_atomic(snap / hfcache.VERIFIED_MANIFEST,
                                  hflisting.Listing(repo, commit, tuple(listing)).to_json())

    def cli(self, *args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                             env=self.env, cwd=REPO, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"metralectl {' '.join(args)} -> {out.returncode}\n{out.stdout}\n{out.stderr}")
        return out

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "metralectl", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env, cwd=REPO)

    def containers(self, all_: bool = True) -> list[str]:
        out = subprocess.run(["docker", "ps", "--format", "{{.Names}}", *(["-a"] if all_ else []),
                              "--filter", f"name=metralectl-{self.prefix}"], capture_output=True, text=True)
        return [n for n in out.stdout.split() if n]

    def wait_for_container(self, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            names = self.containers()
            if names:
                return names[0]
            time.sleep(0.1)
        raise AssertionError("no container appeared")

    def cleanup(self) -> None:
        for name in self.containers():
            subprocess.run(["docker", "rm", "-f", name], capture_output=True)
        while self.held:
            self.held.pop().close()


def _served_elsewhere() -> list[str]:
    """Running metralectl models that are not a test's own (one model per box: they would refuse our runs)."""
    out = subprocess.run(["docker", "ps", "--filter", "label=ai.metrale.metralectl.managed=true", "--format",
                          "{{.Names}}"], capture_output=True, text=True)
    return [n for n in out.stdout.split() if not n.startswith("metralectl-it")]


@pytest.fixture()
def box(tmp_path: Path, engine_images: dict[str, str]) -> Iterator[Box]:
    others = _served_elsewhere()
    if others:
        if not os.environ.get("CI"):
            pytest.skip(f"a metralectl model is being served on this daemon ({', '.join(others)}); "
                        "the lifecycle tests need the box to themselves (one model per box)")
        subprocess.run(["docker", "rm", "-f", *others], capture_output=True)  # CI: leftovers of an earlier run
    machine = Box(tmp_path, engine_images)
    try:
        yield machine
    finally:
        machine.cleanup()
