"""seams/hf/state.status, `list`'s weights column: the status checkpoint_state gives, whatever the hub holds,
though it answers a repository without a folder from one lstat (tests/unit/test_cold_start_paths.py: then it loads
none of the cache's readers)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pytest

from metralectl import paths
from metralectl.seams.hf import cache as hfcache, state as hfstate

SAFETENSORS = SimpleNamespace(repo="org/model", revision=None, quant=None, format="safetensors")
GGUF = SimpleNamespace(repo="org/model-GGUF", revision=None, quant="Q4_K_M", format="gguf")


def _no_hub(hub: Path) -> None:
    pass


def _hub_is_a_file(hub: Path) -> None:
    hub.write_text("not a directory")


def _empty_hub(hub: Path) -> None:
    hub.mkdir()


def _folder_is_a_link(hub: Path) -> None:
    hub.mkdir()
    elsewhere = hub.parent / "elsewhere"
    (elsewhere / "snapshots" / "abc").mkdir(parents=True)
    for ck in (SAFETENSORS, GGUF):
        (hub / hfcache.folder_name(ck.repo)).symlink_to(elsewhere)


def _download_under_way(hub: Path) -> None:
    for ck in (SAFETENSORS, GGUF):
        (hub / hfcache.folder_name(ck.repo) / "blobs").mkdir(parents=True)
        (hub / hfcache.folder_name(ck.repo) / "blobs" / "x.incomplete").write_bytes(b"")


def _snapshot_without_weights(hub: Path) -> None:
    for ck in (SAFETENSORS, GGUF):
        (hub / hfcache.folder_name(ck.repo) / "snapshots" / ("0" * 40)).mkdir(parents=True)
        (hub / hfcache.folder_name(ck.repo) / "snapshots" / ("0" * 40) / "config.json").write_text("{}")


LAYOUTS: dict[str, Callable[[Path], None]] = {
    "no hub": _no_hub, "the hub is a file": _hub_is_a_file, "no folder": _empty_hub,
    "the folder is a link": _folder_is_a_link, "a download under way": _download_under_way,
    "a snapshot without weights": _snapshot_without_weights,
}


@pytest.mark.parametrize("checkpoint", [SAFETENSORS, GGUF], ids=["safetensors", "gguf"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_status_is_checkpoint_states(layout: str, checkpoint: SimpleNamespace, tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    LAYOUTS[layout](hub)
    expected = hfstate.checkpoint_state(checkpoint, hub).status
    assert hfstate.status(checkpoint, hub) == expected
    if layout in ("no hub", "the hub is a file", "no folder", "the folder is a link"):
        assert expected == "absent"


def test_status_reads_the_hub_paths_names(isolated_env: Path) -> None:
    hub = paths.hf_hub_cache()
    assert hfstate.status(SAFETENSORS) == "absent"
    _download_under_way(hub)
    assert hfstate.status(SAFETENSORS) == "partial" == hfstate.checkpoint_state(SAFETENSORS).status
    assert hfcache.repo_dir(SAFETENSORS.repo) == hub / paths.hf_repo_folder(SAFETENSORS.repo)
    assert os.path.isdir(hfcache.repo_dir(SAFETENSORS.repo))
