"""Images for real: a local registry (Debian's docker-registry on 127.0.0.1), tiny images made here
with `docker load` of a hand-written image archive (any architecture, no emulation, nothing pulled
from the internet), pulled back through metralectl's runtime seam with per-layer progress, labels
and platform checked. Every image, tag and registry process made here is removed afterwards.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import pytest
import yaml

from metralectl.core import images
from metralectl.seams.docker import images as docker_images

from metralectl.seams import machine
from metralectl.core.image_info import ImageInfo
from tests.ports import PortTaken, port_in_use, start_retrying

pytestmark = pytest.mark.docker

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN = uuid.uuid4().hex[:8]
LABEL = "org.opencontainers.image.revision"
ARCH = machine.cpu_arch()
HERE = images.machine_platform(ARCH)
OTHER = "linux/arm64" if HERE == "linux/amd64" else "linux/amd64"


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def image_archive(ref: str, platform: str, labels: dict[str, str], layer_bytes: int = 600_000) -> bytes:
    """A `docker save`-format archive of a two-layer image for `platform` (contents are inert data)."""
    layers = [_tar({f"data/layer{i}.bin": os.urandom(layer_bytes)}) for i in range(2)]
    diff_ids = ["sha256:" + hashlib.sha256(layer).hexdigest() for layer in layers]
    os_name, arch = platform.split("/")
    config = json.dumps({"architecture": arch, "os": os_name, "created": "2026-01-01T00:00:00Z",
                         "config": {"Labels": labels, "Cmd": ["/nothing"]},
                         "rootfs": {"type": "layers", "diff_ids": diff_ids},
                         "history": [{"created": "2026-01-01T00:00:00Z"}] * 2}).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    members = {config_name: config}
    for i, layer in enumerate(layers):
        members[f"layer{i}/layer.tar"] = layer
    members["manifest.json"] = json.dumps([{"Config": config_name, "RepoTags": [ref],
                                            "Layers": [f"layer{i}/layer.tar" for i in range(2)]}]).encode()
    return _tar(members)


@pytest.fixture(scope="module")
def client():
    docker = pytest.importorskip("docker")
    try:
        c = docker.from_env(timeout=60)
        c.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means "no daemon here"
        pytest.skip(f"no Docker daemon reachable ({exc}); start one with tests/docker_image/start-dockerd.sh")
    made: list[str] = []
    c.made = made  # type: ignore[attr-defined]
    yield c
    leftovers = made + [i.id for i in c.images.list(all=True, filters={"label": f"metralectl-test={RUN}"})]
    for ref in leftovers:  # by tag, then by label: a moved tag leaves an untagged image behind
        try:
            c.images.remove(ref, force=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
    c.close()


def load(client, ref: str, platform: str, revision: str) -> None:
    client.images.load(image_archive(ref, platform, {LABEL: revision, "metralectl-test": RUN}))
    client.made.append(ref)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory):
    binary = shutil.which("docker-registry") or shutil.which("registry")
    if binary is None:
        pytest.skip("no docker-registry binary (apt-get install docker-registry)")
    root = tmp_path_factory.mktemp("registry")
    import httpx

    def start(port: int) -> tuple[int, subprocess.Popen[bytes]]:
        """The registry on `port`; PortTaken when another program had it (the registry binds it itself)."""
        config = root / "config.yml"
        config.write_text(yaml.safe_dump({"version": 0.1, "log": {"level": "warn"},
                                          "storage": {"filesystem": {"rootdirectory": str(root / "data")}},
                                          "http": {"addr": f"127.0.0.1:{port}"}}))
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=1).status_code == 200:
                    return port, proc
            except httpx.HTTPError:
                time.sleep(0.1)
        proc.kill()
        said = proc.communicate()[1].decode(errors="replace")
        if port_in_use(said):
            raise PortTaken(said)
        pytest.fail(f"docker-registry did not answer: {said}")

    port, proc = start_retrying(start)
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def runtime(client):
    from metralectl.seams.docker.runtime import DockerRuntime
    rt = DockerRuntime()
    yield rt
    rt.close()


def info(ref: str, platform: str = HERE, build: str | None = None, image_id: str = "test-tiny") -> ImageInfo:
    return ImageInfo(id=image_id, ref=ref, engine="metrale", hardware=("hopper",), platform=platform,
                     min_cuda=None, min_driver=None, revision_label=LABEL, build=build)


@pytest.fixture
def pushed(client, registry) -> str:
    """An image in the local registry, and not in the daemon: what `pull` has to fetch."""
    ref = f"{registry}/metralectl-test/tiny-{RUN}:latest"
    load(client, ref, HERE, f"rev-{RUN}")
    for line in client.api.push(ref.rsplit(":", 1)[0], tag="latest", stream=True, decode=True):
        assert "error" not in line, line
    client.images.remove(ref, force=True)
    return ref


def test_pull_from_a_local_registry_with_layer_progress(pushed: str, runtime, client) -> None:
    events: list[images.LayerProgress] = []
    assert runtime.image_state(pushed).present is False
    result = docker_images.pull(info(pushed), runtime, ARCH, events.append)
    assert result.action == "pulled"
    s = result.status
    assert s.present and s.revision == f"rev-{RUN}" and s.local_platform == HERE and s.problem is None
    assert s.digest and s.digest.startswith(pushed.rsplit(":", 1)[0] + "@sha256:")
    layers = {e.layer for e in events if e.layer and e.status == "Pull complete"}
    assert len(layers) == 2, events
    assert any(e.status == "Downloading" and e.current and e.total for e in events)
    again = docker_images.pull(info(pushed), runtime, ARCH, events.append)
    assert again.action == "present"  # staged already: nothing to do without --update


def test_cli_pull_image_only_and_images_listing(pushed: str, client, tmp_path: Path) -> None:
    from metralectl.core.catalog import load_catalog

    base = next(r for r in load_catalog(include_user=False).recipes.values()
                if images.normalize_platform(load_catalog(include_user=False).images[r.image].platform) == HERE
                and r.resources.world_size == 1 and r.engine == "metrale")  # the test image says engine metrale
    config = Path(os.environ["METRALECTL_CONFIG_DIR"])
    (config / "images").mkdir(parents=True, exist_ok=True)
    (config / "recipes").mkdir(parents=True, exist_ok=True)
    (config / "images" / "test-tiny.yaml").write_text(yaml.safe_dump({
        "schema": 1, "id": "test-tiny", "ref": pushed, "engine": "metrale", "hardware": [base.hardware],
        "platform": HERE, "revision-label": LABEL}))
    (config / "recipes" / "test-staging.yaml").write_text(yaml.safe_dump({
        "schema": 1, "name": "test-staging", "extends": base.name, "image": "test-tiny"}))
    client.made.append(pushed)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                              cwd=REPO_ROOT, env=dict(os.environ), timeout=120)

    out = cli("pull", "test-staging", "--image-only", "--json")
    assert out.returncode == 0, out.stderr
    image = json.loads(out.stdout)["recipes"][0]["image"]
    assert image["action"] == "pulled" and image["revision"] == f"rev-{RUN}" and image["local_platform"] == HERE
    assert "Pull complete" in out.stderr  # per-layer progress on stderr (plain lines: not a terminal)
    listing = json.loads(cli("images", "--json").stdout)
    mine = next(i for i in listing["images"] if i["id"] == "test-tiny")
    assert mine["present"] and mine["recipes"] == ["test-staging"] and mine["revision"] == f"rev-{RUN}"
    table = cli("images")
    assert table.returncode == 0 and "test-tiny" in table.stdout and f"rev-{RUN}"[:12] in table.stdout


def test_local_image_for_another_platform_is_refused_before_launch(client, runtime) -> None:
    ref = f"metralectl-test/wrong-arch-{RUN}:latest"
    load(client, ref, OTHER, "rev-wrong")
    declared_here = info(ref, HERE, build="docker build -t " + ref + " .")
    state = runtime.image_state(ref)
    assert state.present and state.platform == OTHER and state.revision == "rev-wrong"
    problem = images.check_platform(state, declared_here, ARCH)
    assert problem is not None and f"the local {ref} is a {OTHER} image, but this machine is {HERE}" in problem.message
    assert f"docker pull --platform {HERE} {ref}" in (problem.hint or "")
    with pytest.raises(images.ImageError, match="exec format error"):
        docker_images.pull(declared_here, runtime, ARCH)
    with pytest.raises(images.ImageError, match=f"is a {OTHER} image"):
        docker_images.image_preflight(declared_here, runtime, ARCH, "some-recipe")


def test_image_declared_for_another_platform_is_refused(client, runtime) -> None:
    ref = f"metralectl-test/other-{RUN}:latest"
    load(client, ref, OTHER, "rev-other")
    with pytest.raises(images.ImageError, match=f"built for {OTHER} .*this machine is {HERE} \\({ARCH}\\)"):
        docker_images.pull(info(ref, OTHER), runtime, ARCH)


def test_present_image_passes_preflight_and_absent_one_names_pull(client, runtime) -> None:
    ref = f"metralectl-test/ok-{RUN}:latest"
    load(client, ref, HERE, "rev-ok")
    docker_images.image_preflight(info(ref), runtime, ARCH, "some-recipe")
    with pytest.raises(images.ImageError, match="run `metralectl pull some-recipe`"):
        docker_images.image_preflight(info(f"metralectl-test/absent-{RUN}:latest"), runtime, ARCH, "some-recipe")
    with pytest.raises(images.ImageError, match="cannot be pulled: it is built from source"):
        docker_images.pull(info(f"metralectl-test/absent-{RUN}:latest", build="docker build ..."), runtime, ARCH)
