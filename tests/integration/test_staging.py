"""Staging weights for real: huggingface_hub's own download code against a local fake Hub over HTTP
(tests/fakehub/server.py), real files in a real cache, real faults (dropped connections, corrupt and
truncated objects, gated repos, a full disk, root-owned files).

The repository is served under the flagship recipe's real name (Sehyo/Qwen3.5-35B-A3B-NVFP4) with a
few MB of random bytes, so the shipped recipe, `list` and `pull` run unchanged.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from metralectl.seams.hf import cache as hfcache, hub as hfhub, steps as hfsteps, weights
from metralectl.core.recipe import CheckpointRef
from metralectl import wording
from tests.fakehub.server import FakeHub, demo_repo

REPO_ROOT = Path(__file__).resolve().parents[2]
FLAGSHIP = "qwen3.5-35b-a3b"
REPO = "Sehyo/Qwen3.5-35B-A3B-NVFP4"
SHARD1 = "model-00001-of-00002.safetensors"

pytestmark = pytest.mark.integration


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch):
    with FakeHub([demo_repo(REPO)]) as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield fake


def ck(revision: str | None = None, repo: str = REPO) -> CheckpointRef:
    return CheckpointRef(repo=repo, quant="nvfp4", revision=revision)


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=dict(os.environ), timeout=timeout)


def list_weights() -> str:
    out = cli("list", "--json")
    assert out.returncode == 0, out.stderr
    return next(r for r in json.loads(out.stdout)["recipes"] if r["name"] == FLAGSHIP)["weights"]


def snapshot_files(hub: FakeHub) -> dict[str, bytes]:
    repo = hub.repos[REPO]
    snap = hfcache.snapshot_path(REPO, repo.commit)
    return {p: (snap / p).read_bytes() for p in repo.files}


# --- the happy path --------------------------------------------------------------------------------
def test_full_download_is_verified_complete_with_progress(hub: FakeHub) -> None:
    hub.fault(SHARD1, "slow", rate=1_000_000)  # ~1.5 s, so progress carries a rate and an ETA
    events: list[hfsteps.PullEvent] = []
    result = weights.pull(ck(), events.append)
    fake = hub.repos[REPO]
    assert result.commit == fake.commit and not result.already_complete
    assert result.downloaded_bytes == result.total_bytes == sum(len(f.data) for f in fake.files.values())
    assert snapshot_files(hub) == {p: f.data for p, f in fake.files.items()}
    state = hfcache.cache_state(REPO)
    assert state.status == "complete" and state.commit == fake.commit
    manifest = json.loads((state.snapshot / hfcache.VERIFIED_MANIFEST).read_text())
    assert manifest["commit"] == fake.commit and manifest["revision"] is None
    assert {f["path"] for f in manifest["files"]} == set(fake.files)
    assert (hfcache.repo_dir(REPO) / "refs" / "main").read_text() == fake.commit  # resolved commit recorded
    downloads = [e for e in events if e.phase == "download"]
    assert [e.done for e in downloads] == sorted(e.done for e in downloads)
    assert downloads[-1].done == downloads[-1].total == result.total_bytes
    assert any(e.rate_bps and e.eta_s is not None for e in downloads)
    assert [e.phase for e in events if e.phase in ("verify", "done")][-1] == "done"
    for path in fake.files:  # every file fetched exactly once
        assert len([r for r in hub.gets() if r.path.endswith("/" + path) or fake.files[path].sha256 in r.path]) == 1

    before = len(hub.log)
    again = weights.pull(ck())
    assert again.already_complete
    assert not [r for r in hub.log[before:] if r.method == "GET" and "/api/" not in r.path]


def test_pinned_revision_is_used_and_needs_no_network_once_complete(hub: FakeHub) -> None:
    commit = hub.repos[REPO].commit
    result = weights.pull(ck(commit))
    assert result.commit == commit and result.revision == commit
    assert hfcache.cache_state(REPO, commit).status == "complete"
    assert not (hfcache.repo_dir(REPO) / "refs" / "main").exists()  # a pin needs no branch ref
    assert all(commit in r.path for r in hub.log if "/resolve/" in r.path)
    hub.stop()  # the Hub is gone: a complete pinned commit needs nothing from it
    again = weights.pull(ck(commit))
    assert again.already_complete and not again.checked_hub


def test_unreachable_hub_is_explained_and_a_complete_copy_kept(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    weights.pull(ck())
    hub.stop()
    result = weights.pull(ck())  # unpinned: asks for main, cannot, keeps the verified copy
    assert result.already_complete and not result.checked_hub and "unreachable" in result.notes[0]
    monkeypatch.setenv("HF_HOME", tempfile.mkdtemp())
    with pytest.raises(hfhub.WeightsError, match="cannot reach the Hugging Face Hub at http://127.0.0.1") as err:
        weights.pull(ck())
    assert "HF_ENDPOINT" in (err.value.hint or "")


# --- interruption and resume -----------------------------------------------------------------------
def test_killed_connection_resumes_with_a_range_request(monkeypatch: pytest.MonkeyPatch) -> None:
    big = demo_repo(REPO, shard_bytes=24_000_000)  # > huggingface_hub's 10 MiB write chunk, so bytes survive
    with FakeHub([big]) as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
        fake.fault(SHARD1, "kill", times=1, at=0.7)
        result = weights.pull(ck())
        shard = big.files[SHARD1]
        gets = fake.gets(shard.sha256)
    assert len(gets) == 2, gets
    assert gets[0].range is None and gets[1].status == 206 and gets[1].range.startswith("bytes=")
    assert int(gets[1].range[6:].rstrip("-")) > 0  # resumed, not restarted
    assert hfcache.cache_state(REPO).status == "complete" and result.commit == big.commit
    assert hfcache.snapshot_path(REPO, big.commit).joinpath(SHARD1).read_bytes() == shard.data


def _start_cli_pull(hub: FakeHub) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "metralectl", "pull", FLAGSHIP, "--weights-only"],
                            cwd=REPO_ROOT, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _wait_mid_shard(hub: FakeHub, proc: subprocess.Popen[str]) -> None:
    sha = hub.repos[REPO].files[SHARD1].sha256
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        if hub.gets(sha) and len(hub.gets("/config.json")) == 1:
            time.sleep(0.5)  # some bytes of the shard are on disk
            return
        time.sleep(0.05)
    pytest.fail(f"the pull never reached the shard: {proc.communicate()}")


@pytest.mark.parametrize("how", ["ctrl-c", "kill -9"])
def test_interrupted_pull_is_partial_and_the_next_pull_finishes(hub: FakeHub, how: str) -> None:
    hub.fault(SHARD1, "slow", rate=200_000)  # the 1.5 MB shard takes ~7 s
    proc = _start_cli_pull(hub)
    _wait_mid_shard(hub, proc)
    proc.send_signal(signal.SIGINT if how == "ctrl-c" else signal.SIGKILL)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == (130 if how == "ctrl-c" else -9), err
    base = hfcache.repo_dir(REPO)
    leftovers = hfcache.incomplete_blobs(base)
    assert (leftovers == []) == (how == "ctrl-c")  # Ctrl-C unwinds and cleans up; SIGKILL cannot
    assert list_weights() == "partial"  # an interrupted download is never usable
    hub.clear_faults()
    out = cli("pull", FLAGSHIP, "--weights-only", "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)["recipes"][0]["weights"]
    assert summary["status"] == "complete" and 0 < summary["downloaded_bytes"] < summary["total_bytes"]
    assert len(hub.gets("/config.json")) == 1  # finished files were kept, not fetched again
    assert hfcache.incomplete_blobs(base) == [] and list_weights() == "complete"
    if how == "kill -9":
        # every .part the kill left is removed and counted (one for the slow shard; on a busy box another shard
        # may still have been in flight when the kill landed)
        said = f"removed {wording.count(len(leftovers), 'unfinished download')} ("
        assert leftovers and said in out.stderr and "left by an interrupted run" in out.stderr, (leftovers, out.stderr)


# --- bad data is never "complete" ------------------------------------------------------------------
@pytest.mark.parametrize("fault,why", [("corrupt", "sha256"), ("truncate", "size")])
def test_corrupt_or_truncated_file_is_rejected(hub: FakeHub, fault: str, why: str) -> None:
    hub.fault(SHARD1, fault)
    with pytest.raises(hfhub.WeightsError, match="failed verification") as err:
        weights.pull(ck())
    assert SHARD1 in err.value.message and why in err.value.message and "not marked complete" in err.value.message
    state = hfcache.cache_state(REPO)
    assert state.status == "partial" and not (state.snapshot / hfcache.VERIFIED_MANIFEST).exists()
    assert not (state.snapshot / SHARD1).exists()  # the bad copy is gone, the engine cannot load it
    hub.clear_faults()
    result = weights.pull(ck())
    assert result.downloaded_bytes == len(hub.repos[REPO].files[SHARD1].data)  # only the bad file again
    assert hfcache.cache_state(REPO).status == "complete"


def test_a_transfer_that_keeps_breaking_fails_clearly(hub: FakeHub) -> None:
    hub.fault(SHARD1, "kill", at=0.3)  # every attempt: huggingface_hub retries 5 times, then gives up
    with pytest.raises(hfhub.WeightsError, match=f"{SHARD1} kept breaking off"):
        weights.pull(ck())
    assert hfcache.cache_state(REPO).status == "partial"


# --- access -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("token,status,text", [
    (None, 401, "gated repository and no Hugging Face token is set"),
    ("hf_valid", 403, "your token has not been granted access"),
    ("hf_bogus", 401, "token was refused"),
])
def test_gated_repo_is_explained(hub: FakeHub, monkeypatch: pytest.MonkeyPatch, token: str | None, status: int,
                                 text: str) -> None:
    hub.repos[REPO].gated = "manual"
    if token:
        monkeypatch.setenv("HF_TOKEN", token)
    with pytest.raises(hfhub.WeightsError, match=text) as err:
        weights.pull(ck())
    if token != "hf_bogus":
        assert f"(the Hub answered {status})" in err.value.message
        assert f"https://huggingface.co/{REPO}" in (err.value.hint or "")
    assert hfcache.cache_state(REPO).status != "complete"
    assert not hub.gets("/cdn/")  # nothing big was fetched


def test_gated_repo_with_an_authorized_token_downloads(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    hub.repos[REPO].gated = "manual"
    hub.repos[REPO].authorized.add("hf_valid")
    monkeypatch.setenv("HF_TOKEN", "hf_valid")
    weights.pull(ck())
    assert hfcache.cache_state(REPO).status == "complete"
    assert all(r.authorized for r in hub.log if "/resolve/" in r.path)  # HF_TOKEN was sent to the Hub...
    assert not any(r.authorized for r in hub.gets("/cdn/"))  # ...and not to the CDN


def test_gated_message_through_the_cli(hub: FakeHub) -> None:
    hub.repos[REPO].gated = "manual"
    out = cli("pull", FLAGSHIP, "--weights-only")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "is a gated repository and no Hugging Face token is set" in out.stderr and "HF_TOKEN" in out.stderr


def test_unknown_repo_and_revision(hub: FakeHub) -> None:
    with pytest.raises(hfhub.WeightsError, match="no repository nobody/nothing on the Hub"):
        weights.pull(ck(repo="nobody/nothing"))
    with pytest.raises(hfhub.WeightsError, match=f"{REPO} has no revision {'0' * 40}"):
        weights.pull(ck("0" * 40))


# --- disk ---------------------------------------------------------------------------------------------
@pytest.fixture
def tmpfs(tmp_path: Path):
    mount = tmp_path / "small-disk"
    mount.mkdir()
    mounted = []

    def make(size: str) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root; test_disk_preflight_at_the_seam covers the logic")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(mount)
        return mount

    yield make
    for m in mounted:
        subprocess.run(["umount", str(m)], check=False)


def test_too_small_disk_is_refused_before_downloading(hub: FakeHub, tmpfs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmpfs("1m")))
    with pytest.raises(hfhub.WeightsError, match=r"not enough disk space for .*: 2\.5 MB still to download "
                                                   r"\(7 files\) .* but only 1\.0 MB free at .*small-disk") as err:
        weights.pull(ck())
    assert "short by" in err.value.message and "HF_HUB_CACHE" in (err.value.hint or "")
    assert not hub.gets()  # refused before a single byte


def test_small_disk_that_fits_is_enough(hub: FakeHub, tmpfs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmpfs("4m")))
    weights.pull(ck())
    assert hfcache.cache_state(REPO).status == "complete"


def test_disk_preflight_at_the_seam_counts_only_what_is_missing(hub: FakeHub) -> None:
    weights.pull(ck())
    snap = hfcache.cache_state(REPO).snapshot
    shard = snap / SHARD1
    blob = shard.resolve()
    shard.unlink()
    blob.unlink()
    missing = len(hub.repos[REPO].files[SHARD1].data)
    with pytest.raises(hfhub.WeightsError, match=r"1\.5 MB still to download \(1 file\)"):
        weights.pull(ck(), free_space=lambda _p: missing)  # no room for the 2 % reserve
    weights.pull(ck(), free_space=lambda _p: missing * 2)
    assert hfcache.cache_state(REPO).status == "complete"


# --- what `list` and `run` see -------------------------------------------------------------------------
def test_list_and_run_preflight_follow_the_cache(hub: FakeHub) -> None:
    from metralectl.core.catalog import load_catalog

    recipe = load_catalog().recipe(FLAGSHIP)
    assert list_weights() == "absent"
    with pytest.raises(hfhub.WeightsError, match=f"weights incomplete: .* is absent .*run `metralectl pull {FLAGSHIP}`"):
        weights.weights_preflight(recipe)
    out = cli("pull", FLAGSHIP, "--weights-only")
    assert out.returncode == 0 and "ready (weights complete at" in out.stdout, out.stderr
    assert list_weights() == "complete"
    weights.weights_preflight(recipe)  # complete: no complaint
    snap = hfcache.cache_state(REPO).snapshot
    (snap / hfcache.VERIFIED_MANIFEST).rename(snap / "manifest.bak")
    assert list_weights() == "present"  # every file there per the listing, but never hashed
    with pytest.raises(hfhub.WeightsError, match="is present"):
        weights.weights_preflight(recipe)
    (snap / "manifest.bak").rename(snap / hfcache.VERIFIED_MANIFEST)
    (snap / SHARD1).unlink()
    assert list_weights() == "partial"
    with pytest.raises(hfhub.WeightsError, match="is partial .*1 of 7 files missing"):
        weights.weights_preflight(recipe)


# --- ownership (SPEC §5: "do not use sudo metralectl") ----------------------------------------------------
needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown/seteuid")
USER_UID = 4242


@pytest.fixture
def user_cache(monkeypatch: pytest.MonkeyPatch):
    """An HF cache owned by a plain user (uid 4242), in a directory that user can reach."""
    root = Path(tempfile.mkdtemp(prefix="metralectl-owner-"))
    root.chmod(0o755)
    home = root / "hf"
    repo = hfcache.repo_dir(REPO, home / "hub")
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / ("a" * 40)).mkdir(parents=True)
    (repo / "blobs" / "userblob").write_text("x")
    for dirpath, dirs, files in os.walk(root):
        for name in [dirpath, *[os.path.join(dirpath, f) for f in files]]:
            os.chown(name, USER_UID, USER_UID)
    monkeypatch.setenv("HF_HOME", str(home))
    yield repo
    subprocess.run(["rm", "-rf", str(root)], check=False)


@needs_root
def test_root_owned_file_in_a_users_cache_is_found_with_the_fix(user_cache: Path, hub: FakeHub) -> None:
    rootfile = user_cache / "blobs" / "from-a-sudo-run"
    rootfile.write_text("x")  # we are root: this file is root's
    os.seteuid(USER_UID)
    try:
        with pytest.raises(hfhub.WeightsError) as err:
            weights.pull(ck())
    finally:
        os.seteuid(0)
    assert "1 path in your Hugging Face cache belongs to root, not to you" in err.value.message
    assert str(rootfile) in err.value.message.replace("~", str(Path.home()))
    assert err.value.hint.startswith(f"sudo chown -R $USER: {user_cache}")
    assert not hub.log  # refused before asking the Hub anything


@needs_root
def test_root_refuses_to_write_into_a_users_cache(user_cache: Path, hub: FakeHub) -> None:
    with pytest.raises(hfhub.WeightsError, match="refusing to download as root into .*belongs to uid 4242"):
        weights.pull(ck())
    assert not hub.log


@needs_root
def test_ownership_scan_reports_other_owners(tmp_path: Path) -> None:
    hub_dir = tmp_path / "env" / "hf" / "hub"
    repo = hfcache.repo_dir(REPO, hub_dir)
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "mine").write_text("x")
    other = repo / "blobs" / "theirs"
    other.write_text("x")
    os.chown(other, USER_UID, USER_UID)
    found = hfsteps.ownership(REPO, hub_dir, uid=0)
    assert found.count == 1 and found.offenders == (other,) and found.fix_path == repo
    assert hfsteps.ownership(REPO, hub_dir, uid=0).fix == f"sudo chown -R $USER: {repo}"


def test_gated_api_as_the_hub_once_answered(hub: FakeHub) -> None:
    hub.repos[REPO].gated = "manual"
    hub.repos[REPO].gate_api = True  # the listing itself is refused (401 GatedRepo on /api/models/...)
    with pytest.raises(hfhub.WeightsError, match="gated repository and no Hugging Face token is set"):
        weights.pull(ck())
    assert not hub.gets()
