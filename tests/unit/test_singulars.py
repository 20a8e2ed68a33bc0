"""A count and its noun agree: `1 file`, never `1 files` nor `file(s)` (metralectl/wording.py).

Two ways: the main commands run through the real entry point in situations where their counts are 1 (a
one-file GGUF quant pulled from tests/fakehub, shown, planned for removal; a user recipe with one
problem; doctor) and their output is scanned for the common wrong forms; and the package's source
holds no `(s)` and no hand-made plural (`'s' if n != 1`) in its text, so a new count goes through the helper.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from metralectl.wording import count, noun
from tests.fakehub.server import FakeHub, FakeRepo
from tests.unit.test_gguf_weights import REPO, RECIPE, repo_files, serve

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE = REPO_ROOT / "metralectl"
NOUNS = ("files", "runs", "items", "records", "requests", "units", "nodes", "ranks", "problems", "warnings",
         "entries", "paths", "events", "models", "layers", "connections", "samples", "symbols", "removals",
         "recipes", "lines", "outputs", "times", "variables", "kv-heads", "parts", "downloads", "checks",
         "containers", "images", "specs", "keys", "fields", "workers", "peers", "jobs", "steps")
WRONG = re.compile(rf"(?<![\d.,/])\b1 (?:[a-z-]+ )?(?:{'|'.join(NOUNS)})\b|[a-z]\(s\)")


def wrong_forms(text: str) -> list[str]:
    return [m.group(0) for m in WRONG.finditer(text.replace("http(s)", "http"))]


def test_the_helper() -> None:
    assert [count(n, "file") for n in (0, 1, 2)] == ["0 files", "1 file", "2 files"]
    assert count(1, "entry", "entries") == "1 entry" and count(3, "entry", "entries") == "3 entries"
    assert count(1.0, "request") == "1 request" and count(2.5, "request") == "2.5 requests"
    assert noun(1, "is", "are") == "is" and noun(4, "is", "are") == "are"
    assert wrong_forms("1 files; 1 measured requests; item(s); 11 files; 0/1 file; 1 file") == [
        "1 files", "1 measured requests", "m(s)"]


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    yield from serve(FakeRepo.build(REPO, repo_files()))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DOCKER_HOST": f"unix://{os.environ['METRALECTL_LOCK_DIR']}/no-docker.sock"}
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, timeout=120)


def test_main_commands_with_counts_of_one(hub: FakeHub) -> None:
    recipes = Path(os.environ["METRALECTL_CONFIG_DIR"]) / "recipes"
    recipes.mkdir()
    # one GGUF file: Q4_K_M is a single file in the fake repository (UD-Q4_K_XL, the recipe's, is split in two)
    (recipes / "one-file.yaml").write_text(f"extends: {RECIPE}\nname: one-file\ncheckpoint:\n  quant: Q4_K_M\n")
    runs = {"pull": cli("pull", "one-file", "--weights-only"), "show": cli("show", "one-file"),
            "rm --dry-run": cli("rm", "one-file", "--dry-run")}
    assert runs["pull"].returncode == 0, runs["pull"].stderr
    assert "1 file" in runs["pull"].stderr and "1 file" in runs["show"].stdout, (runs["pull"].stderr, runs["show"].stdout)
    assert "1 item" in runs["rm --dry-run"].stderr, runs["rm --dry-run"].stderr
    # a user recipe with exactly one problem
    (recipes / "broken.yaml").write_text(f"extends: {RECIPE}\nname: broken\nno-such-key: 1\n")
    runs |= {"list": cli("list"), "recipes check": cli("recipes", "check"), "doctor": cli("doctor", "--recipe", "one-file")}
    assert "(1 problem)" in runs["list"].stderr, runs["list"].stderr
    found = {name: wrong_forms(out.stdout + out.stderr) for name, out in runs.items()}
    assert not any(found.values()), found


def _fstring_texts(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            for part in node.values:
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    yield node.lineno, part.value


def _hand_made_plurals(tree: ast.AST) -> Iterator[int]:
    """`'s' if n != 1 else ''` and its kin ('es', 'ies', 'y')."""
    suffixes = {"s", "es", "ies", "y", "ve"}
    for node in ast.walk(tree):
        if isinstance(node, ast.IfExp) and any(isinstance(b, ast.Constant) and b.value in suffixes
                                               for b in (node.body, node.orelse)):
            yield node.lineno


def test_the_source_counts_through_the_helper() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(REPO_ROOT)
        found += [f"{where}:{line}: {text.strip()!r}" for line, text in _fstring_texts(tree)
                  if re.search(r"[a-z]\(s\)", text.replace("http(s)", ""))]
        found += [f"{where}:{line}: a plural made by hand" for line in _hand_made_plurals(tree)]
    assert not found, "use metralectl.wording.count / noun:\n" + "\n".join(found)
