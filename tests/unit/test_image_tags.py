"""Images as upstream names them: metrale/metrale-inference-gb10 with its tags a recipe picks (`image-tag:`,
`--set image-tag=dev`, `--set image.tag=dev`), and the Hopper/B200 entries that are built from source and not
certified by the engine — which `show`, `list`, `images`, `pull` and doctor say instead of implying a pull."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from metralectl.core import images
from metralectl.seams.docker import images as docker_images
from metralectl.core.catalog import check_files
from metralectl.errors import RecipeInvalid
from metralectl.core.overrides import apply_sets
from metralectl.core.render import docker_run_command, spec_for
from tests.unit.recipe_helpers import REPO, catalog, flagship_data, write

GB10 = "metrale-inference-gb10"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, cwd=REPO,
                          env={**__import__("os").environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)}, timeout=120)


def test_the_gb10_image_as_upstream_names_it() -> None:
    info = catalog().images[GB10]
    assert info.ref == "metrale/metrale-inference-gb10:latest" and info.tag == "latest"
    assert {"latest", "dev"} <= set(info.tags) and info.certified is True and info.pullable
    assert all(meaning for meaning in info.tags.values())  # each tag says what it is


@pytest.mark.parametrize("tag,problem", [
    ("dev", None), ("latest", None), ("nightly", None),
    ("79dea21", None), ("79dea21d52ce7fb4adab2bfec1a14b13211d8286", None), ("3.0.0", None), ("v3.1.2-rc1", None),
    ("bogus", "has no tag 'bogus'"), ("79DEA21", "has no tag"), ("has space", "not a Docker tag"),
])
def test_which_tags_a_recipe_may_pick(tag: str, problem: str | None) -> None:
    found = catalog().images[GB10].tag_problem(tag)
    assert (found is None) if problem is None else (found is not None and problem in found), found


@pytest.mark.parametrize("key", ["image-tag", "image.tag"])
def test_set_image_tag_runs_that_tag(key: str) -> None:
    cat = catalog()
    recipe = apply_sets(cat, cat.recipes["qwen3.5-35b-a3b"], [f"{key}=dev"])
    assert recipe.image_tag == "dev" and cat.image_for(recipe).ref == "metrale/metrale-inference-gb10:dev"
    assert ("image-tag", None, "dev") in recipe.deviations  # not what was validated: shown as a deviation
    assert "metrale/metrale-inference-gb10:dev" in docker_run_command(spec_for(cat, recipe))
    assert cat.image_for(cat.recipes["qwen3.5-35b-a3b"]).ref.endswith(":latest")  # the shipped recipe is untouched


def test_a_recipe_file_names_its_tag(tmp_path: Path) -> None:
    data = flagship_data()
    data["image-tag"] = "dev"
    [(_, recipe, problems)] = check_files(catalog(), [write(tmp_path, data)])
    assert recipe is not None and recipe.image_tag == "dev", problems
    data["image-tag"] = "bogus"
    [(_, recipe, problems)] = check_files(catalog(), [write(tmp_path, data)])
    [problem] = [p for p in problems if p.severity == "error"]
    assert recipe is None and problem.key == "image-tag" and "latest, dev" in problem.message and problem.line > 0


def test_a_built_image_has_no_registry_tags() -> None:
    cat = catalog()
    with pytest.raises(RecipeInvalid, match="has no tag 'dev'"):
        apply_sets(cat, cat.recipes["qwen3.5-35b-a3b-hopper"], ["image-tag=dev"])


@pytest.mark.parametrize("image_id,dockerfile", [("metrale-inference-hopper", "docker/hopper/Dockerfile"),
                                                 ("metrale-inference-b200", "docker/b200/Dockerfile")])
def test_hopper_and_b200_are_built_from_source_and_not_certified(image_id: str, dockerfile: str) -> None:
    info = catalog().images[image_id]
    assert not info.pullable and info.certified is False
    assert info.availability().startswith("build from source; not certified by the engine")
    assert f"docker build -f {dockerfile} -t {info.ref} ." in info.availability()


class Absent:
    pulls: list[str] = []

    def image_state(self, ref: str, revision_label: str = "") -> SimpleNamespace:
        return SimpleNamespace(present=False, platform=None, image_id=None, revision=None, digests=())

    def pull_image(self, ref: str, on_progress=None, platform: str | None = None) -> None:  # noqa: ANN001
        self.pulls.append(ref)


def test_pull_of_a_built_image_says_it_cannot_and_how_to_build_it() -> None:
    info = catalog().images["metrale-inference-hopper"]
    runtime = Absent()
    with pytest.raises(images.ImageError) as refused:
        docker_images.pull(info, runtime, "x86_64")
    assert "cannot be pulled: it is built from source; not certified by the engine" in refused.value.message
    assert "docker build -f docker/hopper/Dockerfile -t metrale/metrale-inference-hopper:latest ." in refused.value.hint
    assert runtime.pulls == []  # nothing was asked of a registry
    with pytest.raises(images.ImageError, match="cannot be pulled") as preflight:
        docker_images.image_preflight(info, runtime, "x86_64", "qwen3.5-35b-a3b-hopper")
    assert "metralectl pull" not in preflight.value.message + (preflight.value.hint or "")


def test_show_and_list_say_so() -> None:
    shown = _cli("show", "qwen3.5-35b-a3b-hopper")
    assert shown.returncode == 0 and "build from source; not certified by the engine" in shown.stdout
    data = json.loads(_cli("show", "qwen3.5-35b-a3b-hopper", "--json").stdout)["image"]
    assert data["pullable"] is False and data["certified"] is False
    listed = _cli("list")
    assert "qwen3.5-35b-a3b-hopper: image metrale/metrale-inference-hopper:latest is not pulled: build from source; " \
           "not certified by the engine" in listed.stderr
    rows = {r["name"]: r for r in json.loads(_cli("list", "--json").stdout)["recipes"]}
    assert rows["qwen3.5-35b-a3b-b200"]["image_pullable"] is False and rows["qwen3.5-35b-a3b"]["image_pullable"] is True
    gb10 = _cli("show", "qwen3.5-35b-a3b")
    assert "pulled from its registry; the engine's own image" in gb10.stdout and "latest, dev" in gb10.stdout


def test_doctor_names_the_build_not_a_pull(tmp_path: Path) -> None:
    from metralectl.doctor import RECIPE_CHECKS, run_checks
    from tests.unit import doctor_fakes as df

    check = next(c for c in RECIPE_CHECKS if c.id == "recipe.image")
    ctx = df.make_ctx(tmp_path, recipe="qwen3.5-35b-a3b-b200", runtime=df.FakeRuntime(images={}))
    [result] = run_checks(ctx, [check])
    ctx.close()
    assert result.status == "problem" and "cannot be pulled" in result.detail
    assert "not certified by the engine" in result.detail and "docker build -f docker/b200/Dockerfile" in result.remedy
    assert "metralectl pull" not in result.remedy
