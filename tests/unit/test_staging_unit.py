"""Staging logic without network or Docker: cache states from hand-built caches, the platform rule,
image pulls over a fake runtime, error translation, byte accounting, and the import budget."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from metralectl.seams.hf import cache as hfcache, hub as hfhub, staging as hfstaging, steps as hfsteps

from metralectl.core import images
from metralectl.seams.docker import images as docker_images
from metralectl.core.image_info import ImageInfo
from metralectl.seams.hf.listing import Listing, RepoFile
from metralectl.core.progress import Meter, human_bytes, human_duration
from tests.fakes.runtime import FakeRuntime, image as local_image

REPO_ROOT = Path(__file__).resolve().parents[2]
REPO = "org/model"
COMMIT = "c" * 40


def hub() -> Path:
    return Path(os.environ["HF_HOME"]) / "hub"


def make_snapshot(files: dict[str, bytes], commit: str = COMMIT, ref: bool = True) -> Path:
    """A cache laid out as huggingface_hub leaves it: blobs named by etag, snapshot symlinks, refs/main."""
    base = hfcache.repo_dir(REPO)
    snap = base / "snapshots" / commit
    (base / "blobs").mkdir(parents=True, exist_ok=True)
    for path, data in files.items():
        blob = base / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / path).parent.mkdir(parents=True, exist_ok=True)
        (snap / path).symlink_to(os.path.relpath(blob, (snap / path).parent))
    if ref:
        (base / "refs").mkdir(exist_ok=True)
        (base / "refs" / "main").write_text(commit)
    return snap


def listing_of(files: dict[str, bytes], commit: str = COMMIT) -> Listing:
    return Listing(REPO, commit, tuple(RepoFile(p, len(d), hashlib.sha256(d).hexdigest()) for p, d in files.items()))


FILES = {"config.json": b"{}", "model.safetensors": b"x" * 1000, "sub/params.json": b"{\"a\": 1}"}


# --- cache states ---------------------------------------------------------------------------------------
def test_absent_and_started_but_empty() -> None:
    assert hfcache.cache_state(REPO).status == "absent"
    blobs = hfcache.repo_dir(REPO) / "blobs"
    blobs.mkdir(parents=True)
    assert hfcache.cache_state(REPO).status == "absent"
    (blobs / "abc.1234.incomplete").write_bytes(b"x")
    assert hfcache.cache_state(REPO).status == "partial"


def test_manifest_makes_complete_and_damage_makes_partial() -> None:
    snap = make_snapshot(FILES)
    hfcache.write_json_atomic(snap / hfcache.VERIFIED_MANIFEST, listing_of(FILES).to_json())
    state = hfcache.cache_state(REPO)
    assert state.status == "complete" and state.files_total == 3 and state.bytes_present == 1010
    stale = hfcache.repo_dir(REPO) / "blobs" / "other.5678.incomplete"
    stale.write_bytes(b"x")  # an unrelated dead download does not make a verified snapshot unusable
    assert hfcache.cache_state(REPO).status == "complete"
    (snap / "model.safetensors").resolve().write_bytes(b"x" * 999)  # a blob changed size after verification
    state = hfcache.cache_state(REPO)
    assert state.status == "partial" and "1 of 3 files missing or changed" in state.detail


def test_manifest_for_another_commit_is_ignored() -> None:
    snap = make_snapshot(FILES)
    hfcache.write_json_atomic(snap / hfcache.VERIFIED_MANIFEST, listing_of(FILES, "d" * 40).to_json())
    assert hfcache.cache_state(REPO).status == "present"  # heuristics: config + safetensors, unverified


def test_expected_listing_tells_partial_from_present() -> None:
    snap = make_snapshot({k: v for k, v in FILES.items() if k != "model.safetensors"})
    hfcache.write_json_atomic(snap / hfcache.EXPECTED_LISTING, listing_of(FILES).to_json())
    state = hfcache.cache_state(REPO)
    assert state.status == "partial" and state.detail.startswith("2 of 3 files")
    make_snapshot({"model.safetensors": FILES["model.safetensors"]})
    assert hfcache.cache_state(REPO).status == "present"


def test_huggingface_hub_tree_cache_is_a_listing_too() -> None:
    make_snapshot({"config.json": b"{}", "a.safetensors": b"1"})
    trees = hfcache.repo_dir(REPO) / "trees"
    trees.mkdir()
    (trees / f"{COMMIT}.json").write_text(json.dumps({"format_version": 1, "files": {
        "config.json": {"size": 2, "blob_id": "x"}, "a.safetensors": {"size": 1, "blob_id": "y"},
        "b.safetensors": {"size": 5, "blob_id": "z", "lfs_sha256": "0" * 64, "lfs_size": 5}}}))
    state = hfcache.cache_state(REPO)
    assert state.status == "partial" and state.files_total == 3 and state.files_present == 2


def test_pinned_revision_and_refs_main() -> None:
    make_snapshot(FILES, commit=COMMIT)
    make_snapshot(FILES, commit="e" * 40, ref=False)
    assert hfcache.cache_state(REPO).commit == COMMIT  # refs/main decides for an unpinned recipe
    assert hfcache.cache_state(REPO, "e" * 40).snapshot.name == "e" * 40
    assert hfcache.cache_state(REPO, "f" * 40).status == "absent"


def test_missing_counts_finished_blobs_as_present() -> None:
    base = hfcache.repo_dir(REPO)
    (base / "blobs").mkdir(parents=True)
    data = FILES["model.safetensors"]
    (base / "blobs" / hashlib.sha256(data).hexdigest()).write_bytes(data)  # blob done, symlink not yet made
    todo = hfcache.missing(base, COMMIT, listing_of(FILES))
    assert [f.path for f in todo] == ["config.json", "sub/params.json"]


# --- ownership -----------------------------------------------------------------------------------------
def test_ownership_names_the_smallest_folder_to_chown() -> None:
    snap = make_snapshot(FILES)
    me = os.geteuid()
    assert hfsteps.ownership(REPO, hub(), uid=me).ok
    other = hfsteps.ownership(REPO, hub(), uid=me + 1)  # everything looks foreign to another uid
    assert other.count > 5 and other.fix_path == Path(os.environ["HF_HOME"])
    assert other.fix == f"sudo chown -R $USER: {os.environ['HF_HOME']}"
    assert "not to you" in other.describe() and snap.exists()


# --- hashing and accounting ----------------------------------------------------------------------------------
def test_file_problem_checks_size_sha256_and_git_oid(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"hello")
    sha = hashlib.sha256(b"hello").hexdigest()
    oid = hashlib.sha1(b"blob 5\0hello").hexdigest()
    assert hfstaging.file_problem(f, RepoFile("f", 5, sha)) is None
    assert hfstaging.file_problem(f, RepoFile("f", 5, git_oid=oid)) is None
    assert "sha256" in hfstaging.file_problem(f, RepoFile("f", 5, "0" * 64))
    assert "git blob id" in hfstaging.file_problem(f, RepoFile("f", 5, git_oid="0" * 40))
    assert hfstaging.file_problem(f, RepoFile("f", 6, sha)) == "size 5 bytes, the Hub lists 6"
    assert hfstaging.file_problem(tmp_path / "nope", RepoFile("nope", 1)) == "missing"


def test_meter_rate_and_eta() -> None:
    now = [0.0]
    meter = Meter(total=1000, done=100, clock=lambda: now[0])
    assert meter.reading().rate_bps is None
    now[0] = 2.0
    meter.add(200)
    reading = meter.reading()
    assert reading.rate_bps == pytest.approx(100.0) and reading.eta_s == pytest.approx(7.0)
    assert reading.fraction == pytest.approx(0.3)
    assert human_bytes(2_500_308) == "2.5 MB" and human_bytes(12) == "12 B" and human_duration(3725) == "1h02m"


def test_parallel_reports_the_real_failure_first() -> None:
    ticks = []
    cancel = threading.Event()

    def work(i: int) -> None:
        if i == 3:
            raise ValueError("boom")
        if cancel.wait(2):
            raise hfstaging.Cancelled()

    failures = hfstaging.parallel(list(range(6)), work, 3, lambda: ticks.append(1), cancel)
    assert isinstance(failures[0][1], ValueError) and cancel.is_set()


# --- error translation ---------------------------------------------------------------------------------------
def _http_error(name: str, status: int, server_message: str | None = None, base: type = OSError) -> BaseException:
    cls = type(name, (base,), {})
    exc = cls(f"{status} Client Error")
    exc.response = SimpleNamespace(status_code=status)
    exc.server_message = server_message
    return exc


def test_hub_errors_become_remedies() -> None:
    repo_not_found = type("RepositoryNotFoundError", (OSError,), {})
    gated = _http_error("GatedRepoError", 401, base=repo_not_found)
    msg = hfhub.hub_error(gated, REPO, "main", token=False)
    assert "gated repository and no Hugging Face token" in str(msg) and "HF_TOKEN" in msg.hint
    assert "not been granted access" in str(hfhub.hub_error(gated, REPO, "main", token=True))
    bad = _http_error("HfHubHTTPError", 401, "Invalid credentials in Authorization header")
    assert "token was refused" in str(hfhub.hub_error(bad, REPO, "main", token=True))
    missing = _http_error("RepositoryNotFoundError", 401)
    assert "no repository org/model" in str(hfhub.hub_error(missing, REPO, "main", token=False))
    rev = _http_error("RevisionNotFoundError", 404)
    assert "has no revision abc" in str(hfhub.hub_error(rev, REPO, "abc", token=False))
    connect = type("ConnectError", (Exception,), {})("refused")
    wrapped = type("LocalEntryNotFoundError", (FileNotFoundError,), {})("cannot find")
    wrapped.__cause__ = connect
    net = hfhub.hub_error(wrapped, REPO, "main", token=False, endpoint="http://mirror")
    assert net.network and "cannot reach the Hugging Face Hub at http://mirror" in str(net)
    short = hfhub.hub_error(OSError("Consistency check failed: file should be of size 5"), REPO, "c",
                                     token=False, file="a.bin")
    assert "org/model/a.bin: the download ended at a different size" in str(short)
    odd = KeyError("x")
    assert hfhub.hub_error(odd, REPO, "main", token=False) is odd  # not ours to explain: a bug


def test_weights_preflight_names_the_pull_command() -> None:
    from metralectl.seams.hf import hub as hfhub, weights
    recipe = SimpleNamespace(name="my-recipe", checkpoint=SimpleNamespace(repo=REPO, revision=None))
    with pytest.raises(hfhub.WeightsError, match="weights incomplete: org/model is absent .*`metralectl pull my-recipe`"):
        weights.weights_preflight(recipe)
    snap = make_snapshot(FILES)
    hfcache.write_json_atomic(snap / hfcache.VERIFIED_MANIFEST, listing_of(FILES).to_json())
    weights.weights_preflight(recipe)


# --- images ----------------------------------------------------------------------------------------------------
def image(platform: str, hardware: str = "gb10", build: str | None = None) -> ImageInfo:
    return ImageInfo(id="img", ref="metrale/img:latest", engine="metrale", hardware=(hardware,), platform=platform,
                     min_cuda=None, min_driver=None, revision_label="org.opencontainers.image.revision", build=build)


def state(present: bool, platform: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(present=present, platform=platform, image_id="sha256:1" if present else None,
                           revision="r1" if present else None, digests=("metrale/img@sha256:2",) if present else ())


@pytest.mark.parametrize("arch,declared,local,refused", [
    ("aarch64", "linux/arm64", None, None),
    ("aarch64", "linux/arm64", "linux/arm64/v8", None),
    ("aarch64", "linux/amd64", None, "built for linux/amd64 (hopper); this machine is linux/arm64 (aarch64)"),
    ("x86_64", "linux/arm64", "linux/arm64", "built for linux/arm64 (hopper); this machine is linux/amd64 (x86_64)"),
    ("aarch64", "linux/arm64", "linux/amd64", "the local metrale/img:latest is a linux/amd64 image"),
])
def test_check_platform(arch: str, declared: str, local: str | None, refused: str | None) -> None:
    problem = images.check_platform(state(local is not None, local), image(declared, "hopper"), arch)
    assert (problem is None) == (refused is None)
    if refused:
        assert refused in problem.message


def registry(present: bool, platform: str = "linux/arm64") -> FakeRuntime:
    """A daemon with metrale/img:latest here (or not) that can pull it from its registry."""
    ref = "metrale/img:latest"
    return FakeRuntime(images=[local_image(ref, platform)] if present else [], pullable=[local_image(ref, platform)])


def test_image_pull_over_a_fake_runtime() -> None:
    rt = registry(present=False)
    events: list[images.LayerProgress] = []
    result = docker_images.pull(image("linux/arm64"), rt, "aarch64", events.append)
    assert result.action == "pulled" and rt.pulls == [("metrale/img:latest", "linux/arm64")]
    assert [(e.layer, e.status) for e in events][:2] == [("abc123", "Downloading"), ("abc123", "Pull complete")]
    assert result.status.revision == "r1" and result.status.digest == "metrale/img@sha256:2"
    assert docker_images.pull(image("linux/arm64"), rt, "aarch64").action == "present" and len(rt.pulls) == 1
    assert docker_images.pull(image("linux/arm64"), rt, "aarch64", update=True).action == "pulled"
    with pytest.raises(images.ImageError, match="cannot be pulled: it is built from source"):
        docker_images.pull(image("linux/amd64", build="docker build ..."), registry(False), "x86_64")
    wrong = registry(present=False)
    with pytest.raises(images.ImageError, match="built for linux/amd64"):
        docker_images.pull(image("linux/amd64"), wrong, "aarch64")
    assert wrong.pulls == []  # refused before pulling anything


def test_image_statuses_without_docker_list_recipes() -> None:
    from metralectl.core.catalog import load_catalog

    rows = {r.info.id: r for r in docker_images.statuses(load_catalog(), None, "aarch64")}
    gb10 = rows["metrale-inference-gb10"]
    assert gb10.present is None and "qwen3.5-35b-a3b" in gb10.recipes and gb10.problem is None
    assert "this machine is linux/arm64" in rows["metrale-inference-hopper"].problem


# --- import budget ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["pull", "--help"], ["images", "--help"], ["list"]])
def test_staging_commands_load_nothing_heavy_until_used(argv: list[str]) -> None:
    code = ("import sys, runpy\n"
            f"sys.argv = ['metralectl', *{argv!r}]\n"
            "try:\n    runpy.run_module('metralectl', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "heavy = ('huggingface_hub', 'rich', 'docker', 'httpx')\n"
            "print('HEAVY=' + ','.join(m for m in heavy if m in sys.modules), file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert out.stderr.rstrip().endswith("HEAVY="), out.stderr
