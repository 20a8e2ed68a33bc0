"""The shipped llama.cpp recipes: ours (no upstream recipe), so each names the evidence that its GGUF checkpoint
exists, claims no measurement, and states the GB10 settings every one of them shares."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from metralectl.core.render import docker_run_command, spec_for
from metralectl.core.yamlsrc import load_file
from tests.unit.recipe_helpers import REPO, catalog

_FILES = {p.stem: p for p in sorted((REPO / "recipes").glob("*.yaml")) if load_file(p).data.get("engine") == "llama-cpp"}
NAMES = sorted(_FILES)
GB10_NAMES = [n for n in NAMES if n.endswith("-llamacpp")]  # demo-cpu is the cpu class's (test_demo_cpu_class.py)
_URL = re.compile(r"https://\S+")


def test_the_shipped_llamacpp_recipes() -> None:
    assert NAMES == ["demo-cpu", "gemma-4-26b-a4b-llamacpp", "gemma-4-31b-llamacpp", "nemotron-3-nano-30b-a3b-llamacpp",
                     "qwen3-next-80b-a3b-llamacpp", "qwen3.5-27b-llamacpp", "qwen3.5-35b-a3b-llamacpp",
                     "qwen3.6-35b-a3b-llamacpp"]


@pytest.mark.parametrize("name", NAMES)
def test_a_llamacpp_recipe_cites_the_evidence_for_its_checkpoint(name: str) -> None:
    """The comment at the top names where the GGUF repository (and its quant) was seen: a URL, and the repo."""
    text = _FILES[name].read_text()
    header = text.split("\nschema:", 1)[0]
    recipe = catalog().recipes[name]
    assert recipe.checkpoint.repo in text
    if name != "qwen3.5-35b-a3b-llamacpp":  # the template from main, its evidence is in the report that shipped it
        assert _URL.search(header), f"{name}: no evidence URL in the header comment"


@pytest.mark.parametrize("name", NAMES)
def test_a_llamacpp_recipe_claims_no_measurement(name: str) -> None:
    data = load_file(_FILES[name]).data
    validated = data["validated"]
    assert validated["source"] is None and validated["date"] is None
    assert all(v is None for k, v in validated.items() if k not in ("hardware", "source", "date")), validated


@pytest.mark.parametrize("name", GB10_NAMES)
def test_a_llamacpp_recipe_has_the_gb10_settings(name: str) -> None:
    recipe = catalog().recipes[name]
    contract = catalog().engines["llama-cpp"]
    assert recipe.hardware == "gb10" and recipe.image == "llama-cpp-gb10"
    assert recipe.checkpoint.quant in contract.quants and recipe.checkpoint.format == "gguf"
    assert recipe.model == name.removesuffix("-llamacpp")  # checkpoint.model: the kernels/gb10 model it serves
    serve = recipe.serve
    assert serve["n-gpu-layers"] == "all" and serve["flash-attn"] == "on" and serve["jinja"] is True
    assert serve["parallel"] >= 1 and serve["ctx-size"] % serve["parallel"] == 0  # ctx-size = slots × per-slot
    assert serve["alias"] == recipe.model  # served under the kernels/ model's id
    assert recipe.resources.bind == "127.0.0.1"


@pytest.mark.parametrize("name", NAMES)
def test_a_llamacpp_recipe_renders_its_checkpoint_as_hf_repo_quant(name: str) -> None:
    recipe = catalog().recipes[name]
    command = docker_run_command(spec_for(catalog(), recipe))
    assert f"--hf-repo {recipe.checkpoint.repo}:{recipe.checkpoint.quant}" in command
    assert "--offline" in command and "--metrics" in command
    assert catalog().image_for(recipe).ref in command


def test_the_files_are_named_after_their_recipes() -> None:
    for name, path in _FILES.items():
        assert load_file(path).data["name"] == name == Path(path).stem


@pytest.mark.parametrize("line,fragment,hint", [
    ("  n-gpu-layer: all", "unknown engine flag --n-gpu-layer (llama.cpp server has no such serve flag)",
     "did you mean `n-gpu-layers`?"),
    ("  --flash-attn: \"on\"", "write the flag without its dashes: `flash-attn:`", None),
    ("  no-cont-batching: true", "--no-cont-batching is written `cont-batching: false`", None),
    ("  model: /models/x.gguf", "--model cannot be set in a recipe: metralectl names the checkpoint", None),
])
def test_a_misspelt_or_foreign_llamacpp_flag_is_refused_with_file_and_line(tmp_path: Path, line: str, fragment: str,
                                                                            hint: str | None) -> None:
    """Before any launch: the checker names the file, the line, the flag and the fix (llama.cpp's flags are the
    ones engine/llama-cpp.yaml declares, each checked against the pinned `llama-server --help`)."""
    from metralectl.core.catalog import check_files

    text = _FILES["qwen3.5-27b-llamacpp"].read_text().replace("  jinja: true\n", f"  jinja: true\n{line}\n")
    path = tmp_path / "qwen3.5-27b-llamacpp.yaml"
    path.write_text(text)
    [(_, recipe, problems)] = check_files(catalog(), [path])
    errors = [p for p in problems if p.severity == "error"]
    assert recipe is None and len(errors) == 1, [p.render() for p in problems]
    [problem] = errors
    expected_line = text.splitlines().index(line) + 1
    assert problem.file.endswith("qwen3.5-27b-llamacpp.yaml") and problem.line == expected_line
    assert fragment in problem.message
    if hint is not None:
        assert problem.hint == hint
    assert f":{expected_line}:" in problem.render()
