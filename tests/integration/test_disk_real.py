"""`rm` and `prune` against the real Docker daemon: catalog images only, never one a container runs, never
another repository's; weights a running container serves are kept. Images are made here with `docker import`
under names of this run only (the daemon is shared) and removed at the end."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.integration.conftest import Box

pytestmark = [pytest.mark.docker, pytest.mark.integration]

RUN = uuid.uuid4().hex[:8]
CATALOG = f"metralectl-test/disk-{RUN}"  # a repository the box's catalog names (a user image)
STRANGER = f"metralectl-test/not-catalog-{RUN}:x"  # a repository no catalog names


def _import(ref: str, marker: str) -> None:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:  # a one-file root filesystem: distinct content per image
        body = marker.encode()
        info = tarfile.TarInfo("marker")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    subprocess.run(["docker", "import", "-", ref], input=data.getvalue(), check=True, capture_output=True)


def _present(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0


@pytest.fixture
def made() -> Iterator[list[str]]:
    refs = [f"{CATALOG}:a", f"{CATALOG}:old", STRANGER]
    for ref in refs:
        _import(ref, ref)
    try:
        yield refs
    finally:
        subprocess.run(["docker", "rmi", "-f", *refs], capture_output=True)


def _catalog_image(box: Box) -> str:
    """A user image of the box's catalog (tag :a) and a recipe that runs it."""
    (box.config / "images" / f"disk-{RUN}.yaml").write_text(
        f"schema: 1\nid: disk-{RUN}\nref: {CATALOG}:a\nengine: metrale\nhardware: [hopper]\n"
        "platform: linux/amd64\nrevision-label: org.opencontainers.image.revision\n")
    name = f"{box.prefix}-disk"
    (box.config / "recipes" / f"{name}.yaml").write_text(
        f"extends: qwen3.5-35b-a3b-hopper\nname: {name}\nimage: disk-{RUN}\n")
    return name


def test_images_rm_and_prune_plan(box: Box, made: list[str]) -> None:
    _catalog_image(box)
    plan = box.cli("prune", "--dry-run", "--json")
    assert plan.returncode == 0, plan.stderr
    names = {i["name"]: i for i in json.loads(plan.stdout)["items"] if i["kind"] == "image"}
    assert f"{CATALOG}:old" in names and names[f"{CATALOG}:old"]["bytes"] > 0
    assert f"{CATALOG}:a" not in names  # a recipe runs it
    assert STRANGER not in names  # not the catalog's
    assert all(_present(r) for r in made)  # a dry run removes nothing

    stranger = box.cli("rm", "--image", STRANGER, "--yes", "--json")
    assert stranger.returncode == 1, stranger.stderr
    item = json.loads(stranger.stdout)["items"][0]
    assert item["removed"] is False and "not an image of metralectl's catalog" in item["blocked"]
    assert _present(STRANGER)

    old = box.cli("rm", "--image", f"{CATALOG}:old", "--yes", "--json")
    assert old.returncode == 0, old.stderr
    item = json.loads(old.stdout)["items"][0]
    assert item["removed"] is True and item["bytes"] > 0
    assert not _present(f"{CATALOG}:old") and _present(f"{CATALOG}:a")


def _wait_for_a_free_daemon(timeout: float = 180) -> None:
    """One model per daemon: wait while another worktree's test serves one (the daemon is shared)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["docker", "ps", "-q", "--filter", "label=ai.metrale.metralectl.managed=true"],
                             capture_output=True, text=True)
        if not out.stdout.strip():
            return
        time.sleep(2)
    pytest.skip("another test kept a model served on the shared daemon for 3 minutes")


def test_what_a_running_container_uses_is_kept(box: Box) -> None:
    name = box.recipe("ok")
    box.weights_complete()
    _wait_for_a_free_daemon()
    box.cli("run", name, check=True)
    try:
        weights = box.cli("rm", name, "--yes", "--json")
        assert weights.returncode == 1, weights.stderr
        item = json.loads(weights.stdout)["items"][0]
        assert item["removed"] is False and "is serving it" in item["blocked"]
        assert (box.home / "hf" / "hub" / "models--Sehyo--Qwen3.5-35B-A3B-NVFP4").is_dir()

        image = box.cli("rm", "--image", box.images["ok"], "--dry-run", "--json")
        assert image.returncode == 0, image.stderr
        item = json.loads(image.stdout)["items"][0]
        assert "is running it" in item["blocked"]
        assert _present(box.images["ok"])
    finally:
        box.cli("stop", "--all")


def test_a_deleted_recipe_that_still_serves_keeps_its_weights(box: Box) -> None:
    """Judged from what runs: the container's command names the repository, whatever the catalog says now."""
    name = box.recipe("gone")
    box.weights_complete()
    _wait_for_a_free_daemon()
    box.cli("run", name, check=True)
    try:
        (box.config / "recipes" / f"{name}.yaml").unlink()  # the recipe goes; its container serves on
        out = box.cli("rm", "qwen3.5-35b-a3b-hopper", "--yes", "--json")
        assert out.returncode == 1, out.stderr
        item = json.loads(out.stdout)["items"][0]
        assert item["removed"] is False and item["blocked"] == (f"container metralectl-{name} is serving it "
                                                                "(`metralectl stop` first)")
        assert (box.home / "hf" / "hub" / "models--Sehyo--Qwen3.5-35B-A3B-NVFP4").is_dir()
    finally:
        box.cli("stop", "--all")
