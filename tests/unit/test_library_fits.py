"""FITS is judged against this box: its class (as the driver names its GPU), one node, and the memory."""

from __future__ import annotations

import pytest

from metralectl.app import library
from metralectl.core.catalog import Catalog, load_catalog


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def judged(catalog: Catalog, name: str, target: library.Target) -> library.LibraryRow:
    return library.row(catalog, catalog.recipes[name], target)


def test_detected_class_fits_by_memory(catalog: Catalog) -> None:
    row = judged(catalog, "qwen3.5-35b-a3b", library.Target("gb10", "detected NVIDIA GB10", "NVIDIA GB10", ("NVIDIA GB10",)))
    assert row.fits is True and row.nodes == 1 and " of " in row.fits_reason and row.fits_reason.endswith("GB")


def test_another_class_does_not_fit(catalog: Catalog) -> None:
    row = judged(catalog, "qwen3.5-35b-a3b-hopper", library.Target("gb10", "detected NVIDIA GB10", "NVIDIA GB10"))
    assert row.fits is False and row.fits_reason == "built for hopper, this is gb10"


def test_two_node_recipe_on_one_box(catalog: Catalog) -> None:
    row = judged(catalog, "deepseek-v4-flash-ep2", library.Target("gb10", "--hardware"))
    # its memory estimate is unknown (MLA latent KV), but the nodes alone rule it out: `no`, not `?`
    assert row.memory_gb is None
    assert row.nodes == 2 and row.fits is False and row.fits_reason.startswith("needs 2 nodes")


def test_no_gpu_is_a_no_and_an_unknown_gpu_a_question(catalog: Catalog) -> None:
    bare = judged(catalog, "qwen3.5-35b-a3b", library.Target(None, "none detected (no NVIDIA GPU)"))
    assert bare.fits is False and "no NVIDIA GPU" in bare.fits_reason
    assert bare.memory_gb is not None  # still estimated on the recipe's own class, for the reader
    odd = judged(catalog, "qwen3.5-35b-a3b", library.Target(None, "none detected (Tesla T4)", None, ("Tesla T4",)))
    assert odd.fits is None and "Tesla T4" in odd.fits_reason and "none of the known classes" in odd.fits_reason


def test_unknown_memory_names_what_is_missing(catalog: Catalog) -> None:
    row = judged(catalog, "gemma-4-26b-a4b-llamacpp", library.Target("gb10", "--hardware"))
    assert row.fits is None and row.fits_reason.startswith("memory estimate unknown (") and "weights" in row.fits_reason


def test_filled_model_facts_give_an_estimate(catalog: Catalog) -> None:
    """Nemotron-3-Super's KV facts come from its config.json: the estimate and FITS are known."""
    row = judged(catalog, "nemotron-3-super-120b-a12b", library.Target("gb10", "--hardware"))
    assert row.memory_gb is not None and row.fits is True


def test_a_recipe_over_more_gpus_than_the_box_has_does_not_fit_it(catalog: Catalog) -> None:
    from metralectl.core.overrides import apply_sets

    wide = apply_sets(catalog, catalog.recipes["qwen3.6-35b-a3b-vllm"], ["serve.tensor-parallel-size=2"])
    spark = library.Target("gb10", "detected NVIDIA GB10", "NVIDIA GB10", ("NVIDIA GB10",))
    row = library.row(catalog, wide, spark)
    assert row.fits is False and "spreads the model over 2 GPUs, this box has 1" in row.fits_reason, row.fits_reason
    assert "spreads" not in library.row(catalog, catalog.recipes["qwen3.6-35b-a3b-vllm"], spark).fits_reason
    assert "spreads" not in library.row(catalog, wide, library.Target("gb10", "--hardware")).fits_reason  # not seen
