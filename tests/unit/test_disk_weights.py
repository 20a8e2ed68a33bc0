"""`rm` and `prune` on a real HF cache: filled by metralectl's own `pull` (huggingface_hub's download code,
against tests/fakehub on 127.0.0.1), then removed by the CLI. The Docker daemon is pointed at a socket that
does not exist: weights need no daemon (it is asked only whether a container serves them; the integration
test tests/integration/test_disk_real.py asks a real one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from metralectl import paths
from metralectl.app import disk_weights
from metralectl.core.recipe import CheckpointRef
from metralectl.errors import ExitCode
from metralectl.ownedfs import Owned
from metralectl.seams.hf import cache as hfcache, state as hfstate, weights
from tests.fakehub.server import FakeHub, FakeRepo
from tests.unit.test_gguf_weights import Q4, RECIPE, REPO, SPLIT, repo_files, serve

REPO_ROOT = Path(__file__).resolve().parents[2]
FLAGSHIP = "Sehyo/Qwen3.5-35B-A3B-NVFP4"  # qwen3.5-35b-a3b's repository (and -agents', -b200's, -hopper's)
GONE = "someone/Retired-Model"  # a repository metralectl pulled that no recipe names


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    yield from serve(FakeRepo.build(REPO, repo_files()), FakeRepo.flagship(),
                     FakeRepo.build(GONE, {"config.json": b"{}", "model.safetensors": b"\2" * 3000}))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DOCKER_HOST": f"unix://{os.environ['METRALECTL_LOCK_DIR']}/no-docker.sock"}
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, timeout=120)


def gguf(quant: str) -> CheckpointRef:
    return CheckpointRef(repo=REPO, quant=quant, revision=None, format="gguf")


def safetensors(repo: str) -> CheckpointRef:
    return CheckpointRef(repo=repo, quant="nvfp4", revision=None)


def snapshot(hub: FakeHub, repo: str) -> Path:
    return hfcache.snapshot_path(repo, hub.repos[repo].commit)


def test_rm_of_a_gguf_recipe_removes_its_quant_only_and_keeps_the_manifest_true(hub: FakeHub) -> None:
    weights.pull(gguf("UD-Q4_K_XL"))
    weights.pull(gguf("Q4_K_M"))
    base = hfcache.repo_dir(REPO)
    blobs_before = {p.name for p in (base / "blobs").iterdir()}

    dry = cli("rm", RECIPE, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["dry_run"] is True and plan["would_free_bytes"] == 75_000 and plan["freed_bytes"] == 0
    assert [(i["kind"], i["name"], i["removed"]) for i in plan["items"]] == [("quant", f"{REPO}:UD-Q4_K_XL", False)]
    assert "75.0 kB" in dry.stderr and "would go" in dry.stderr
    assert hfstate.checkpoint_state(gguf("UD-Q4_K_XL")).status == "complete"  # a dry run removes nothing

    out = cli("rm", RECIPE, "--yes", "--json")
    assert out.returncode == 0, out.stderr
    done = json.loads(out.stdout)
    assert done["freed_bytes"] == 75_000 and done["items"][0]["removed"] is True
    assert "Docker not reachable" in out.stderr  # said, not hidden: no daemon, so no container of it serves them
    snap = snapshot(hub, REPO)
    assert not any((snap / p).exists() or (snap / p).is_symlink() for p in SPLIT)
    assert (snap / Q4).exists()
    assert len({p.name for p in (base / "blobs").iterdir()}) == len(blobs_before) - 2  # the split's two blobs
    data = json.loads((snap / hfcache.VERIFIED_MANIFEST).read_text())
    assert data["subsets"] == {"Q4_K_M": [Q4]} and [f["path"] for f in data["files"]] == [Q4]
    assert hfstate.checkpoint_state(gguf("UD-Q4_K_XL")).status == "absent"
    assert hfstate.checkpoint_state(gguf("Q4_K_M")).status == "complete"  # the other quant: untouched

    again = cli("rm", RECIPE, "--yes")
    assert again.returncode == 0 and "no weights of" in again.stderr and "nothing to remove" in again.stderr


def test_rm_of_a_safetensors_recipe_removes_the_repository_and_names_every_recipe_using_it(hub: FakeHub) -> None:
    weights.pull(safetensors(FLAGSHIP))
    base = hfcache.repo_dir(FLAGSHIP)
    size = sum(p.stat().st_size for p in (base / "blobs").iterdir())
    out = cli("rm", "qwen3.5-35b-a3b", "--yes", "--json")
    assert out.returncode == 0, out.stderr
    item = json.loads(out.stdout)["items"][0]
    assert item["kind"] == "weights" and item["name"] == FLAGSHIP and item["removed"] is True
    assert item["bytes"] >= size and {"qwen3.5-35b-a3b", "qwen3.5-35b-a3b-agents"} <= set(item["recipes"])
    assert not base.exists()
    assert paths.hf_hub_cache().is_dir()  # only the repository's folder went


def test_rm_asks_at_a_terminal_and_refuses_without_one(hub: FakeHub) -> None:
    weights.pull(safetensors(FLAGSHIP))
    out = cli("rm", "qwen3.5-35b-a3b")  # stdin is not a terminal, and no --yes
    assert out.returncode == ExitCode.USAGE and "pass --yes" in out.stderr and "Traceback" not in out.stderr
    assert hfcache.repo_dir(FLAGSHIP).is_dir()


def test_rm_refuses_a_repository_no_recipe_names(hub: FakeHub) -> None:
    weights.pull(safetensors(GONE))
    out = cli("rm", "--weights", GONE, "--yes")
    assert out.returncode == ExitCode.USAGE and "no recipe names the repository" in out.stderr
    assert hfcache.repo_dir(GONE).is_dir()
    out = cli("rm", "no-such-recipe", "--yes")
    assert out.returncode == ExitCode.USAGE and "Traceback" not in out.stderr


def test_prune_removes_unnamed_pulls_and_dead_downloads_only(hub: FakeHub) -> None:
    weights.pull(safetensors(GONE))
    weights.pull(gguf("Q4_K_M"))
    foreign = paths.hf_hub_cache() / "models--other--tools-model"  # another tool's download: no manifest of ours
    (foreign / "blobs").mkdir(parents=True)
    (foreign / "blobs" / "abc").write_bytes(b"x" * 500)
    blobs = hfcache.repo_dir(REPO) / "blobs"
    dead = blobs / "deadbeef.1a2b3c.incomplete"
    dead.write_bytes(b"y" * 1234)
    old = time.time() - 3600
    os.utime(dead, (old, old))
    live = blobs / "cafef00d.9z8y7x.incomplete"  # written to just now: a download still running
    live.write_bytes(b"z" * 99)

    dry = cli("prune", "--dry-run", "--no-images", "--json")
    assert dry.returncode == 0, dry.stderr
    names = {i["name"]: i for i in json.loads(dry.stdout)["items"]}
    assert set(names) == {GONE, f"{hfcache.repo_dir(REPO).name}/blobs/{dead.name}"}
    assert names[GONE]["kind"] == "weights" and names[GONE]["bytes"] >= 3000
    assert hfcache.repo_dir(GONE).is_dir() and dead.exists()

    out = cli("prune", "--yes", "--no-images")
    assert out.returncode == 0, out.stderr
    assert not hfcache.repo_dir(GONE).exists() and not dead.exists()
    assert live.exists() and (foreign / "blobs" / "abc").exists()
    assert hfstate.checkpoint_state(gguf("Q4_K_M")).status == "complete"
    assert "removed weights someone/Retired-Model" in out.stdout


@pytest.mark.skipif(os.getuid() != 0, reason="making another user's file needs root")
def test_another_users_file_keeps_the_repository_whole(hub: FakeHub) -> None:
    weights.pull(safetensors(FLAGSHIP))
    blob = next((hfcache.repo_dir(FLAGSHIP) / "blobs").iterdir())
    os.chown(blob, 54321, 54321)
    out = cli("rm", "qwen3.5-35b-a3b", "--yes", "--json")
    assert out.returncode == ExitCode.FAILED
    item = json.loads(out.stdout)["items"][0]
    assert item["removed"] is False and "another user" in item["blocked"] and blob.exists()


def test_a_failed_removal_says_what_went_and_what_did_not(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    weights.pull(safetensors(FLAGSHIP))
    weights.pull(safetensors(GONE))
    hub_dir = paths.hf_hub_cache()
    items = [disk_weights.plan_repo(FLAGSHIP, hub_dir), disk_weights.plan_repo(GONE, hub_dir)]
    assert all(i is not None for i in items)
    real = Owned.remove_tree

    def remove_tree(self: Owned, path: Path) -> None:  # the filesystem refusing one folder (a fake: unit test)
        if str(path).endswith("Retired-Model"):
            raise PermissionError(13, "Permission denied", str(path))
        real(self, path)

    monkeypatch.setattr(Owned, "remove_tree", remove_tree)
    for item in items:
        assert item is not None
        disk_weights.remove(item, hub_dir)
    first, second = items
    assert first is not None and second is not None
    assert first.done and first.error is None and not hfcache.repo_dir(FLAGSHIP).exists()
    assert not second.done and second.error is not None and "Permission denied" in second.error

    from metralectl.cli import disk_cmds
    from metralectl.errors import MetralError

    with pytest.raises(MetralError, match="1 of 2 removal"):
        disk_cmds._finish([first, second], as_json=False, dry_run=False, went=True)
