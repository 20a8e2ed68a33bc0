"""The shipped recipes are the engine's certified ones: what the importer makes of each upstream file,
apart from the deviations each one declares, each declared deviation real."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from metralectl.core.recipe import Recipe
from metralectl.core.recipe_import import ImportContext, UpstreamFile, convert
from metralectl.core.yamlsrc import load_file
from tests.unit.recipe_helpers import REPO, catalog

FIXTURES = REPO / "tests" / "unit" / "data" / "engine-recipes"
REFERENCE = Path("/work/shared/reference/recipes")  # the upstream bytes, where this machine has them
# Named from the files (no catalog at collection time: the tests' isolated cache is not set up yet).
# Metrale recipes re-expressed from the engine's own (other engines' recipes are checked in test_engine_scoped_rules)
ENGINE_NAMES = sorted(p.stem for p in (REPO / "recipes").glob("*.yaml")
                      if "extends:" not in p.read_text() and "\nengine: metrale\n" in p.read_text())


def _engine_recipes() -> list[Recipe]:
    return [catalog().recipes[name] for name in ENGINE_NAMES]


def _upstream(recipe: Recipe) -> Path:
    assert recipe.provenance is not None
    return FIXTURES / recipe.provenance.path.removeprefix("recipes/")


def _differences(ours: Recipe, theirs: Recipe, raw: dict[str, Any]) -> set[str]:
    """Where our recipe differs from the engine's: the converted settings, and for what the importer itself
    rewrites (the bind address, one port per node) the raw upstream values."""
    keys = {f"serve.{k}" for k in set(ours.serve) | set(theirs.serve) if ours.serve.get(k) != theirs.serve.get(k)}
    a, b = ours.resources, theirs.resources
    nodes, port = int(raw.get("min_nodes", 1)), raw["defaults"]["port"]
    for key, mine, other in (("resources.bind", a.bind, raw["defaults"].get("host", "127.0.0.1")),
                             ("resources.port", a.port, b.port),
                             ("resources.memory-utilization", a.memory_utilization, b.memory_utilization),
                             ("resources.tp-size", a.tp_size, b.tp_size), ("resources.ep-size", a.ep_size, b.ep_size),
                             ("resources.ranks", [r.port for r in a.ranks], [port] * nodes),
                             ("env", ours.env, theirs.env), ("checkpoint.repo", ours.checkpoint.repo, theirs.checkpoint.repo),
                             ("checkpoint.quant", ours.checkpoint.quant, theirs.checkpoint.quant)):
        if mine != other:
            keys.add(key)
    if raw["container"] != catalog().images[ours.image].ref:
        keys.add("image")
    return keys


def test_every_shipped_recipe_names_its_engine_revision_and_source() -> None:
    for path in sorted((REPO / "recipes").glob("*.yaml")):
        data = load_file(path).data
        recipe = catalog().recipes[data["name"]]
        assert recipe.engine_revision in catalog().engines[recipe.engine].revisions
        if recipe.engine != "metrale":
            continue  # no engine recipe to re-express: llama.cpp ships none
        if "extends" in data:
            assert data["source"] == "book", path  # the settings are an engine recipe's, the variant is the book's
            assert catalog().recipes[data["extends"]].source == "engine"
        else:
            assert "engine-revision" in data and data["source"] == "engine", path
    assert len(ENGINE_NAMES) == 18 and all(r.source == "engine" for r in _engine_recipes())


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_a_shipped_recipe_is_its_engine_recipe_but_for_declared_deviations(name: str) -> None:
    recipe = catalog().recipes[name]
    assert recipe.provenance is not None
    path = _upstream(recipe)
    data = path.read_bytes()
    revision = catalog().engines["metrale"].revisions[recipe.engine_revision]
    assert recipe.provenance.commit.startswith(revision.commit[:7])
    ctx = ImportContext(catalog(), revision, recipe.provenance.repo, revision.commit, None, "2026-12-01")
    result = convert(UpstreamFile(recipe.provenance.path[8:-5], recipe.provenance.path, data,
                                  hashlib.sha256(data).hexdigest()), ctx)
    assert result.recipe is not None, [p.render() for p in result.problems]
    assert result.pinned_defaults == []  # the engine's recipe pins everything itself
    declared = {key for key, *_ in recipe.provenance.deviations}
    assert _differences(recipe, result.recipe, load_file(path).data) == declared


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="the upstream recipe bytes are not on this machine")
@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_provenance_sha256_is_the_upstream_files(name: str) -> None:
    recipe = catalog().recipes[name]
    assert recipe.provenance is not None
    upstream = REFERENCE / recipe.provenance.path.removeprefix("recipes/")
    if not upstream.is_file():
        pytest.skip(f"{upstream} is not among the saved upstream files")
    assert hashlib.sha256(upstream.read_bytes()).hexdigest() == recipe.provenance.sha256


def test_the_fixtures_table_records_every_provenance_sha256() -> None:
    table = (FIXTURES / "README.md").read_text()
    for recipe in _engine_recipes():
        assert recipe.provenance is not None
        assert f"`{recipe.provenance.path.removeprefix('recipes/')}` | `{recipe.provenance.sha256}`" in table


def _serve(recipe: Recipe) -> dict[str, Any]:
    return recipe.serve


def test_contradicted_book_recipes_are_corrected() -> None:
    recipes = catalog().recipes
    mistral = recipes["mistral-small-4-119b"]
    assert not mistral.multi_rank and _serve(mistral)["kv-cache-dtype"] == "bf16"
    assert "mistral-small-4-119b-ep2" not in recipes
    assert _serve(recipes["minimax-m2.7-ep2"])["kv-cache-dtype"] == "bf16"
    flagship = recipes["qwen3.5-35b-a3b"]
    assert _serve(flagship)["max-batch-size"] == 2 and flagship.resources.memory_utilization == 0.85
    assert recipes["qwen3.6-35b-a3b-fp8"].mtp
    for name in ("deepseek-v4-flash-ep2", "qwen3.8-27b-throughput", "qwen3.6-35b-a3b"):
        assert recipes[name].source == "engine"
