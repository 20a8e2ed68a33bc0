"""Build recipe files for checker tests from the shipped flagship."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from metralectl.core.catalog import Catalog, check_files, load_catalog
from metralectl.errors import Problem
from metralectl.core.yamlsrc import load_text

REPO = Path(__file__).resolve().parents[2]
FLAGSHIP = REPO / "recipes" / "qwen3.5-35b-a3b.yaml"
_CATALOG: Catalog | None = None


def catalog() -> Catalog:
    global _CATALOG
    if _CATALOG is None:
        _CATALOG = load_catalog(include_user=False)
    return _CATALOG


def read(path: Path) -> dict[str, Any]:
    """A recipe's data as metralectl reads it (YAML 1.2 booleans: `off` stays a word)."""
    return copy.deepcopy(load_text(path.read_text(), str(path)).data)


def flagship_data() -> dict[str, Any]:
    return read(FLAGSHIP)


def write(tmp_path: Path, data: dict[str, Any] | str, name: str = "qwen3.5-35b-a3b.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def check(tmp_path: Path, data: dict[str, Any] | str, name: str = "qwen3.5-35b-a3b.yaml") -> list[Problem]:
    path = write(tmp_path, data, name)
    [(_, _, problems)] = check_files(catalog(), [path])
    return problems


def errors(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if p.severity == "error"]


def one_error(problems: list[Problem], key: str | None = None) -> Problem:
    errs = errors(problems)
    if key is not None:
        errs = [p for p in errs if p.key == key]
    assert len(errs) == 1, "\n".join(p.render() for p in errors(problems))
    return errs[0]
