"""The shipped vLLM recipes: each from a source Spark owners use (NVIDIA's DGX Spark playbook for vLLM,
eugr/spark-vllm-docker), with its provenance (the file, its commit and sha256, what differs), checked by the
recipe checker, claiming no measurement, and rendering to the `docker run` NVIDIA's image is started with."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from metralectl.core.render import docker_run_command, render, spec_for
from metralectl.core.yamlsrc import load_file
from tests.unit.recipe_helpers import REPO, catalog

_FILES = {p.stem: p for p in sorted((REPO / "recipes").glob("*.yaml")) if load_file(p).data.get("engine") == "vllm"}
NAMES = sorted(_FILES)
GOLDEN = REPO / "tests" / "golden" / "vllm-qwen3.6-docker-run.txt"
_URL = re.compile(r"https://github\.com/(?P<repo>[\w.-]+/[\w.-]+)/blob/(?P<commit>[0-9a-f]{40})/(?P<path>\S+)")


def test_the_shipped_vllm_recipes() -> None:
    assert NAMES == ["nemotron-3-nano-30b-a3b-vllm", "nemotron-3-super-120b-a12b-vllm", "qwen3.6-35b-a3b-vllm"]


def test_the_recipe_checker_passes_them() -> None:
    out = subprocess.run([sys.executable, "-m", "metralectl", "recipes", "check", *map(str, _FILES.values())],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0 and "3 ok, 0 refused" in out.stderr, out.stdout + out.stderr
    assert out.stdout.count("ok ") == 3


@pytest.mark.parametrize("name", NAMES)
def test_a_vllm_recipe_names_its_provenance(name: str) -> None:
    """`provenance:` is the file read (repo, path, commit, sha256); the header links that same file."""
    recipe = catalog().recipes[name]
    prov = recipe.provenance
    assert prov is not None and prov.taken and len(prov.commit) == 40 and len(prov.sha256) == 64
    header = _FILES[name].read_text().split("\nschema:", 1)[0]
    links = [m.groupdict() for m in _URL.finditer(header)]
    assert {"repo": prov.repo, "commit": prov.commit, "path": prov.path} in links, links
    assert recipe.checkpoint.repo in header
    assert any(key == "resources.bind" for key, *_ in prov.deviations)  # the playbooks bind 0.0.0.0; we do not


@pytest.mark.parametrize("name", NAMES)
def test_a_vllm_recipe_claims_no_measurement(name: str) -> None:
    validated = load_file(_FILES[name]).data["validated"]
    assert validated["source"] is None and validated["date"] is None and validated["decode-tok-s"] is None


@pytest.mark.parametrize("name", NAMES)
def test_a_vllm_recipe_runs_ngcs_image_with_vllm_serve(name: str) -> None:
    recipe = catalog().recipes[name]
    assert (recipe.hardware, recipe.image, recipe.resources.bind) == ("gb10", "vllm-gb10", "127.0.0.1")
    assert recipe.serve["served-model-name"] == recipe.model and {"max-model-len", "max-num-seqs"} <= set(recipe.serve)
    words = shlex.split(docker_run_command(spec_for(catalog(), recipe)).replace("\\\n", " "))
    image = words.index("nvcr.io/nvidia/vllm:26.05.post1-py3")
    assert words[image + 1:image + 5] == ["vllm", "serve", "--model", recipe.checkpoint.repo]
    assert ("-e", "HF_HUB_OFFLINE=1") in zip(words, words[1:])
    assert ("--gpu-memory-utilization", str(recipe.resources.memory_utilization)) in zip(words, words[1:])


@pytest.fixture()
def home_hf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HOME", "/home/operator")  # the golden must not depend on who runs the tests
    monkeypatch.setattr("metralectl.core.render.owner", lambda: "operator")


def test_the_golden_docker_run_of_a_vllm_recipe(home_hf: None) -> None:
    cat = catalog()
    recipe = cat.recipes["qwen3.6-35b-a3b-vllm"]
    text = docker_run_command(render(recipe, cat.engines["vllm"], cat.images[recipe.image]))
    assert text + "\n" == GOLDEN.read_text()


@pytest.mark.parametrize("name", NAMES)
def test_the_memory_estimate_says_why_it_cannot_size_a_vllm_kv_pool(name: str) -> None:
    """vLLM sizes its KV cache from what its memory fraction leaves; the estimate's pool is Metrale's and
    llama.cpp's formula, so it says which flags it lacks rather than blaming the KV dtype."""
    from metralectl.core.fit import estimate

    cat = catalog()
    recipe = cat.recipes[name]
    est = estimate(recipe, cat.models_for(recipe.hardware)[recipe.model], cat.hardware[recipe.hardware],
                   memory_meaning="fraction-of-total")
    assert est.kv_pool.gb is None and est.fits is None
    assert "vllm sizes its KV cache itself" in est.kv_pool.basis, est.kv_pool.basis
    assert est.budget.gb is not None and "of total" in est.budget.basis
