"""Nothing from a release reaches a generated recipe file unescaped: the comment at its top takes printable
ASCII only (an index path with a line break is refused before it gets there), and values from upstream
(a description, a tag, an env value) go through the YAML emitter, so "\\nname: evil" round-trips as the
same string and adds no key. Names from index.json are checked before use; the terminal gets them escaped."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from metralectl.app import recipe_sync
from metralectl.core import release_archive as ra
from metralectl.core import synced_set
from metralectl.core.catalog import load_catalog
from metralectl.core.recipe_import import ImportContext, UpstreamFile, convert
from metralectl.core.yamlsrc import load_text
from metralectl.errors import ExitCode, MetralError
from metralectl.names import UnsafeName
from metralectl.seams.sync_fetch import Source
from tests.unit.recipe_helpers import REPO
from tests.unit.release_fixture import COMMIT_61E6559, fixture_recipes, reseal, reseal_index, sha, write_release

FLAGSHIP = "qwen3.5/qwen3.5-35b-a3b-nvfp4"
BREAKS = ["\nname: evil", "\rname: evil", "\u2028name: evil", "\u2029name: evil", "\x85name: evil"]


def _comment(text: str) -> str:
    from metralectl.app.sync_install import comment  # here: the other tests of this file also run on old code

    return comment(text)


def _sync(location: Path, root: Path) -> recipe_sync.SyncReport:
    return recipe_sync.sync(load_catalog(use_cache=False), Source(str(location)), root=root, today="2026-12-01")


@pytest.mark.parametrize("text", [f"x{b}" for b in BREAKS] + ["\x1b]0;title\x07", "caf\u00e9", "", "a\tb"])
def test_a_comment_takes_printable_ascii_only(text: str) -> None:
    with pytest.raises(MetralError, match="only printable ASCII goes there") as caught:
        _comment(text)
    assert caught.value.exit_code == ExitCode.DATA and "\n" not in caught.value.message


def test_a_comment_line_is_one_line() -> None:
    assert _comment("Synced from engine release b40 (recipes/a/b.yaml, sha256 00).") == \
        "# Synced from engine release b40 (recipes/a/b.yaml, sha256 00).\n"


@pytest.mark.parametrize("tail", BREAKS + ["\x1b[2J"])
def test_an_index_path_with_a_line_break_never_reaches_the_header(tmp_path: Path, isolated_env: Path,
                                                                  tail: str) -> None:
    """The archive holds a member under exactly that path, so the release is otherwise consistent."""
    recipes = fixture_recipes()
    path = f"recipes/{FLAGSHIP}.yaml{tail}"
    release = write_release(tmp_path / "b40", recipes)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rid, data in sorted(recipes.items()):
            info = tarfile.TarInfo(path if rid == FLAGSHIP else f"recipes/{rid}.yaml")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (release / "recipes.tar.gz").write_bytes(buffer.getvalue())
    index = json.loads((release / "index.json").read_text())
    next(e for e in index["recipes"] if e["id"] == FLAGSHIP)["path"] = path
    (release / "index.json").write_text(json.dumps(index))
    reseal_index(release)
    root = synced_set.synced_dir()
    with pytest.raises(UnsafeName, match=r"index.json recipes\[\d+\] `path` gave a release path that is not one"):
        _sync(release, root)
    assert not root.exists()


def _upstream(category: str, env_value: str, description: str) -> bytes:
    data = yaml.safe_load(fixture_recipes()[FLAGSHIP])
    data["metadata"]["category"] = category
    data["metadata"]["description"] = description
    data["env"] = {"TZ": env_value}
    return yaml.safe_dump(data, allow_unicode=False).encode()  # escapes in double quotes: read back exactly


@pytest.mark.parametrize("tail", BREAKS + ["\x1b]0;title\x07", "\u202e"])
def test_upstream_values_round_trip_as_the_same_strings_and_add_no_key(tail: str) -> None:
    catalog = load_catalog(use_cache=False)
    revision = catalog.engines["metrale"].revisions["61e6559"]
    ctx = ImportContext(catalog, revision, "Metrale/metrale-inference", COMMIT_61E6559, "b40", "2026-12-01")
    text = _upstream(f"agent{tail}", f"on{tail}", f"first line{tail}")
    result = convert(UpstreamFile(FLAGSHIP, f"recipes/{FLAGSHIP}.yaml", text, sha(text)), ctx)
    assert result.data is not None
    written = result.text("# header\n")
    assert load_text(written, "x.yaml").data == result.data  # the project's own reader: exactly what was converted
    assert yaml.safe_load(written) == result.data
    assert result.data["tags"][0] == f"agent{tail}" and result.data["env"]["TZ"] == f"on{tail}"
    assert result.data["name"] == "qwen3.5-35b-a3b-nvfp4" and "evil" not in yaml.safe_load(written)


def test_a_synced_file_with_yaml_syntax_in_its_values_loads_as_written(tmp_path: Path, isolated_env: Path) -> None:
    """End to end: the checker refuses line breaks in these values (checker_text), so what reaches a file is
    one line, but YAML's own syntax in it (`: `, `#`, quotes, `{`, `&`) is still only text."""
    recipes = fixture_recipes()
    hostile = "x: 1 # name: evil' \" {image: pwned} &a *a"
    recipes[FLAGSHIP] = _upstream(f"agent: {hostile}", f"UTC {hostile}", f"fine {hostile}")
    root = synced_set.synced_dir()
    report = _sync(write_release(tmp_path / "b40", recipes), root)
    written = (Path(report.installed) / "recipes" / "qwen3.5-35b-a3b-nvfp4.yaml").read_text()
    doc = load_text(written, "x.yaml").data
    assert doc["env"]["TZ"] == f"UTC {hostile}" and doc["tags"][0] == f"agent: {hostile}"
    assert doc["description"] == f"fine {hostile}"
    assert doc["name"] == "qwen3.5-35b-a3b-nvfp4" and doc["image"] != "pwned"
    assert written.startswith("# Synced from engine release b40 (recipes/qwen3.5/qwen3.5-35b-a3b-nvfp4.yaml, sha256 ")


def _edit_index(where: Path, **changes: object) -> None:
    index = json.loads((where / "index.json").read_text())
    for key, value in changes.items():
        if key.startswith("recipe_"):
            next(e for e in index["recipes"] if e["id"] == FLAGSHIP)[key.removeprefix("recipe_")] = value
        else:
            index[key] = value
    (where / "index.json").write_text(json.dumps(index))
    reseal(where, "index.json")


@pytest.mark.parametrize("changes,kind", [
    ({"commit": COMMIT_61E6559 + "\n"}, "commit"),
    ({"recipe_id": "../../../../tmp/evil"}, "recipe id"),
    ({"recipe_id": FLAGSHIP + "\n"}, "recipe id"),
    ({"recipe_path": "/etc/passwd"}, "release path"),
    ({"recipe_path": "recipes/../../x.yaml"}, "release path"),
    ({"recipe_sha256": "A" * 64}, "sha256"),
    ({"engine_version": "1.0\x1b]0;pwned\x07"}, "version"),
    ({"release": "b41\nname: evil"}, "version"),
    ({"assets": {"../recipes.tar.gz": "0" * 64}}, "asset name"),
    ({"files": {"a/../../b": "x"}}, "recipe id"),
])
def test_names_in_index_json_are_checked_before_use(tmp_path: Path, isolated_env: Path, changes: dict[str, object],
                                                    kind: str) -> None:
    release = write_release(tmp_path / "b40")
    _edit_index(release, **changes)
    root = synced_set.synced_dir()
    with pytest.raises(UnsafeName, match=f"gave a {kind} that is not one") as caught:
        _sync(release, root)
    assert caught.value.exit_code == ExitCode.DATA
    assert "\x1b" not in caught.value.message and "\n" not in caught.value.message
    assert not root.exists()


def test_a_sidecar_naming_a_path_is_refused(tmp_path: Path, isolated_env: Path) -> None:
    release = write_release(tmp_path / "b40")
    digest = sha((release / "index.json").read_bytes())
    (release / "index.json.sha256").write_text(f"{digest}  ../index.json\n")
    with pytest.raises(UnsafeName, match="index.json.sha256 gave a asset name that is not one"):
        _sync(release, synced_set.synced_dir())


def test_a_release_label_from_the_url_is_bounded() -> None:
    index = ra.ReleaseIndex(COMMIT_61E6559, "", {}, [])
    assert ra.release_label(index, "https://h/download/b" + "9" * 5000 + "/") == COMMIT_61E6559[:7]
    assert ra.release_label(index, "https://h/download/b35/") == "b35"


def test_the_sync_output_escapes_what_the_release_says(tmp_path: Path, isolated_env: Path) -> None:
    """An engine version is checked; what the CLI prints of a release (names, ids, problems) is escaped."""
    recipes = fixture_recipes()
    recipes["evil/post-commands"] = recipes[FLAGSHIP] + b'post_commands:\n- "\\e]0;pwned\\a\\e[2J"\n'
    release = write_release(tmp_path / "b40", recipes)
    env = {**os.environ, "METRALECTL_CONFIG_DIR": str(isolated_env / "config")}
    out = subprocess.run([sys.executable, "-m", "metralectl", "recipes", "sync", "--from", str(release)],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert out.returncode == ExitCode.DATA, out.stderr
    assert "\x1b" not in out.stdout + out.stderr and "\x07" not in out.stdout + out.stderr
    clean_release = write_release(tmp_path / "b41")  # nothing else wrong with it
    _edit_index(clean_release, engine_version="1.0\x1b]0;pwned\x07")
    out = subprocess.run([sys.executable, "-m", "metralectl", "recipes", "sync", "--from", str(clean_release)],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert out.returncode == ExitCode.DATA and "gave a version that is not one" in out.stderr, out.stderr
    assert "\x1b" not in out.stdout + out.stderr and "\x07" not in out.stdout + out.stderr
