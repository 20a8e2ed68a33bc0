"""`rm` and `prune` keep what runs uses, judged from what runs (issue 27, class 2): the containers on the
daemon (the shared fake runtime, tests/fakes/runtime.py) with their recipe label and `--set`, their argv and
their mounts; a `run`/`swap` in progress (the lifecycle lock); and processes holding the files open.

The catalog alone is not enough: a user recipe deleted while it serves, or a quant chosen with `--set`,
would otherwise let the weights under a running engine go.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from metralectl import paths
from metralectl.core.labels import LABEL_MANAGED, LABEL_OWNER, LABEL_RECIPE, LABEL_SETS, owner
from metralectl.seams import store
from metralectl.seams.hf import cache as hfcache, listing as hflisting
from metralectl.seams.docker.containers import ContainerInfo
from tests.fakes.runtime import FakeRuntime

FLAGSHIP = "qwen3.5-35b-a3b"
REPO = "Sehyo/Qwen3.5-35B-A3B-NVFP4"
GGUF = "unsloth/Qwen3.5-35B-A3B-GGUF"
GGUF_RECIPE = "qwen3.5-35b-a3b-llamacpp"  # quant UD-Q4_K_XL
Q8 = "Qwen3.5-35B-A3B-Q8_0.gguf"
UD = "Qwen3.5-35B-A3B-UD-Q4_K_XL.gguf"
GONE = "someone/Retired-Model"


def cached(repo: str, files: dict[str, bytes]) -> Path:
    """A verified snapshot as `metralectl pull` leaves one (blobs, links, refs/main, the manifest)."""
    commit = "0" * 40
    base = hfcache.repo_dir(repo)
    snap = base / "snapshots" / commit
    listing = []
    for name, data in files.items():
        sha = hashlib.sha256(data).hexdigest()
        (base / "blobs").mkdir(parents=True, exist_ok=True)
        (base / "blobs" / sha).write_bytes(data)
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).symlink_to(f"../../blobs/{sha}")
        listing.append(hflisting.RepoFile(name, len(data), sha))
    (base / "refs").mkdir(exist_ok=True)
    (base / "refs" / "main").write_text(commit)
    hfcache.write_json_atomic(snap / hfcache.VERIFIED_MANIFEST, hflisting.Listing(repo, commit, tuple(listing)).to_json())
    return base


def serving(rt: FakeRuntime, name: str, recipe: str, command: tuple[str, ...] = (), sets: str = "",
            mounts: tuple[str, ...] = (), managed: bool = True) -> None:
    labels = {LABEL_MANAGED: "true", LABEL_OWNER: owner(), LABEL_RECIPE: recipe} if managed else {}
    if sets:
        labels[LABEL_SETS] = sets
    rt.seed(ContainerInfo(f"id-{name}", name, "img", "running", None, False, None, None, labels, command=command,
                          mounts=mounts))


@pytest.fixture
def rt(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRuntime]:
    runtime = FakeRuntime()
    monkeypatch.setattr("metralectl.seams.docker.runtime.open_runtime", lambda *a, **kw: runtime)
    yield runtime


def invoke(*args: str) -> tuple[int, dict[str, Any], str]:
    from metralectl.cli.main import cli

    out = CliRunner().invoke(cli, [*args, "--yes", "--json"])
    return out.exit_code, json.loads(out.stdout), out.stderr


def test_a_deleted_recipe_still_serving_keeps_its_repository(rt: FakeRuntime) -> None:
    base = cached(REPO, {"config.json": b"{}", "model.safetensors": b"w" * 100})
    serving(rt, "metralectl-my-35b", "my-35b", ("serve", REPO, "--port", "8000"))  # its recipe file is gone
    code, plan, _ = invoke("rm", FLAGSHIP)
    assert code == 1 and plan["items"][0]["removed"] is False
    assert plan["items"][0]["blocked"] == "container metralectl-my-35b is serving it (`metralectl stop` first)"
    assert base.is_dir()


def test_a_container_metralectl_cannot_place_keeps_every_weight(rt: FakeRuntime) -> None:
    base = cached(REPO, {"config.json": b"{}"})
    serving(rt, "metralectl-mystery", "mystery", ("serve", "/models/local-copy"))
    code, plan, _ = invoke("rm", FLAGSHIP)
    assert code == 1 and "cannot tell which weights it reads" in plan["items"][0]["blocked"]
    assert base.is_dir()


def test_a_quant_chosen_with_set_is_the_one_kept(rt: FakeRuntime) -> None:
    base = cached(GGUF, {Q8: b"8" * 300, UD: b"u" * 200})
    serving(rt, f"metralectl-{GGUF_RECIPE}", GGUF_RECIPE, ("llama-server", "-hf", f"{GGUF}:Q8_0"),
            sets="checkpoint.quant=Q8_0")
    code, plan, _ = invoke("rm", "--weights", f"{GGUF}:Q8_0")
    assert code == 1 and "is serving it" in plan["items"][0]["blocked"]  # the catalog says UD-Q4_K_XL; it runs Q8_0
    code, plan, _ = invoke("rm", GGUF_RECIPE)  # UD-Q4_K_XL: not what runs
    assert code == 0 and plan["items"][0]["removed"] is True
    snap = base / "snapshots" / ("0" * 40)
    assert (snap / Q8).exists() and not (snap / UD).is_symlink()


def test_a_container_mounting_a_repository_folder_keeps_it(rt: FakeRuntime) -> None:
    base = cached(REPO, {"config.json": b"{}"})
    serving(rt, "someones-vllm", "", ("vllm", "serve", "/model"), mounts=(str(base / "snapshots"),), managed=False)
    code, plan, _ = invoke("rm", FLAGSHIP)
    assert code == 1 and plan["items"][0]["blocked"] == "container someones-vllm is serving it (`metralectl stop` first)"


def test_a_stopped_container_keeps_nothing(rt: FakeRuntime) -> None:
    base = cached(REPO, {"config.json": b"{}"})
    rt.seed(ContainerInfo("id-x", "metralectl-x", "img", "exited", 0, False, None, None,
                          {LABEL_MANAGED: "true", LABEL_OWNER: owner(), LABEL_RECIPE: "gone"}, command=("serve", REPO)))
    code, plan, _ = invoke("rm", FLAGSHIP)
    assert code == 0 and plan["items"][0]["removed"] is True and not base.exists()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    import os

    env = {**os.environ, "DOCKER_HOST": f"unix://{os.environ['METRALECTL_LOCK_DIR']}/no-docker.sock"}
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2], env=env, timeout=60, stdin=subprocess.DEVNULL)


def test_a_process_holding_a_blob_open_keeps_its_repository() -> None:
    base = cached(GONE, {"config.json": b"{}", "model.safetensors": b"w" * 4096})
    blob = next(p for p in (base / "blobs").iterdir() if p.stat().st_size == 4096)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, mmap\nf = open(sys.argv[1], 'rb')\n"
                               "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\nf.close()\n"
                               "print('mapped', flush=True)\nsys.stdin.read()", str(blob)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "mapped"  # mapped, not open
        out = cli("prune", "--yes", "--no-images", "--json")
        item = next(i for i in json.loads(out.stdout)["items"] if i["name"] == GONE)
        assert out.returncode == 1 and item["removed"] is False, out.stderr
        assert item["blocked"].startswith(f"process {holder.pid} (python") and "open or mapped" in item["blocked"]
        assert blob.exists()
    finally:
        holder.communicate("", timeout=10)
    out = cli("prune", "--yes", "--no-images")
    assert out.returncode == 0 and not base.exists(), out.stderr


def test_a_run_in_progress_keeps_every_weight() -> None:
    base = cached(GONE, {"config.json": b"{}"})
    with store.lifecycle_lock("run my-35b"):
        out = cli("prune", "--yes", "--no-images", "--json")
    item = next(i for i in json.loads(out.stdout)["items"] if i["name"] == GONE)
    assert out.returncode == 1 and item["removed"] is False
    assert item["blocked"].startswith("`run my-35b (pid ") and "is in progress on this machine" in item["blocked"]
    assert base.is_dir()
    assert paths.hf_hub_cache().is_dir()


def test_a_host_process_serving_keeps_its_weights_while_docker_is_down(monkeypatch: pytest.MonkeyPatch) -> None:
    """Docker unreachable, an engine run as a host process (runtime: process) serves the repository: `rm` is
    refused by that process, and `prune` leaves the images alone saying why — the disk commands ask the host
    processes without needing Docker, and never ask the host-process side for images."""
    from metralectl.seams.docker.errors import DockerUnavailable

    def docker_down(*args: object, **kwargs: object) -> FakeRuntime:
        raise DockerUnavailable("not-running", "the Docker daemon refuses connections (not running)", "start it")

    processes = FakeRuntime()
    monkeypatch.setattr("metralectl.seams.docker.runtime.open_runtime", docker_down)
    monkeypatch.setattr("metralectl.lifecycle.local_runtime.process_runtime", lambda: processes)
    (paths.metrale_home() / "state" / "processes").mkdir(parents=True)  # an engine has run here as a process
    base = cached(REPO, {"config.json": b"{}", "model.safetensors": b"w" * 100})
    serving(processes, "metralectl-qwen", FLAGSHIP, ("/opt/bin/vllm", "serve", REPO, "--port", "8000"))
    code, plan, _ = invoke("rm", FLAGSHIP)
    assert code == 1 and plan["items"][0]["removed"] is False
    assert plan["items"][0]["blocked"].startswith("container metralectl-qwen ")
    assert base.is_dir()
    code, plan, err = invoke("prune")
    assert code == 0 and "images left alone: the Docker daemon refuses connections" in err
