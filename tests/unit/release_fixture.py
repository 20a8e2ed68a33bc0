"""Engine release directories for the `recipes sync` tests, built at test time (tarfile + hashlib) from the
engine recipes under tests/unit/data/engine-recipes: index.json, recipes.tar.gz, serve-options.json and
their sha256sum sidecars, shaped like the engine's dev-release assets."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

from tests.unit.recipe_helpers import REPO

FIXTURES = REPO / "tests" / "unit" / "data" / "engine-recipes"
B34_DUMP = REPO / "engine" / "metrale" / "b34" / "serve-options.json"
COMMIT_61E6559 = "61e6559d0738fd4ed99046d06203b92ce7cbffca"


GEN2 = "qwen3.5/qwen3.5-122b-a10b-nvfp4-single"  # from 91b364b: pins less than 61e6559's rule wants


def fixture_recipes(*, with_gen2: bool = False) -> dict[str, bytes]:
    """engine recipe id -> its bytes: the committed fixtures of engine commits 61e6559/2735884 (15), and
    with_gen2 the one from 91b364b, which a release at 61e6559 refuses."""
    return {f"{p.parent.name}/{p.stem}": p.read_bytes() for p in sorted(FIXTURES.glob("*/*.yaml"))
            if with_gen2 or f"{p.parent.name}/{p.stem}" != GEN2}


def later_dump() -> bytes:
    """A serve-options.json with b34's flags plus the ones engine commit 61e6559 adds, as the dump of a
    release at that commit would list them (built from our contract's sourced delta)."""
    from tests.unit.recipe_helpers import catalog

    data = json.loads(B34_DUMP.read_text())
    revision = catalog().engines["metrale"].revisions["61e6559"]
    for name in revision.added:
        spec = revision.specs[name]
        default = None if spec.default is None else str(spec.default).lower() if isinstance(spec.default, bool) \
            else str(spec.default)
        data["flags"].append({"key": name.replace("-", "_"), "flag": name, "presence_only": spec.type == "flag",
                              "is_bool": spec.type == "flag", "options": list(spec.choices),
                              "default": "false" if spec.type == "flag" else default, "help": "",
                              "cli_aliases": [], "recipe_aliases": []})
    return json.dumps(data).encode()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tar_gz(files: dict[str, bytes], extra: list[tarfile.TarInfo] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1767225600
            tar.addfile(info, io.BytesIO(data))
        for info in extra or []:
            tar.addfile(info)
    return buffer.getvalue()


def write_release(dest: Path, recipes: dict[str, bytes] | None = None, *, dump: bytes | None = None,
                  commit: str = COMMIT_61E6559, index_extra: dict[str, Any] | None = None,
                  tar_extra: list[tarfile.TarInfo] | None = None) -> Path:
    """Write a consistent release into dest (every digest right); tests then damage what they test."""
    recipes = fixture_recipes() if recipes is None else recipes
    dump = later_dump() if dump is None else dump
    dest.mkdir(parents=True, exist_ok=True)
    archive = tar_gz({f"recipes/{rid}.yaml": data for rid, data in recipes.items()}, tar_extra)
    index = {
        "schema_version": 1, "commit": commit, "engine_version": "1.0.0-beta-preview",
        "assets": {"recipes.tar.gz": sha(archive), "serve-options.json": sha(dump)},
        "recipes": [{"id": rid, "path": f"recipes/{rid}.yaml", "sha256": sha(data), "bytes": len(data),
                     "model": "", "runtime": "metrale", "container": "", "min_nodes": 1}
                    for rid, data in sorted(recipes.items())],
        "tree_sha": commit, "fetched_at": "2026-12-01T00:00:00Z",
        "files": {rid: data.decode() for rid, data in recipes.items()},
        **(index_extra or {}),
    }
    for name, data in (("recipes.tar.gz", archive), ("serve-options.json", dump),
                       ("index.json", json.dumps(index, indent=1).encode())):
        (dest / name).write_bytes(data)
        reseal(dest, name)
    return dest


def reseal(dest: Path, name: str) -> None:
    """Rewrite one asset's .sha256 sidecar to match its current bytes (sha256sum format, bare name)."""
    (dest / f"{name}.sha256").write_text(f"{sha((dest / name).read_bytes())}  {name}\n")


def reseal_index(dest: Path) -> None:
    """After changing an asset: update index.json's `assets` digest, then both sidecars."""
    index = json.loads((dest / "index.json").read_text())
    for name in ("recipes.tar.gz", "serve-options.json"):
        index["assets"][name] = sha((dest / name).read_bytes())
        reseal(dest, name)
    (dest / "index.json").write_text(json.dumps(index, indent=1))
    reseal(dest, "index.json")
