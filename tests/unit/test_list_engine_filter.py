"""`list --engine` and `search --engine` (issue 30 item 6): the rows of one engine; an engine no recipe uses
is a usage error with a suggestion, nothing on stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.recipe_helpers import REPO


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "METRALECTL_CONFIG_DIR": str(tmp_path / "config"),
           "METRALECTL_CACHE_DIR": str(tmp_path / "cache"), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, cwd=REPO,
                          env=env, stdin=subprocess.DEVNULL, timeout=120)


@pytest.mark.parametrize("engine", ["llama-cpp", "vllm"])
def test_list_engine_keeps_only_that_engines_recipes(tmp_path: Path, engine: str) -> None:
    every = json.loads(run(tmp_path, "list", "--json").stdout)["recipes"]
    out = run(tmp_path, "list", "--engine", engine, "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["recipes"]
    assert rows and [r["name"] for r in rows] == [r["name"] for r in every if r["engine"] == engine]


def test_search_engine_combines_with_the_words(tmp_path: Path) -> None:
    found = json.loads(run(tmp_path, "search", "--json", "qwen").stdout)["recipes"]
    out = run(tmp_path, "search", "--engine", "llama-cpp", "--json", "qwen")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["recipes"]
    assert rows and [r["name"] for r in rows] == [r["name"] for r in found if r["engine"] == "llama-cpp"]
    assert len(rows) < len(found)  # the words matched other engines' recipes too


def test_an_engine_without_recipes_is_a_usage_error_with_a_suggestion(tmp_path: Path) -> None:
    out = run(tmp_path, "list", "--engine", "llama-ccp")
    assert out.returncode == 64 and out.stdout == ""
    assert out.stderr.splitlines()[0] == "metralectl: no recipe is for engine 'llama-ccp'"
    assert "did you mean `llama-cpp`?" in out.stderr and "Traceback" not in out.stderr
