"""Resumable pull downloads on disk (filesystem only): what counts as a reusable part, what `list` and `prune`
make of parts. The HTTP side is proven in tests/integration/test_staging_resume.py against the fake Hub."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from metralectl import paths
from metralectl.app import disk_weights
from metralectl.seams.hf import cache as hfcache, download as hfdownload, staging as hfstaging
from metralectl.seams.hf.listing import RepoFile
from metralectl.seams.hf.staging import Partial

REPO = "org/big-model"
SHA = "ab" * 32
SPEC = RepoFile("model-00001.safetensors", 40 << 20, SHA, None)


def make_part(have: int, spec: RepoFile = SPEC, repo: str = REPO) -> Partial:
    base = hfcache.repo_dir(repo)
    folder = hfstaging.partial_folder(base)
    folder.mkdir(parents=True, exist_ok=True)
    part = folder / f"{spec.sha256}.part"
    part.write_bytes(b"\0" * have)
    found = Partial(part, part.with_suffix(".json"), repo, spec.path, str(spec.sha256), spec.size, have, '"etag"')
    hfstaging.write_partial_meta(found, "c" * 40)
    return found


def test_pull_reuses_only_a_part_of_the_same_file() -> None:
    base = hfcache.repo_dir(REPO)
    assert hfdownload.kept(base, SPEC) == 0
    make_part(1000)
    assert hfdownload.kept(base, SPEC) == 1000
    resized = RepoFile(SPEC.path, SPEC.size + 1, SHA, None)  # same sha256 named, another size listed: not it
    assert hfdownload.kept(base, resized) == 0
    assert hfstaging.read_partial(hfstaging.partial_folder(base) / f"{SHA}.part") == make_part(1000)


def test_pull_drops_a_part_of_an_older_version_of_the_file_and_says_so() -> None:
    old = make_part(3 << 20)
    newer = RepoFile(SPEC.path, SPEC.size, "cd" * 32, None)
    said: list[str] = []
    hfdownload.drop_superseded(REPO, hfcache.repo_dir(REPO), [newer], said.append)
    assert not old.part.exists() and not old.meta.exists()
    assert len(said) == 1 and "the file changed on the Hub" in said[0] and SPEC.path in said[0]
    kept = make_part(1000, RepoFile("other.safetensors", 20 << 20, "ef" * 32, None))
    hfdownload.drop_superseded(REPO, hfcache.repo_dir(REPO), [newer], said.append)
    assert kept.part.exists() and len(said) == 1  # another path's part is not this file's older version


def test_pull_ctrl_c_message_names_what_is_kept() -> None:
    make_part(5_000_000)
    small = RepoFile("config.json", 10, None, "1" * 40)
    lines = hfdownload.kept_message(hfcache.repo_dir(REPO), [small, SPEC], "`metralectl pull big`")
    assert lines == [f"kept 5.0 MB of 41.9 MB of {SPEC.path}; `metralectl pull big` resumes it"]


def test_pull_reads_content_range() -> None:
    assert hfdownload._content_range("bytes 100-199/200") == (100, 200)
    assert hfdownload._content_range("garbage") == (-1, -1)


def test_weights_state_is_partial_while_only_a_part_exists() -> None:
    make_part(10)
    assert hfcache.cache_state(REPO).status == "partial"


def test_disk_prune_lists_parts_unless_a_pull_holds_the_repository() -> None:
    found = make_part(4096)
    hub = paths.hf_hub_cache()
    base = hfcache.repo_dir(REPO)
    stray = hfstaging.partial_folder(base) / "leftover.json.tmp"
    stray.write_text("{}")
    items = disk_weights.partial_downloads(base, hub, ("big",))
    assert [(i.kind, i.bytes, i.repo) for i in items] == [("download", 4096, REPO), ("download", 2, "")]
    assert f"partial {SPEC.path}" in items[0].name and items[0].paths == found.files
    lock_dir = hub / ".locks" / base.name
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / "metralectl-pull.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert disk_weights.partial_downloads(base, hub) == []  # a pull is writing it now
    disk_weights.remove(items[0], hub)
    assert items[0].done and not found.part.exists() and not found.meta.exists()


def test_disk_prune_plan_includes_parts_of_a_recipes_repository() -> None:
    make_part(4096)
    plan = disk_weights.plan_prune(paths.hf_hub_cache(), {REPO: ("big",)})
    assert [i.bytes for i in plan if ".metralectl-partial" in i.name] == [4096]
    assert os.stat(hfstaging.partial_folder(hfcache.repo_dir(REPO))).st_mode  # planning removed nothing
    assert Path(hfstaging.partial_folder(hfcache.repo_dir(REPO)) / f"{SHA}.part").exists()


def test_pull_places_a_finished_part_and_its_link_atomically(tmp_path: Path) -> None:
    from metralectl.atomicfile import place, symlink_atomic

    part, blob = tmp_path / "x.part", tmp_path / "blobs" / "x"
    blob.parent.mkdir()
    part.write_bytes(b"data")
    place(part, blob)
    assert blob.read_bytes() == b"data" and not part.exists()
    link = tmp_path / "snap" / "f"
    link.parent.mkdir()
    symlink_atomic(link, "../blobs/nothing")  # dangling first, then replaced in one step
    symlink_atomic(link, "../blobs/x")
    assert os.readlink(link) == "../blobs/x" and link.read_bytes() == b"data"
    assert sorted(p.name for p in link.parent.iterdir()) == ["f"]  # no temporary link left behind
