"""GGUF checkpoints: `pull` fetches and verifies only the quant's files, the manifest holds several quants,
and the cache state, preflight and CLI judge a quant by its own files.

The Hub is tests/fakehub (real HTTP on 127.0.0.1) and the download code is huggingface_hub's own, as in
tests/integration/test_staging.py. The repository mirrors an Unsloth GGUF repo: three quants (one a
split of two parts in a folder named after it), a multimodal projector, an imatrix, a router preset and
a README — of which a quant needs its model file(s) only. The rule that picks them is llama.cpp's
(`-hf REPO:QUANT`); tests/integration/test_gguf_llamacpp_real.py holds it against the real llama-server.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from metralectl.core.recipe import CheckpointRef
from metralectl.errors import ExitCode
from metralectl.seams.hf import cache as hfcache, gguf as hfgguf, hub as hfhub, state as hfstate, steps as hfsteps, weights
from metralectl.seams.hf.listing import RepoFile
from tests.fakehub.server import FakeHub, FakeRepo

REPO_ROOT = Path(__file__).resolve().parents[2]
REPO = "unsloth/Qwen3.5-35B-A3B-GGUF"  # the shipped llama.cpp recipe's repository
RECIPE = "qwen3.5-35b-a3b-llamacpp"  # quant UD-Q4_K_XL
STEM = "Qwen3.5-35B-A3B"
SPLIT = (f"UD-Q4_K_XL/{STEM}-UD-Q4_K_XL-00001-of-00002.gguf", f"UD-Q4_K_XL/{STEM}-UD-Q4_K_XL-00002-of-00002.gguf")
Q4 = f"{STEM}-Q4_K_M.gguf"
Q8 = f"{STEM}-Q8_0.gguf"
OTHERS = ("README.md", "config.json", "preset.ini", "mmproj-F16.gguf", "imatrix_unsloth.gguf")


def _bytes(label: str, size: int) -> bytes:
    seed = hashlib.sha256(label.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def repo_files() -> dict[str, bytes]:
    sizes = {SPLIT[0]: 40_000, SPLIT[1]: 35_000, Q4: 50_000, Q8: 90_000, "README.md": 300, "config.json": 40,
             "preset.ini": 20, "mmproj-F16.gguf": 30_000, "imatrix_unsloth.gguf": 2_000}
    return {path: _bytes(path, size) for path, size in sizes.items()}


def serve(*repos: FakeRepo) -> Iterator[FakeHub]:
    with FakeHub(list(repos)) as fake:
        mp = pytest.MonkeyPatch()
        mp.setenv("HF_ENDPOINT", fake.endpoint)
        mp.setenv("HF_HUB_DISABLE_XET", "1")
        mp.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        mp.delenv("HF_TOKEN", raising=False)
        mp.delenv("HF_HUB_OFFLINE", raising=False)
        try:
            yield fake
        finally:
            mp.undo()


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    yield from serve(FakeRepo.build(REPO, repo_files()))


def ck(quant: str, revision: str | None = None) -> CheckpointRef:
    return CheckpointRef(repo=REPO, quant=quant, revision=revision, format="gguf")


def fetched(hub: FakeHub) -> set[str]:
    """The repository paths whose content was downloaded (the resolve URL or the CDN object of its sha256)."""
    files = hub.repos[REPO].files
    gets = [r.path for r in hub.gets()]
    return {p for p, f in files.items() if any(g.endswith("/" + p) or f.sha256 in g for g in gets)}


def snapshot(hub: FakeHub) -> Path:
    return hfcache.snapshot_path(REPO, hub.repos[REPO].commit)


def manifest(hub: FakeHub) -> dict:  # type: ignore[type-arg]
    return json.loads((snapshot(hub) / hfcache.VERIFIED_MANIFEST).read_text())


# --- llama.cpp's naming rule -------------------------------------------------------------------------------
@pytest.mark.parametrize("path, quant, hit", [
    (f"{STEM}-Q4_K_M.gguf", "Q4_K_M", True),
    (f"{STEM}-q4_k_m.gguf", "Q4_K_M", True),  # case-insensitive
    (f"{STEM}.Q4_K_M-00001-of-00003.gguf", "Q4_K_M", True),  # followed by `-`
    (f"{STEM}-Q4_K_M.gguf", "Q4_K", False),  # Q4_K is followed by `_`, not `.` or `-`
    (f"{STEM}-UD-Q4_K_XL.gguf", "Q4_K_XL", True),  # llama.cpp searches the whole path
    ("mmproj-Q8_0.gguf", "Q8_0", False),  # a sidecar is never the model
    (f"{STEM}-Q8_0.bin", "Q8_0", False),
])
def test_which_file_a_quant_names(path: str, quant: str, hit: bool) -> None:
    assert hfgguf.matches(path, quant) is hit


def test_quants_are_named_from_the_files_with_parts_and_sizes() -> None:
    files = [RepoFile(p, len(d)) for p, d in repo_files().items()]
    assert [m.label for m in hfgguf.models(files)] == ["Q4_K_M", "Q8_0", "UD-Q4_K_XL"]  # no mmproj, no imatrix
    assert hfgguf.available(files) == "Q4_K_M (50.0 kB), Q8_0 (90.0 kB), UD-Q4_K_XL (2 parts, 75.0 kB)"
    split = hfgguf.select(REPO, "c" * 40, files, "ud-q4_k_xl")
    assert [f.path for f in split.parts] == list(SPLIT) and split.first == SPLIT[0]


def test_an_exact_name_wins_and_a_true_tie_is_refused() -> None:
    files = [RepoFile(f"{STEM}-Q4_K_XL.gguf", 10), RepoFile(f"{STEM}-UD-Q4_K_XL.gguf", 20)]
    assert hfgguf.select(REPO, "c" * 40, files, "Q4_K_XL").first == f"{STEM}-Q4_K_XL.gguf"
    assert hfgguf.select(REPO, "c" * 40, files, "UD-Q4_K_XL").first == f"{STEM}-UD-Q4_K_XL.gguf"
    twins = [RepoFile(f"a/{STEM}-Q8_0.gguf", 1), RepoFile(f"b/{STEM}-Q8_0.gguf", 1)]
    with pytest.raises(hfhub.WeightsError, match=r"quant Q8_0 is ambiguous .* 2 models \(a/.*, b/.*\)") as err:
        hfgguf.select(REPO, "c" * 40, twins, "Q8_0")
    assert err.value.exit_code == ExitCode.DATA


def test_a_split_the_listing_lacks_a_part_of_is_refused() -> None:
    files = [RepoFile(SPLIT[0], 10)]
    with pytest.raises(hfhub.WeightsError, match=r"lists only 1 of the 2 parts of UD-Q4_K_XL/"):
        hfgguf.select(REPO, "c" * 40, files, "UD-Q4_K_XL")


# --- pull over HTTP -----------------------------------------------------------------------------------------
def test_pull_fetches_and_verifies_only_the_quants_files(hub: FakeHub) -> None:
    events: list[hfsteps.PullEvent] = []
    result = weights.pull(ck("UD-Q4_K_XL"), events.append)
    assert fetched(hub) == set(SPLIT)  # not the other quants, not mmproj/imatrix/preset/README
    data = repo_files()
    assert result.files == 2 and result.total_bytes == result.downloaded_bytes == len(data[SPLIT[0]]) + len(data[SPLIT[1]])
    assert result.paths == SPLIT and result.to_json()["format"] == "gguf" and result.to_json()["quant"] == "UD-Q4_K_XL"
    snap = snapshot(hub)
    assert sorted(p.relative_to(snap).as_posix() for p in snap.rglob("*.gguf")) == sorted(SPLIT)
    assert not any((snap / name).exists() for name in OTHERS)
    assert (snap / SPLIT[1]).read_bytes() == data[SPLIT[1]]
    size_note = next(e.message for e in events if e.phase == "note" and "UD-Q4_K_XL:" in e.message)
    assert "2 files, 75.0 kB" in size_note and "holds 6 .gguf files" in size_note  # shown before downloading
    phases = [e.phase for e in events]
    assert phases.index("note") < phases.index("download") < phases.index("verify") < phases.index("done")
    assert manifest(hub)["subsets"] == {"UD-Q4_K_XL": list(SPLIT)}
    assert {f["path"] for f in manifest(hub)["files"]} == set(SPLIT)

    state = hfstate.checkpoint_state(ck("UD-Q4_K_XL"))
    assert state.status == "complete" and state.files_total == 2 and state.paths == SPLIT
    assert hfstate.checkpoint_state(ck("Q4_K_M")).status == "absent"
    # the whole snapshot is not what was verified: a safetensors-style judgement does not call it complete
    assert hfcache.cache_state(REPO).status == "partial"

    before = len(hub.gets())
    again = weights.pull(ck("UD-Q4_K_XL"))
    assert again.already_complete and again.downloaded_bytes == 0 and len(hub.gets()) == before


def test_a_second_quant_adds_to_the_manifest_and_keeps_the_first(hub: FakeHub) -> None:
    weights.pull(ck("UD-Q4_K_XL"))
    first = manifest(hub)
    n_gets = len(hub.gets())
    result = weights.pull(ck("Q4_K_M"))
    assert result.files == 1 and result.paths == (Q4,)
    assert fetched(hub) == {*SPLIT, Q4}
    assert not [r for r in hub.gets()[n_gets:] if any(p in r.path for p in SPLIT)]  # the split is not fetched again
    second = manifest(hub)
    assert second["subsets"] == {"Q4_K_M": [Q4], "UD-Q4_K_XL": list(SPLIT)}
    assert [f for f in second["files"] if f["path"] in SPLIT] == [f for f in first["files"]]
    for quant in ("UD-Q4_K_XL", "Q4_K_M"):
        assert hfstate.checkpoint_state(ck(quant)).status == "complete"
    assert hfstate.checkpoint_state(ck("Q8_0")).status == "absent"
    assert not list(snapshot(hub).glob(f".{hfcache.VERIFIED_MANIFEST}*.tmp"))  # atomic writes leave no temp file


def test_a_failed_second_quant_leaves_the_first_verified(hub: FakeHub) -> None:
    weights.pull(ck("UD-Q4_K_XL"))
    hub.fault(Q8, "corrupt")
    with pytest.raises(hfhub.WeightsError, match="failed verification"):
        weights.pull(ck("Q8_0"))
    assert manifest(hub)["subsets"] == {"UD-Q4_K_XL": list(SPLIT)}
    assert hfstate.checkpoint_state(ck("UD-Q4_K_XL")).status == "complete"
    assert hfstate.checkpoint_state(ck("Q8_0")).status in ("absent", "partial")
    hub.clear_faults()
    assert not weights.pull(ck("Q8_0")).already_complete
    assert hfstate.checkpoint_state(ck("Q8_0")).status == "complete"


def test_without_the_hub_a_verified_quant_is_kept_and_a_pinned_one_needs_no_network(hub: FakeHub) -> None:
    commit = hub.repos[REPO].commit
    weights.pull(ck("UD-Q4_K_XL"))
    weights.pull(ck("Q8_0", commit))
    hub.stop()
    kept = weights.pull(ck("UD-Q4_K_XL"))  # unpinned: asks for main, cannot, keeps the verified quant
    assert kept.already_complete and not kept.checked_hub and kept.paths == SPLIT and "unreachable" in kept.notes[0]
    pinned = weights.pull(ck("Q8_0", commit))
    assert pinned.already_complete and not pinned.checked_hub and not pinned.notes and pinned.paths == (Q8,)
    with pytest.raises(hfhub.WeightsError, match="cannot reach the Hugging Face Hub"):
        weights.pull(ck("Q4_K_M"))  # never pulled: nothing to keep


def test_a_quant_the_repository_lacks_is_refused_with_the_quants_it_has(hub: FakeHub) -> None:
    with pytest.raises(hfhub.WeightsError) as err:
        weights.pull(ck("IQ2_XXS"))
    message = str(err.value)
    assert f"{REPO}@{hub.repos[REPO].commit[:12]} has no .gguf file for quant IQ2_XXS" in message
    assert "Q4_K_M (50.0 kB), Q8_0 (90.0 kB), UD-Q4_K_XL (2 parts, 75.0 kB)" in message
    assert "checkpoint.quant" in (err.value.hint or "") and err.value.exit_code == ExitCode.DATA
    assert not fetched(hub) and not (snapshot(hub) / hfcache.VERIFIED_MANIFEST).exists()


def test_damage_to_one_quant_leaves_the_other_complete(hub: FakeHub) -> None:
    weights.pull(ck("UD-Q4_K_XL"))
    weights.pull(ck("Q4_K_M"))
    (snapshot(hub) / SPLIT[1]).unlink()
    state = hfstate.checkpoint_state(ck("UD-Q4_K_XL"))
    assert state.status == "partial" and "1 of 2 files of UD-Q4_K_XL missing" in state.detail
    assert hfstate.checkpoint_state(ck("Q4_K_M")).status == "complete"
    blob = hfcache.repo_dir(REPO) / "blobs" / hub.repos[REPO].files[SPLIT[0]].sha256
    blob.write_bytes(blob.read_bytes()[:-1])  # and the other part's content shrank
    state = hfstate.checkpoint_state(ck("UD-Q4_K_XL"))
    assert state.status == "partial" and "2 of 2 files of UD-Q4_K_XL missing or changed" in state.detail
    n_gets = len(hub.gets())
    weights.pull(ck("UD-Q4_K_XL"))  # re-links the part whose blob is whole, fetches the damaged one
    assert hfstate.checkpoint_state(ck("UD-Q4_K_XL")).status == "complete"
    again = [r.path for r in hub.gets()[n_gets:]]
    assert any(SPLIT[0] in g or hub.repos[REPO].files[SPLIT[0]].sha256 in g for g in again)
    assert not any(SPLIT[1] in g or hub.repos[REPO].files[SPLIT[1]].sha256 in g for g in again)


@pytest.mark.parametrize("gguf_quant", ["Q8_0", None])
def test_a_lost_link_to_a_finished_blob_is_restored_not_failed(hub: FakeHub, gguf_quant: str | None) -> None:
    """A download killed between huggingface_hub's blob rename and its symlink: the blob is whole, the link
    missing. Counted as present, it was never fetched again, and every later pull failed verification."""
    target = ck(gguf_quant) if gguf_quant else CheckpointRef(repo=REPO, quant="x", revision=None)
    weights.pull(target)
    (snapshot(hub) / Q8).unlink()
    assert hfstate.checkpoint_state(target).status == "partial"
    result = weights.pull(target)
    assert not result.already_complete and result.downloaded_bytes == 0
    assert hfstate.checkpoint_state(target).status == "complete"


# --- preflight ----------------------------------------------------------------------------------------------
def _recipe(quant: str, revision: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(name="my-gguf", checkpoint=ck(quant, revision))


def test_preflight_refuses_a_missing_quant_when_another_is_complete(hub: FakeHub) -> None:
    weights.pull(ck("Q8_0"))
    with pytest.raises(hfhub.WeightsError, match=rf"weights incomplete: {REPO}:UD-Q4_K_XL is absent .*"
                                                   r"`metralectl pull my-gguf`"):
        weights.weights_preflight(_recipe("UD-Q4_K_XL"))
    weights.weights_preflight(_recipe("Q8_0"))


def test_launch_and_swap_facts_follow_the_quant(hub: FakeHub) -> None:
    """preflight.observe on the shipped llama.cpp recipe: another quant complete is not its weights."""
    from metralectl.core.catalog import load_catalog
    from metralectl.core.render import spec_for
    from metralectl.lifecycle.launch import LaunchOptions
    from metralectl.lifecycle.preflight import observe, staging_refusal
    from tests.fakes.runtime import FakeRuntime, image

    catalog = load_catalog()
    recipe = catalog.recipe(RECIPE)
    assert recipe.checkpoint.format == "gguf" and recipe.checkpoint.repo == REPO
    spec = spec_for(catalog, recipe)
    info = catalog.image_for(recipe)
    runtime = FakeRuntime(images=[image(info.ref, "linux/arm64")])  # the image is here: only the weights count

    def facts_now() -> Any:
        return observe(recipe, catalog, runtime, spec, cpu_arch="aarch64")  # type: ignore[arg-type]

    weights.pull(ck("Q8_0"))
    facts = facts_now()
    assert facts.image_error is None
    assert facts.weights_status == "absent" and facts.weights_error is not None
    assert "UD-Q4_K_XL is absent" in facts.weights_error.message
    refused = staging_refusal(LaunchOptions(pull=False), facts)
    assert refused is not None and refused.fix == "pull-weights"
    assert staging_refusal(LaunchOptions(pull=True), facts) is None  # staging would pull it
    weights.pull(recipe)
    facts = facts_now()
    assert facts.weights_status == "complete" and facts.weights_error is None


def test_preflight_refuses_a_cache_where_llama_server_could_pick_another_file(hub: FakeHub) -> None:
    weights.pull(ck("Q4_K_M"))
    weights.weights_preflight(_recipe("Q4_K_M"))
    stray = snapshot(hub) / "extra" / f"{STEM}-Q4_K_M.gguf"  # e.g. left by another tool
    stray.parent.mkdir()
    stray.write_bytes(b"GGUF")
    with pytest.raises(weights.ServingConflict, match=r"could load extra/Qwen3.5-35B-A3B-Q4_K_M.gguf instead"):
        weights.weights_preflight(_recipe("Q4_K_M"))


def test_a_pinned_quant_needs_refs_main_to_name_its_commit(hub: FakeHub) -> None:
    """`-hf` takes no revision: llama-server reads the snapshot refs/main names."""
    commit = hub.repos[REPO].commit
    result = weights.pull(ck("Q8_0", commit))
    refs_main = hfcache.repo_dir(REPO) / "refs" / "main"
    assert result.revision == commit and refs_main.read_text() == commit  # no ref named any snapshot
    weights.weights_preflight(_recipe("Q8_0", commit))
    refs_main.write_text("f" * 40)  # an unpinned pull of a newer main moved it
    with pytest.raises(weights.ServingConflict, match=r"refs/main names ffffffffffff") as err:
        weights.weights_preflight(_recipe("Q8_0", commit))
    assert commit in (err.value.hint or "")
    notes = weights.pull(ck("Q4_K_M", commit)).notes
    assert refs_main.read_text() == "f" * 40 and "not this pinned commit" in notes[0]  # said, not overwritten


def test_a_manifest_entry_naming_unverified_files_vouches_for_nothing(hub: FakeHub) -> None:
    weights.pull(ck("Q8_0"))
    path = snapshot(hub) / hfcache.VERIFIED_MANIFEST
    data = json.loads(path.read_text())
    data["subsets"]["Q4_K_M"] = [Q4]  # a hand-edited or foreign entry: Q4 is not among the verified files
    path.write_text(json.dumps(data))
    assert hfstate.checkpoint_state(ck("Q4_K_M")).status == "absent"
    assert hfstate.checkpoint_state(ck("Q8_0")).status == "complete"


def test_a_whole_snapshot_manifest_vouches_for_every_quant(hub: FakeHub) -> None:
    whole = weights.pull(CheckpointRef(repo=REPO, quant="x", revision=None))  # safetensors-style: every file
    assert whole.files == len(repo_files()) and whole.quant is None and "paths" not in whole.to_json()
    for quant in ("UD-Q4_K_XL", "Q4_K_M", "Q8_0"):
        assert hfstate.checkpoint_state(ck(quant)).status == "complete"
    n_gets = len(hub.gets())
    assert weights.pull(ck("Q8_0")).already_complete and len(hub.gets()) == n_gets
    assert hfgguf.read_verified(snapshot(hub)).subsets is None  # type: ignore[union-attr]
    (snapshot(hub) / Q4).unlink()  # a quant pulled afresh turns the manifest into one of quants ...
    weights.pull(ck("Q4_K_M"))
    assert set(manifest(hub)["subsets"]) == {"Q4_K_M", "Q8_0", "UD-Q4_K_XL"}  # ... keeping what it vouched for
    for quant in ("UD-Q4_K_XL", "Q4_K_M", "Q8_0"):
        assert hfstate.checkpoint_state(ck(quant)).status == "complete"


# --- the CLI ------------------------------------------------------------------------------------------------
def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=dict(os.environ), timeout=120)


def test_cli_pull_json_show_and_list_speak_of_the_quant(hub: FakeHub) -> None:
    out = cli("pull", RECIPE, "--weights-only", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)["recipes"][0]["weights"]
    assert got["format"] == "gguf" and got["quant"] == "UD-Q4_K_XL" and got["paths"] == list(SPLIT)
    assert got["files"] == 2 and got["total_bytes"] == 75_000
    assert f"weights {REPO}:UD-Q4_K_XL complete at" in out.stderr and "2 files, 75.0 kB" in out.stderr
    assert fetched(hub) == set(SPLIT)
    for _ in range(2):  # computed, then from list's row cache (whose weights are read anew)
        listed = json.loads(cli("list", "--json").stdout)["recipes"]
        assert next(r for r in listed if r["name"] == RECIPE)["weights"] == "complete"
        assert any(p.name.startswith("library-") for p in Path(os.environ["METRALECTL_CACHE_DIR"]).iterdir())
    (snapshot(hub) / SPLIT[1]).unlink()
    listed = json.loads(cli("list", "--json").stdout)["recipes"]
    assert next(r for r in listed if r["name"] == RECIPE)["weights"] == "partial"
    weights.pull(ck("UD-Q4_K_XL"))
    shown = cli("show", RECIPE)
    assert shown.returncode == 0, shown.stderr
    assert "local cache   complete: verified by metralectl pull: UD-Q4_K_XL, 2 files" in shown.stdout
    assert f"gguf file     {SPLIT[0]} (+1 more parts)" in shown.stdout


def test_cli_pull_of_a_quant_the_repository_lacks_fails_with_the_list(hub: FakeHub) -> None:
    out = cli("pull", RECIPE, "--weights-only", "--set", "checkpoint.quant=IQ2_XXS")
    assert out.returncode == ExitCode.DATA, out.stderr
    assert "has no .gguf file for quant IQ2_XXS" in out.stderr and "UD-Q4_K_XL (2 parts, 75.0 kB)" in out.stderr
    assert f"set `checkpoint.quant:` in recipes/{RECIPE}.yaml to one of those" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == "" and not fetched(hub)


def test_doctor_judges_the_recipes_quant_and_sizes_it_from_the_listing(hub: FakeHub) -> None:
    def findings() -> dict[str, Any]:
        out = cli("doctor", "--recipe", RECIPE, "--json")
        return {f["id"]: f for f in json.loads(out.stdout)["checks"]}

    weights.pull(ck("Q8_0"))  # another quant: the listing is cached, the recipe's quant is not
    found = findings()
    assert found["recipe.weights"]["status"] == "warn" and found["recipe.weights"]["data"]["status"] == "absent"
    assert f"{REPO}:UD-Q4_K_XL is not in the HF cache" in found["recipe.weights"]["detail"]
    assert found["recipe.weights"]["remedy"] == f"metralectl pull {RECIPE}"  # not `hf download` of every quant
    assert found["hf.disk"]["data"]["need_bytes"] == 75_000  # the quant's two parts, from the listing
    weights.pull(ck("UD-Q4_K_XL"))
    found = findings()
    assert found["recipe.weights"]["status"] == "ok" and found["recipe.weights"]["data"]["files"] == list(SPLIT)
