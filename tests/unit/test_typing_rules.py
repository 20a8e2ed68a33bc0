"""The typing rules the code keeps (docs/development.md, Conventions): nothing below the front ends
returns a bare `Any`, one name for "a JSON-ready dict of this value", and the stricter mypy rules for
core/ and seams/ stay in pyproject.toml (CI runs `mypy metralectl` with them)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "metralectl"
FRONT_ENDS = ("cli", "tui", "agent")
# Returns left as Any on purpose, each with its reason next to it in the code.
ALLOWED_ANY = {
    "core/yamlsrc.py:_merge", "core/yamlsrc.py:build", "core/yamlsrc.py:_scalar",  # YAML trees, checked downstream
}


def _functions() -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((rel, node))
    return out


def _bare_any(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    text = ast.unparse(annotation).replace(" ", "")
    return text in ("Any", "Any|None", "None|Any", "Optional[Any]", "typing.Any")


def test_nothing_below_the_front_ends_returns_a_bare_any() -> None:
    found = {f"{rel}:{fn.name}" for rel, fn in _functions()
             if rel.split("/")[0] not in FRONT_ENDS and _bare_any(fn.returns)}
    assert found == ALLOWED_ANY, ("give these a real type (or say why not and list them here)",
                                  sorted(found - ALLOWED_ANY), sorted(ALLOWED_ANY - found))


def test_bare_any_is_recognised() -> None:
    # the rule above must be able to fail: these are the spellings it looks for
    for text, bare in (("Any", True), ("Any | None", True), ("dict[str, Any]", False), ("object", False)):
        assert _bare_any(ast.parse(text, mode="eval").body) is bare, text


def test_one_serialisation_name() -> None:
    other = sorted(f"{rel}:{fn.name}" for rel, fn in _functions() if fn.name in ("to_dict", "as_json", "as_dict"))
    assert other == [], f"a value's JSON-ready dict is to_json(): rename {other}"


def test_core_and_seams_are_checked_strictly() -> None:
    if sys.version_info < (3, 11):
        pytest.skip("tomllib is Python 3.11+")
    import tomllib

    overrides = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    strict = [o for o in overrides if {"metralectl.core.*", "metralectl.seams.*"} <= set(o["module"])]
    assert strict, "pyproject.toml lost the [[tool.mypy.overrides]] for core/ and seams/"
    for key in ("disallow_untyped_defs", "disallow_incomplete_defs", "warn_return_any"):
        assert strict[0].get(key) is True, key
    commands = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines() if not line.lstrip().startswith("#")]
    assert any(line.endswith("-m mypy metralectl") and "python" in line.split()[0] for line in commands), commands
