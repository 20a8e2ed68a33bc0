"""Symlinked sandboxes in the HF cache (issue 27, class 2): a repository folder, a snapshot entry, `blobs`,
`.metralectl-partial`, a `.part`, its sidecar or `refs/main` that is a link to something outside the cache (a sentinel
in the test's tmp tree). `pull`, `rm`, `prune` and `list` run as the CLI in a subprocess; each leaves
every sentinel byte for byte, never reads through such a link (a FIFO behind one would hang it), and
says what it left alone.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from metralectl import paths
from metralectl.core.recipe import CheckpointRef
from metralectl.seams.hf import cache as hfcache, staging as hfstaging, weights
from tests.fakehub.server import FakeHub, FakeRepo
from tests.unit import test_gguf_weights as g
from tests.unit.test_pull_hostile import tree

REPO_ROOT = Path(__file__).resolve().parents[2]
FLAGSHIP = "qwen3.5-35b-a3b"
REPO = "Sehyo/Qwen3.5-35B-A3B-NVFP4"
GONE = "someone/Retired-Model"  # pulled by metralectl, named by no recipe: prune's to remove
BIG = "model.safetensors"  # 17 MiB: resumable, through .metralectl-partial
CONFIG = b'{"model_type": "qwen3_5_moe"}'
FILES = {"config.json": CONFIG, "empty.txt": b"", BIG: random.Random(3).randbytes(17 << 20)}


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    yield from g.serve(FakeRepo.build(REPO, FILES), FakeRepo.build(g.REPO, g.repo_files()),
                       FakeRepo.build(GONE, {"config.json": b"{}", "model.safetensors": b"\2" * 3000}))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    there = tmp_path / "outside"
    (there / "dir").mkdir(parents=True)
    (there / "dir" / "sentinel").write_bytes(b"keep me")
    (there / "sentinel").write_bytes(b"x" * len(CONFIG))  # as large as config.json: a size check alone is fooled
    return there


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DOCKER_HOST": f"unix://{os.environ['METRALECTL_LOCK_DIR']}/no-docker.sock"}
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, cwd=REPO_ROOT,
                          env=env, timeout=timeout, stdin=subprocess.DEVNULL)


def base(repo: str = REPO) -> Path:
    return hfcache.repo_dir(repo)


def snapshot(hub: FakeHub, repo: str = REPO) -> Path:
    return hfcache.snapshot_path(repo, hub.repos[repo].commit)


def relink(entry: Path, target: Path) -> None:
    if entry.is_symlink() or entry.is_file():
        entry.unlink()
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.symlink_to(target)


def weights_of(name: str = FLAGSHIP) -> str:
    out = cli("list", "--json")
    assert out.returncode == 0, out.stderr
    return str(next(r for r in json.loads(out.stdout)["recipes"] if r["name"] == name)["weights"])


def untouched(outside: Path, before: dict[str, tuple[object, ...]]) -> None:
    assert tree(outside) == before


# --- a repository folder that is a link ---------------------------------------------------------------------
def test_a_repository_folder_that_is_a_link_is_left_alone(hub: FakeHub, outside: Path) -> None:
    paths.hf_hub_cache().mkdir(parents=True)
    base().symlink_to(outside / "dir")
    before = tree(outside)
    pulled = cli("pull", FLAGSHIP, "--weights-only")
    assert pulled.returncode == 65 and "is a symlink or not a directory" in pulled.stderr, pulled.stderr
    assert "Traceback" not in pulled.stderr
    assert weights_of() == "absent"
    removed = cli("rm", FLAGSHIP, "--yes", "--json")
    assert removed.returncode == 1, removed.stderr
    item = json.loads(removed.stdout)["items"][0]
    assert item["removed"] is False and item["blocked"].startswith("left alone:") and "symbolic link" in item["blocked"]
    pruned = cli("prune", "--yes", "--no-images")
    assert pruned.returncode == 0, pruned.stderr
    assert f"left alone: {base().name}" in pruned.stderr and "is a symbolic link" in pruned.stderr
    untouched(outside, before)
    assert base().is_symlink()


# --- a snapshot entry that points outside ---------------------------------------------------------------------
def test_list_and_pull_do_not_trust_an_entry_that_points_outside(hub: FakeHub, outside: Path) -> None:
    weights.pull(CheckpointRef(repo=REPO, quant="nvfp4", revision=None))
    entry = snapshot(hub) / "config.json"
    relink(entry, outside / "sentinel")  # same size as the listed file: only the link says it is not ours
    before = tree(outside)
    assert weights_of() == "partial"
    out = cli("pull", FLAGSHIP, "--weights-only")
    assert out.returncode == 0, out.stderr
    assert "config.json pointed outside the repository's blobs: not followed" in out.stderr
    assert "what it pointed to was left alone" in out.stderr
    assert os.readlink(entry) == f"../../blobs/{hub.repos[REPO].files['config.json'].oid}"
    assert entry.read_bytes() == CONFIG and weights_of() == "complete"
    untouched(outside, before)


def test_an_entry_pointing_at_a_fifo_is_never_opened(hub: FakeHub, outside: Path) -> None:
    """empty.txt is listed with 0 bytes; a FIFO has 0 bytes too: opening it to hash it would hang for ever."""
    weights.pull(CheckpointRef(repo=REPO, quant="nvfp4", revision=None))
    (snapshot(hub) / hfcache.VERIFIED_MANIFEST).unlink()  # so everything is hashed again
    fifo = outside / "fifo"
    os.mkfifo(fifo)
    relink(snapshot(hub) / "empty.txt", fifo)
    out = cli("pull", FLAGSHIP, "--weights-only", timeout=60)
    assert out.returncode == 0, out.stderr
    assert weights_of() == "complete" and (snapshot(hub) / "empty.txt").read_bytes() == b""


def test_rm_of_a_quant_leaves_an_entry_that_points_outside_and_its_target(hub: FakeHub, outside: Path) -> None:
    weights.pull(CheckpointRef(repo=g.REPO, quant="UD-Q4_K_XL", revision=None, format="gguf"))
    snap = snapshot(hub, g.REPO)
    relink(snap / g.SPLIT[1], outside / "sentinel")
    before = tree(outside)
    out = cli("rm", g.RECIPE, "--yes", "--json")
    assert out.returncode == 0, out.stderr
    item = json.loads(out.stdout)["items"][0]
    assert item["removed"] is True and len(item["left_alone"]) == 1
    assert f"left alone: {paths.display(snap / g.SPLIT[1])} points outside the cache" in item["left_alone"][0]
    assert "points outside the cache" in out.stderr
    assert not (snap / g.SPLIT[0]).exists() and (snap / g.SPLIT[1]).is_symlink()
    untouched(outside, before)


def test_prune_removes_a_folder_with_links_out_as_links_and_says_so(hub: FakeHub, outside: Path) -> None:
    weights.pull(CheckpointRef(repo=GONE, quant="nvfp4", revision=None))
    relink(snapshot(hub, GONE) / "config.json", outside / "sentinel")
    relink(base(GONE) / "blobs" / "extra", outside / "dir")
    before = tree(outside)
    dry = cli("prune", "--dry-run", "--no-images", "--json")
    item = next(i for i in json.loads(dry.stdout)["items"] if i["name"] == GONE)
    assert len(item["left_alone"]) == 2 and all("points outside the cache" in n for n in item["left_alone"])
    out = cli("prune", "--yes", "--no-images")
    assert out.returncode == 0, out.stderr
    assert not base(GONE).exists() and "points outside the cache" in out.stderr
    untouched(outside, before)


# --- blobs/, .metralectl-partial, a .part, refs/main ------------------------------------------------------------
def test_pull_refuses_to_write_through_a_blobs_link(hub: FakeHub, outside: Path) -> None:
    base().mkdir(parents=True)
    (base() / "blobs").symlink_to(outside / "dir")
    before = tree(outside)
    out = cli("pull", FLAGSHIP, "--weights-only")
    assert out.returncode == 65 and "'blobs' is a symlink or not a directory" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    untouched(outside, before)


def test_rm_of_a_quant_does_not_follow_a_blobs_link(hub: FakeHub, outside: Path) -> None:
    weights.pull(CheckpointRef(repo=g.REPO, quant="UD-Q4_K_XL", revision=None, format="gguf"))
    blobs = base(g.REPO) / "blobs"
    blobs.rename(outside / "blobs")  # the blobs now live outside, reached through a link
    blobs.symlink_to(outside / "blobs")
    before = tree(outside)
    out = cli("rm", g.RECIPE, "--yes", "--json")
    assert out.returncode == 1, out.stderr
    item = json.loads(out.stdout)["items"][0]
    assert item["removed"] is False and item["blocked"].startswith("left alone")
    assert len(item["left_alone"]) == 2 and all("points outside the cache" in n for n in item["left_alone"])
    untouched(outside, before)


def test_pull_refuses_to_write_through_a_partial_folder_link(hub: FakeHub, outside: Path) -> None:
    base().mkdir(parents=True)
    hfstaging.partial_folder(base()).symlink_to(outside / "dir")
    before = tree(outside)
    out = cli("pull", FLAGSHIP, "--weights-only")
    assert out.returncode == 65 and "'.metralectl-partial' is a symlink or not a directory" in out.stderr, out.stderr
    pruned = cli("prune", "--yes", "--no-images")
    assert pruned.returncode == 0 and "left alone: models--Sehyo--Qwen3.5-35B-A3B-NVFP4/.metralectl-partial" in (
        pruned.stderr), pruned.stderr
    untouched(outside, before)


def test_a_part_that_is_a_link_is_replaced_never_written_through(hub: FakeHub, outside: Path) -> None:
    sha = hub.repos[REPO].files[BIG].sha256
    folder = hfstaging.partial_folder(base())
    folder.mkdir(parents=True)
    (folder / f"{sha}.part").symlink_to(outside / "sentinel")  # with a sidecar that says "resume me"
    (folder / f"{sha}.json").write_text(json.dumps({"repo": REPO, "path": BIG, "sha256": sha,
                                                    "size": len(FILES[BIG]), "commit": hub.repos[REPO].commit}))
    before = tree(outside)
    out = cli("pull", FLAGSHIP, "--weights-only")
    assert out.returncode == 0, out.stderr
    assert f"{sha}.part: a symbolic link where a partial download belongs" in out.stderr
    assert "resuming" not in out.stderr and weights_of() == "complete"
    untouched(outside, before)


def test_a_sidecar_that_is_a_link_is_neither_followed_nor_resumed_from(hub: FakeHub, outside: Path) -> None:
    """A genuine first MiB in the part, its sidecar a link to a file an attacker wrote (it names the same content
    and an ETag of theirs, to be sent back as If-Range): the link is removed as an entry, the file starts afresh."""
    sha = hub.repos[REPO].files[BIG].sha256
    folder = hfstaging.partial_folder(base())
    folder.mkdir(parents=True)
    (folder / f"{sha}.part").write_bytes(FILES[BIG][: 1 << 20])
    planted = {"repo": REPO, "path": BIG, "sha256": sha, "size": len(FILES[BIG]), "commit": hub.repos[REPO].commit,
               "validator": '"attacker-etag"'}
    (outside / "sidecar.json").write_text(json.dumps(planted))
    (folder / f"{sha}.json").symlink_to(outside / "sidecar.json")
    before = tree(outside)
    out = cli("pull", FLAGSHIP, "--weights-only")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert f"{sha}.json: a symbolic link where a partial download belongs" in out.stderr, out.stderr
    assert "resuming" not in out.stderr and weights_of() == "complete"  # a fresh download, not the planted state
    assert not (folder / f"{sha}.json").is_symlink()
    untouched(outside, before)


def test_refs_main_that_is_a_link_is_replaced_never_written_through(hub: FakeHub, outside: Path) -> None:
    (base() / "refs").mkdir(parents=True)
    (base() / "refs" / "main").symlink_to(outside / "sentinel")
    before = tree(outside)
    out = cli("pull", FLAGSHIP, "--weights-only")
    assert out.returncode == 0, out.stderr
    assert "refs/main was a symbolic link: replaced, not followed" in out.stderr
    assert not (base() / "refs" / "main").is_symlink()
    assert (base() / "refs" / "main").read_text() == hub.repos[REPO].commit
    untouched(outside, before)


@pytest.mark.parametrize("where", ["refs/main", "manifest"])
def test_list_never_opens_a_fifo_behind_a_link(hub: FakeHub, outside: Path, where: str) -> None:
    """refs/main or the verified manifest pointing at a FIFO: reading it would block `list` for ever."""
    weights.pull(CheckpointRef(repo=REPO, quant="nvfp4", revision=None))
    fifo = outside / "fifo"
    os.mkfifo(fifo)
    entry = base() / "refs" / "main" if where == "refs/main" else snapshot(hub) / hfcache.VERIFIED_MANIFEST
    relink(entry, fifo)
    assert weights_of() == ("complete" if where == "refs/main" else "present")  # as if the file were not there
