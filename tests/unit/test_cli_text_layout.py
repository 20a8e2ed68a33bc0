"""How the CLI lays out its text, through the real entry point: `show`'s keys and values apart whatever the
key's length."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.unit.recipe_helpers import REPO


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                          env=dict(os.environ), cwd=REPO, timeout=60)


def longest_engine_key(config: Path) -> tuple[str, str]:
    """The longest serve key any shipped engine file names, and a recipe that sets it: a shipped one, else a user
    recipe written into `config` from a shipped recipe of that engine (no shipped recipe needs every flag)."""
    import yaml

    from metralectl.core.catalog import load_catalog

    catalog = load_catalog(include_user=False)
    engine, key = max(((name, k) for name, e in catalog.engines.items() for k in e.flags), key=lambda p: len(p[1]))
    users = [r.name for r in catalog.recipes.values() if key in r.serve]
    if users:
        return key, users[0]
    base = next(r for r in catalog.recipes.values() if r.engine == engine)
    data = yaml.safe_load(Path(base.origin.path).read_text())
    kind = catalog.engines[engine].flags[key].type
    data["name"] = "longest-key"
    data["serve"][key] = True if kind == "flag" else 1 if kind == "int" else "x"
    (config / "recipes").mkdir(parents=True, exist_ok=True)
    (config / "recipes" / "longest-key.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return key, "longest-key"


def test_show_keeps_the_longest_engine_key_apart_from_its_value(isolated_env: Path) -> None:
    key, recipe = longest_engine_key(isolated_env / "config")
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
