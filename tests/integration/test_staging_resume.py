"""Resuming an interrupted `metralectl pull` for real: the CLI in a subprocess, Ctrl-C (SIGINT) while a large
file streams from the fake Hub's CDN (tests/fakehub/server.py, real HTTP on loopback), then the next pull —
asserted on what the server was asked (Range, If-Range) and sent, and on the bytes placed in the cache.

The "stall" fault sends exactly N bytes of the file and then nothing, so the part on disk holds exactly N
bytes when SIGINT arrives: no timing window decides the outcome.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from metralectl.core.progress import human_bytes
from metralectl.seams.hf import cache as hfcache, download as hfdownload, staging as hfstaging
from tests.fakehub.server import FakeHub, FakeRepo

REPO_ROOT = Path(__file__).resolve().parents[2]
FLAGSHIP = "qwen3.5-35b-a3b"
REPO = "Sehyo/Qwen3.5-35B-A3B-NVFP4"
SHARD = "model.safetensors"
SIZE = 18_000_000  # above hfdownload.RESUMABLE_MIN_BYTES: our downloader, not huggingface_hub's
N = 5_000_000  # what the first pull gets before it is interrupted
CONFIG = b'{"model_type": "qwen3_5_moe"}'

pytestmark = pytest.mark.integration


def repo_with(shard: bytes) -> FakeRepo:
    return FakeRepo.build(REPO, {"config.json": CONFIG, SHARD: shard})


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch):
    assert SIZE >= hfdownload.RESUMABLE_MIN_BYTES
    with FakeHub([repo_with(random.Random(7).randbytes(SIZE))]) as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield fake


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=dict(os.environ), timeout=timeout)


def list_weights() -> str:
    out = cli("list", "--json")
    assert out.returncode == 0, out.stderr
    return str(next(r for r in json.loads(out.stdout)["recipes"] if r["name"] == FLAGSHIP)["weights"])


def base() -> Path:
    return hfcache.repo_dir(REPO)


def shard(hub: FakeHub) -> bytes:
    return hub.repos[REPO].files[SHARD].data


def sha(hub: FakeHub) -> str:
    return hub.repos[REPO].files[SHARD].sha256


def part_of(hub: FakeHub) -> Path:
    return hfstaging.partial_folder(base()) / f"{sha(hub)}.part"


def interrupted_pull(hub: FakeHub) -> Path:
    """`metralectl pull` Ctrl-C'd once exactly N bytes of the shard are on disk (config.json finished)."""
    hub.fault(SHARD, "stall", after=N, times=1)
    proc = subprocess.Popen([sys.executable, "-m", "metralectl", "pull", FLAGSHIP, "--weights-only"], cwd=REPO_ROOT,
                            env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    part, config = part_of(hub), hfcache.snapshot_path(REPO, hub.repos[REPO].commit) / "config.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if part.stat().st_size == N and config.exists():
                break
        except OSError:
            pass
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail(f"no part of {N} bytes appeared at {part}: {proc.communicate()}")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert (f"kept {human_bytes(N)} of {human_bytes(SIZE)} of {SHARD}; `metralectl pull {FLAGSHIP}` resumes it"
            in err), err
    assert "Traceback" not in err
    assert part.stat().st_size == N  # kept, not deleted on the way out
    assert part.stat().st_mode & 0o777 == 0o600 and hfstaging.partial_folder(base()).stat().st_mode & 0o777 == 0o700
    hub.clear_faults()
    return part


def cdn_gets(hub: FakeHub, since: int) -> list:
    return [r for r in hub.log[since:] if r.method == "GET" and "/cdn/" in r.path]


def assert_placed(hub: FakeHub) -> None:
    """The verified file sits where huggingface_hub would put it, and nothing of the download is left over."""
    snap = hfcache.snapshot_path(REPO, hub.repos[REPO].commit)
    link = snap / SHARD
    assert link.is_symlink() and link.resolve() == base() / "blobs" / sha(hub)
    assert hashlib.sha256(link.read_bytes()).hexdigest() == sha(hub)
    assert hfstaging.partials_listed(base()) == [] and not part_of(hub).exists()
    assert list_weights() == "complete"


def test_pull_interrupted_by_ctrl_c_resumes_with_a_range_request(hub: FakeHub) -> None:
    interrupted_pull(hub)
    assert list_weights() == "partial"  # a part is never a usable file
    since = len(hub.log)
    out = cli("pull", FLAGSHIP, "--weights-only", "--json")
    assert out.returncode == 0, out.stderr
    gets = cdn_gets(hub, since)
    assert len(gets) == 1, gets
    assert gets[0].range == f"bytes={N}-" and gets[0].status == 206
    assert gets[0].if_range == f'"{sha(hub)}"'  # the ETag that served the first N bytes
    assert gets[0].sent == SIZE - N  # only the rest crossed the wire
    summary = json.loads(out.stdout)["recipes"][0]["weights"]
    assert summary["status"] == "complete" and summary["downloaded_bytes"] == SIZE - N
    assert f"resuming {SHARD} at {human_bytes(N)} of {human_bytes(SIZE)}" in out.stderr
    assert len(hub.gets("/config.json")) == 1  # finished in the first run, not fetched again
    assert_placed(hub)


def test_pull_restarts_from_zero_when_the_server_ignores_range(hub: FakeHub) -> None:
    interrupted_pull(hub)
    hub.ranges = False  # a CDN that answers 200 with the whole body
    since = len(hub.log)
    out = cli("pull", FLAGSHIP, "--weights-only", "--json")
    assert out.returncode == 0, out.stderr
    gets = cdn_gets(hub, since)
    assert [(g.range, g.status, g.sent) for g in gets] == [(f"bytes={N}-", 200, SIZE)]
    assert "the server sent the whole file instead of the rest" in out.stderr and "starting over" in out.stderr
    assert_placed(hub)


def test_pull_restarts_when_if_range_names_an_older_object(hub: FakeHub) -> None:
    part = interrupted_pull(hub)
    meta = part.with_suffix(".json")
    data = json.loads(meta.read_text())
    data["validator"] = '"an-etag-the-cdn-no-longer-serves"'
    meta.write_text(json.dumps(data))
    since = len(hub.log)
    out = cli("pull", FLAGSHIP, "--weights-only")
    assert out.returncode == 0, out.stderr
    gets = cdn_gets(hub, since)
    assert [(g.if_range, g.status, g.sent) for g in gets] == [('"an-etag-the-cdn-no-longer-serves"', 200, SIZE)]
    assert "starting over" in out.stderr
    assert_placed(hub)


def test_pull_discards_the_part_when_the_file_changed_on_the_hub(hub: FakeHub) -> None:
    old = interrupted_pull(hub)
    hub.repos[REPO] = repo_with(random.Random(8).randbytes(SIZE))  # a new commit with another shard
    since = len(hub.log)
    out = cli("pull", FLAGSHIP, "--weights-only")
    assert out.returncode == 0, out.stderr
    assert (f"discarded {human_bytes(N)} of {SHARD} downloaded earlier: the file changed on the Hub"
            in out.stderr), out.stderr
    assert not old.exists() and not old.with_suffix(".json").exists()
    gets = cdn_gets(hub, since)
    assert [(g.range, g.status) for g in gets] == [(None, 200)] and sha(hub) in gets[0].path
    assert_placed(hub)


def test_pull_with_a_corrupted_part_fails_and_places_nothing(hub: FakeHub) -> None:
    part = interrupted_pull(hub)
    with open(part, "r+b") as fh:  # flip bytes in what was kept
        fh.seek(1000)
        byte = fh.read(1)
        fh.seek(1000)
        fh.write(bytes([byte[0] ^ 0xFF]))
    out = cli("pull", FLAGSHIP, "--weights-only")
    assert out.returncode == 1, out.stderr
    assert f"{SHARD}: the downloaded file's sha256 is" in out.stderr and "the Hub lists" in out.stderr
    assert "the partial download was deleted and nothing was placed in the cache" in out.stderr
    assert "Traceback" not in out.stderr
    assert not part.exists() and not (base() / "blobs" / sha(hub)).exists()
    assert not (hfcache.snapshot_path(REPO, hub.repos[REPO].commit) / SHARD).exists()
    assert list_weights() == "partial"
    since = len(hub.log)
    again = cli("pull", FLAGSHIP, "--weights-only")  # the next pull starts afresh and succeeds
    assert again.returncode == 0, again.stderr
    assert [(g.range, g.status) for g in cdn_gets(hub, since)] == [(None, 200)]
    assert_placed(hub)


def test_prune_lists_and_removes_partial_pull_downloads(hub: FakeHub) -> None:
    part = interrupted_pull(hub)
    plan = cli("prune", "--dry-run", "--no-images", "--json")
    assert plan.returncode == 0, plan.stderr
    items = [i for i in json.loads(plan.stdout)["items"] if part.name in i["name"]]
    assert len(items) == 1 and items[0]["kind"] == "download" and items[0]["bytes"] == N, plan.stdout
    assert f"partial {SHARD}" in items[0]["name"] and not items[0]["removed"]
    assert part.exists()  # a dry run removes nothing
    done = cli("prune", "--yes", "--no-images", "--json")
    assert done.returncode == 0, done.stderr
    assert [i["removed"] for i in json.loads(done.stdout)["items"] if part.name in i["name"]] == [True]
    assert not part.exists() and not part.with_suffix(".json").exists()
    since = len(hub.log)
    out = cli("pull", FLAGSHIP, "--weights-only")  # nothing left to resume: from zero
    assert out.returncode == 0, out.stderr
    assert [g.range for g in cdn_gets(hub, since)] == [None]
    assert_placed(hub)


def test_pull_sends_the_token_to_the_hub_but_not_to_the_cdn(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    hub.repos[REPO].gated = "manual"
    hub.repos[REPO].authorized.add("hf_valid")
    monkeypatch.setenv("HF_TOKEN", "hf_valid")
    out = cli("pull", FLAGSHIP, "--weights-only")
    assert out.returncode == 0, out.stderr
    resolves = [r for r in hub.log if r.method == "GET" and f"/resolve/{hub.repos[REPO].commit}/{SHARD}" in r.path]
    assert resolves and all(r.authorized and r.status == 302 for r in resolves)
    cdn = cdn_gets(hub, 0)
    assert cdn and not any(r.authorized for r in cdn)
    assert_placed(hub)


# --- within one run (in-process: weights.pull) ------------------------------------------------------------
def ck() -> object:
    from metralectl.core.recipe import CheckpointRef

    return CheckpointRef(repo=REPO, quant="nvfp4", revision=None)


def test_pull_continues_a_dropped_connection_from_the_bytes_on_disk(hub: FakeHub) -> None:
    from metralectl.seams.hf import weights

    hub.fault(SHARD, "kill", times=2, at=0.5)
    result = weights.pull(ck())
    gets = cdn_gets(hub, 0)
    assert [g.status for g in gets] == [200, 206, 206]
    assert gets[1].range == f"bytes={gets[0].sent}-" and gets[2].range == f"bytes={gets[0].sent + gets[1].sent}-"
    assert sum(g.sent for g in gets) == SIZE  # not a byte fetched twice
    assert result.downloaded_bytes == result.total_bytes
    assert_placed(hub)


def test_pull_of_an_object_of_the_wrong_size_fails_and_places_nothing(hub: FakeHub) -> None:
    from metralectl.seams.hf import hub as hfhub, weights

    hub.fault(SHARD, "truncate")  # the CDN serves half the object
    try:
        weights.pull(ck())
    except hfhub.WeightsError as exc:
        assert f"{SHARD}: the server's object is {SIZE // 2} bytes, the Hub lists {SIZE}" in exc.message
        assert "nothing was placed in the cache" in exc.message
    else:
        pytest.fail("a short object was accepted")
    assert not part_of(hub).exists() and not (base() / "blobs" / sha(hub)).exists()
    assert hfcache.cache_state(REPO).status == "partial"


def test_pull_fetches_one_content_once_for_two_paths(hub: FakeHub) -> None:
    from metralectl.seams.hf import weights

    data = shard(hub)
    hub.repos[REPO] = FakeRepo.build(REPO, {"config.json": CONFIG, SHARD: data, "consolidated.safetensors": data})
    weights.pull(ck())
    assert len(cdn_gets(hub, 0)) == 1
    snap = hfcache.snapshot_path(REPO, hub.repos[REPO].commit)
    assert (snap / SHARD).resolve() == (snap / "consolidated.safetensors").resolve() == base() / "blobs" / sha(hub)
    assert hfcache.cache_state(REPO).status == "complete"


def test_pull_of_a_gguf_quant_resumes_its_file_and_records_the_quant(hub: FakeHub) -> None:
    """A GGUF checkpoint takes the same path: the quant's file is a large LFS file like any shard."""
    from metralectl.core.recipe import CheckpointRef
    from metralectl.seams.hf import weights

    gguf_repo = "org/tiny-GGUF"
    q4 = "tiny-Q4_K_M.gguf"
    data = random.Random(9).randbytes(SIZE)
    hub.repos[gguf_repo] = FakeRepo.build(gguf_repo, {q4: data, "tiny-Q8_0.gguf": b"q8" * 100})
    hub.fault(q4, "kill", times=1, at=0.5)
    checkpoint = CheckpointRef(repo=gguf_repo, quant="Q4_K_M", revision=None, format="gguf")
    result = weights.pull(checkpoint)
    gets = [g for g in cdn_gets(hub, 0) if hashlib.sha256(data).hexdigest() in g.path]
    assert [(g.status, g.range) for g in gets] == [(200, None), (206, f"bytes={gets[0].sent}-")]
    assert result.paths == (q4,) and result.quant == "Q4_K_M"
    snap = hfcache.snapshot_path(gguf_repo, hub.repos[gguf_repo].commit)
    assert (snap / q4).read_bytes() == data and not (snap / "tiny-Q8_0.gguf").exists()
    assert weights.state(checkpoint).status == "complete"
