"""Arbitrary YAML (text or structures) never crashes the checker: it yields a recipe or problems."""

from __future__ import annotations

import string
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metralectl.core.catalog import check_files
from tests.unit.recipe_helpers import catalog, flagship_data

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(["off", "on", "auto", "yes", "true", "0.0.0.0", "nvfp4"]))
keys = st.one_of(st.text(string.ascii_lowercase + "-_.", min_size=1, max_size=24),
                 st.sampled_from(["serve", "resources", "ranks", "env", "checkpoint", "max-seq-len", "port",
                                  "speculative", "METRALE_X", "extends", "role"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(keys, inner, max_size=5)), max_leaves=20)


def _check(tmp_path: Path, text: str) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(text.encode("utf-8", "replace"))  # lone surrogates become '?'; all else is kept
    [(_, recipe, problems)] = check_files(catalog(), [path])
    assert recipe is not None or problems
    for problem in problems:
        assert problem.render()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=300))
def test_arbitrary_text(tmp_path: Path, text: str) -> None:
    _check(tmp_path, text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values)
def test_arbitrary_structures(tmp_path: Path, data: object) -> None:
    _check(tmp_path, yaml.safe_dump(data))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["serve", "resources", "checkpoint", "env", "validated", None]), keys, values),
                max_size=4))
def test_mutated_flagship(tmp_path: Path, edits: list) -> None:
    data = flagship_data()
    for section, key, value in edits:
        target = data if section is None else data.setdefault(section, {})
        if isinstance(target, dict):
            target[key] = value
    _check(tmp_path, yaml.safe_dump(data))
