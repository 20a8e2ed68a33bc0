"""`metralectl pull` against a Hub or mirror that lies (issue 27, classes 1, 3, 6, 7): tests/fakehub on
127.0.0.1, the real CLI in a subprocess. Crafted listings (names with `..`, absolute, our own manifest's
name, control characters; commits and hashes that are not; duplicates, absurd sizes) and lying answers
(more bytes than listed, fewer, a wrong Content-Range, a compressed body, a redirect loop, ETag and
X-Repo-Commit headers naming `../` paths, a redirect to another host).

For each: nothing outside the HF cache changes (the whole tmp tree is compared before and after: paths,
bytes, link targets), and the CLI ends with 65 (the data is refused) or 69 (unreachable) and one line
`metralectl: …` — no traceback, no internal error (70) — or, where the lie is harmless because no
server header names anything on disk, with a verified checkpoint (0).
"""

from __future__ import annotations

import os
import random
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from metralectl import paths
from metralectl.seams.hf import cache as hfcache, listing as hflisting
from tests.fakehub.server import FakeHub, FakeRepo

REPO_ROOT = Path(__file__).resolve().parents[2]
FLAGSHIP = "qwen3.5-35b-a3b"
REPO = "Sehyo/Qwen3.5-35B-A3B-NVFP4"
BIG = "model-00001-of-00002.safetensors"  # 17 MiB: metralectl's resumable downloader
SMALL = "model-00002-of-00002.safetensors"  # an LFS file below the resumable size
CONFIG = "config.json"  # a regular (git) file
DATA = {CONFIG: b'{"model_type": "qwen3_5_moe"}', "tokenizer.json": b'{"x": 1}',
        SMALL: random.Random(1).randbytes(200_000), BIG: random.Random(2).randbytes(17 << 20)}
ESCAPE = "../../../../../outside/pwned"  # from blobs/ (or snapshots/<commit>/) up into the test's tmp tree


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub([FakeRepo.build(REPO, DATA)]) as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield fake


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Files beside the cache that nothing may touch."""
    there = tmp_path / "outside"
    there.mkdir()
    (there / "sentinel").write_bytes(b"precious")
    return there


def tree(root: Path, skip: Path | None = None) -> dict[str, tuple[object, ...]]:
    """Every entry under root (links as links): kind and bytes or target, `skip` left out."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirs, files in os.walk(root):
        here = Path(dirpath)
        dirs[:] = [d for d in dirs if here / d != skip]
        for name in dirs + files:
            path = here / name
            st = path.lstat()
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", path.read_bytes())
            else:
                out[rel] = ("dir" if stat.S_ISDIR(st.st_mode) else "other",)
    return out


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=dict(os.environ), timeout=timeout, stdin=subprocess.DEVNULL)


def pull_and_compare(tmp_path: Path, expect_cache_unchanged: bool = False) -> subprocess.CompletedProcess[str]:
    """`pull` once; nothing outside the HF cache changed (and, when asked, nothing inside it either)."""
    cache = paths.hf_hub_cache()
    cli("list")  # the catalog's own cache settles first: what changes below is the pull's doing
    before, inside = tree(tmp_path, skip=cache), tree(cache) if cache.exists() else {}
    out = cli("pull", FLAGSHIP, "--weights-only")
    assert tree(tmp_path, skip=cache) == before, out.stderr
    if expect_cache_unchanged:
        assert (tree(cache) if cache.exists() else {}) == inside
    return out


def refused(out: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    """Exit `code` with one `metralectl:` line naming `words`; no traceback, no control character."""
    lines = [line for line in out.stderr.splitlines() if line.startswith("metralectl:")]
    assert out.returncode == code, out.stderr
    assert len(lines) == 1 and "Traceback" not in out.stderr and "internal error" not in out.stderr, out.stderr
    assert not any(ch in out.stderr for ch in "\x1b\x07\x9b"), out.stderr
    for word in words:
        assert word in lines[0], lines[0]
    if os.environ.get("SHOW_REFUSALS"):
        print("\nREFUSAL", lines[0], file=sys.stderr)
    return lines[0]


# --- crafted listings: refused before anything is written -----------------------------------------------
def rename(path: str, to: object) -> Callable[[dict[str, Any]], object]:
    def edit(info: dict[str, Any]) -> object:
        for sibling in info["siblings"]:
            if sibling["rfilename"] == path:
                sibling["rfilename"] = to
        return info
    return edit


def field_of(path: str, key: str, value: object, lfs: bool = False) -> Callable[[dict[str, Any]], object]:
    def edit(info: dict[str, Any]) -> object:
        for sibling in info["siblings"]:
            if sibling["rfilename"] == path:
                (sibling["lfs"] if lfs else sibling)[key] = value
        return info
    return edit


def top(key: str, value: object) -> Callable[[dict[str, Any]], object]:
    def edit(info: dict[str, Any]) -> object:
        info[key] = value(info[key]) if callable(value) else value
        return info
    return edit


LISTINGS: dict[str, tuple[Callable[[dict[str, Any]], object], str]] = {
    "name ../../x": (rename(CONFIG, "../../x"), "repo path"),
    "name /etc/x": (rename(CONFIG, "/etc/x"), "repo path"),
    "name a/../../b": (rename(CONFIG, "a/../../b"), "repo path"),
    "name of our manifest": (rename(CONFIG, ".metralectl-verified.json"), "metralectl's own files"),
    "name in our partial folder": (rename(CONFIG, "sub/.metralectl-partial/x"), "metralectl's own files"),
    "name with ESC": (rename(CONFIG, "x\x1b]0;pwned\x07.json"), "repo path"),
    "name with a newline": (rename(CONFIG, "config.json\nx"), "repo path"),
    "name not a string": (rename(CONFIG, 7), "repo path"),
    "commit ../../x": (top("sha", "../../x"), "commit"),
    "commit with a newline": (top("sha", lambda c: c + "\n"), "commit"),
    "commit upper-case": (top("sha", lambda c: c.upper()), "commit"),
    "sha256 upper-case": (field_of(BIG, "sha256", "A" * 64, lfs=True), "sha256"),
    "sha256 with a newline": (field_of(BIG, "sha256", "a" * 64 + "\n", lfs=True), "sha256"),
    "sha256 ../": (field_of(BIG, "sha256", ESCAPE, lfs=True), "sha256"),
    "blob id ../": (field_of(CONFIG, "blobId", ESCAPE), "git oid"),
    "duplicate paths": (top("siblings", lambda s: [*s, dict(s[0])]), "twice"),
    "a file and a folder": (top("siblings", lambda s: [*s, {**s[0], "rfilename": s[0]["rfilename"] + "/x"}]),
                            "both as a file and as a folder"),
    "negative size": (field_of(CONFIG, "size", -1), "not a size"),
    "absurd size": (field_of(BIG, "size", 1 << 60, lfs=True), "not a size"),
    "size not a number": (field_of(CONFIG, "size", "29"), "not a size"),
    "no hash at all": (field_of(CONFIG, "blobId", None), "without a sha256 or a git blob id"),
    "no commit": (lambda info: {k: v for k, v in info.items() if k != "sha"}, "without a commit"),
    "siblings not a list": (top("siblings", "x"), "without a commit or a file list"),
    "a sibling not an object": (top("siblings", lambda s: [*s, "x"]), "not one"),
    "not an object": (lambda info: ["x"], "without a commit or a file list"),
}


@pytest.mark.parametrize("case", sorted(LISTINGS))
def test_a_crafted_listing_is_refused_and_nothing_is_written(hub: FakeHub, tmp_path: Path, outside: Path,
                                                             case: str) -> None:
    edit, said = LISTINGS[case]
    hub.info_edit = edit
    out = pull_and_compare(tmp_path, expect_cache_unchanged=True)
    refused(out, 65, said, "nothing was written")
    assert not hub.gets()  # not one file was asked for


def test_a_listing_with_too_many_files_is_refused_unread(hub: FakeHub, tmp_path: Path, outside: Path) -> None:
    many = [{"rfilename": f"f{i}.json", "size": 1, "blobId": "a" * 40} for i in range(hflisting.MAX_FILES + 1)]
    hub.info_edit = top("siblings", lambda s: many)
    refused(pull_and_compare(tmp_path, expect_cache_unchanged=True), 65, f"more than {hflisting.MAX_FILES}")


def test_a_listing_larger_than_the_cap_is_not_read(hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   outside: Path) -> None:
    hub.info_edit = top("padding", "x" * (65 << 20))  # 65 MiB of JSON: beyond hfhub.MAX_LISTING_BYTES
    refused(pull_and_compare(tmp_path, expect_cache_unchanged=True), 65, "larger than")


# --- lying transfers: nothing placed, exit 65 ------------------------------------------------------------
TRANSFERS = {
    "more bytes than listed (small file)": (SMALL, "grow", "the Hub lists"),
    "more bytes than listed (large file)": (BIG, "grow", "the Hub lists"),
    "an endless body (small file)": (CONFIG, "endless", "more than the"),
    "an endless body (large file)": (BIG, "endless", "more than the"),
    "fewer bytes (small file)": (CONFIG, "truncate", "the Hub lists"),
    "fewer bytes (large file)": (BIG, "truncate", "the Hub lists"),
    "a wrong Content-Range (small file)": (SMALL, "bad-range", "Content-Range"),
    "a wrong Content-Range (large file)": (BIG, "bad-range", "Content-Range"),
    "a compressed body": (CONFIG, "gzip", "Content-Encoding"),
}


@pytest.mark.parametrize("case", sorted(TRANSFERS))
def test_a_lying_transfer_places_nothing(hub: FakeHub, tmp_path: Path, outside: Path, case: str) -> None:
    path, fault, said = TRANSFERS[case]
    hub.fault(path, fault, extra=10)
    out = pull_and_compare(tmp_path)
    refused(out, 65, path, said)
    snapshot = hfcache.snapshot_path(REPO, hub.repos[REPO].commit)
    assert not (snapshot / path).exists() and not (snapshot / path).is_symlink()  # nothing of it placed
    assert not (snapshot / hfcache.VERIFIED_MANIFEST).exists()
    assert hfcache.cache_state(REPO).status == "partial"


def test_a_redirect_loop_ends_with_a_clear_refusal(hub: FakeHub, tmp_path: Path, outside: Path) -> None:
    hub.redirect_loop.add(CONFIG)
    refused(pull_and_compare(tmp_path), 65, "redirects", "a redirect loop")
    assert len([r for r in hub.log if r.path.endswith("/" + CONFIG)]) <= 12  # it gave up, it did not spin


@pytest.mark.parametrize("header", ["ETag", "X-Linked-Etag", "X-Repo-Commit"])
def test_headers_naming_paths_outside_name_nothing(hub: FakeHub, tmp_path: Path, outside: Path, header: str) -> None:
    """huggingface_hub names blobs and snapshots after these headers; metralectl after the checked listing."""
    hub.resolve_headers = {header: f'"{ESCAPE}"' if header != "X-Repo-Commit" else ESCAPE}
    out = pull_and_compare(tmp_path)
    assert out.returncode == 0, out.stderr
    commit = hub.repos[REPO].commit
    assert hfcache.cache_state(REPO).status == "complete"
    blobs = sorted(p.name for p in (hfcache.repo_dir(REPO) / "blobs").iterdir())
    assert blobs == sorted(f.sha256 if f.lfs else f.oid for f in hub.repos[REPO].files.values())
    assert sorted(p.name for p in (hfcache.repo_dir(REPO) / "snapshots").iterdir()) == [commit]


def test_a_redirect_to_another_host_gets_no_token(hub: FakeHub, tmp_path: Path, outside: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    hub.repos[REPO].gated = "manual"
    hub.repos[REPO].authorized.add("hf_valid")
    hub.redirect_small = True  # every file, regular ones too, is served by the "CDN" (localhost, not 127.0.0.1)
    monkeypatch.setenv("HF_TOKEN", "hf_valid")
    out = pull_and_compare(tmp_path)
    assert out.returncode == 0, out.stderr
    cdn = hub.gets("/cdn/")
    assert len(cdn) == len(DATA) and not any(r.authorized for r in cdn)  # every file: the token stayed home
    assert all(r.authorized for r in hub.log if "/resolve/" in r.path)


def test_an_unreachable_hub_is_69(tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as bound:  # bound, never listening: every connection is refused
        bound.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{bound.getsockname()[1]}")
        out = pull_and_compare(tmp_path, expect_cache_unchanged=True)
    refused(out, 69, "cannot reach the Hugging Face Hub")



def test_a_token_no_header_can_carry_is_refused_not_sent(hub: FakeHub, tmp_path: Path, outside: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_valid\x1b[2J")  # huggingface_hub strips CR/LF from a token, not the rest
    refused(pull_and_compare(tmp_path, expect_cache_unchanged=True), 65, "Hugging Face token", "Authorization header cannot carry")
    assert not hub.log  # not even the listing was asked for


def test_nothing_of_the_mirror_is_cached_beside_the_hub_cache(hub: FakeHub, tmp_path: Path, outside: Path) -> None:
    """huggingface_hub 2.4 builds its headers from a registry it fetches from HF_ENDPOINT and caches in HF_HOME;
    metralectl builds its own and asks the mirror for the listing and the files only."""
    hub.harnesses = {"harnesses": [{"id": "x\r\nInjected: 1", "env": {"AI_AGENT": "x"}}], "padding": "y" * 1000}
    out = pull_and_compare(tmp_path)  # HF_HOME outside hub/ is part of what must not change
    assert out.returncode == 0, out.stderr
    assert not [r for r in hub.log if "agent-harnesses" in r.path]


@pytest.mark.parametrize("start,location", [("https://hub.example/x", "http://hub.example/y"),
                                            ("https://hub.example/x", "file:///etc/passwd"),
                                            ("http://127.0.0.1:1/x", "ftp://127.0.0.1/y")])
def test_a_redirect_off_https_or_off_http_is_refused(start: str, location: str) -> None:
    from metralectl.seams.hf import hub as hfhub

    with pytest.raises(hfhub.HubDataError) as caught:  # checked before anything is sent there
        hfhub._next(start, location)
    assert caught.value.exit_code == 65 and "nothing was placed" in caught.value.message
