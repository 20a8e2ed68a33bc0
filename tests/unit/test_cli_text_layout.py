"""How the CLI lays out its text, through the real entry point: `show`'s keys and values apart whatever the
key's length."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.unit.recipe_helpers import REPO


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                          env=dict(os.environ), cwd=REPO, timeout=60)


def longest_engine_key() -> tuple[str, str]:
    """The longest serve key any shipped engine file names, and a shipped recipe that sets it."""
    from metralectl.core.catalog import load_catalog

    catalog = load_catalog(include_user=False)
    key = max((k for engine in catalog.engines.values() for k in engine.flags), key=len)
    users = [r.name for r in catalog.recipes.values() if key in r.serve]
    assert users, f"no shipped recipe sets {key}: give this test a user recipe that does"
    return key, users[0]


def test_show_keeps_the_longest_engine_key_apart_from_its_value() -> None:
    key, recipe = longest_engine_key()
    out = cli("show", recipe)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    start = lines.index("Serve settings") + 1
    settings = lines[start:lines.index("", start)]
    assert settings, out.stdout
    columns = set()
    for text in settings:
        m = re.fullmatch(r"  (\S+)( {2,})(\S.*)", text)
        assert m, f"key and value run together: {text!r}"
        columns.add(m.start(3))
    assert len(columns) == 1, f"values not in one column: {sorted(columns)}"
    assert any(t.split()[0] == key for t in settings), key
    # booleans as the recipe writes them, not Python's True/False
    assert not [t for t in settings if t.split()[-1] in ("True", "False")], settings
