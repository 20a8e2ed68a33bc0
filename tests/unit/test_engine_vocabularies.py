"""The words of an engine file's closed vocabularies are Literal types (issue 30 item 1): a branch over one
that misses a word fails mypy, not a user at run time."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import get_args

from metralectl.core import contract, engine_profile as P

from tests.unit.recipe_helpers import REPO

BRANCHES = '''
from __future__ import annotations
from metralectl.core.engine_profile import {type}, unreachable

def act(word: {type}) -> str:
{branches}
    unreachable(word)
'''


def _mypy(tmp_path: Path, type_name: str, words: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    branches = "\n".join(f"    if word == {w!r}:\n        return {w!r}" for w in words)
    source = tmp_path / "branches.py"
    source.write_text(textwrap.dedent(BRANCHES).format(type=type_name, branches=branches))
    return subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent",
                           "--cache-dir", str(tmp_path / "cache"), str(source)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


def test_a_branch_that_misses_a_readiness_style_fails_mypy(tmp_path: Path) -> None:
    styles = get_args(P.ReadinessStyleName)
    missing = _mypy(tmp_path, "ReadinessStyleName", styles[:-1])
    assert missing.returncode == 1 and "unreachable" in missing.stdout and styles[-1] in missing.stdout, missing.stdout
    assert _mypy(tmp_path, "ReadinessStyleName", styles).returncode == 0


def test_the_vocabularies_are_their_literals() -> None:
    assert P.READINESS_STYLES == get_args(P.ReadinessStyleName) == ("health-when-loaded", "warm-up-marker", "lazy-load")
    assert P.MODEL_ARGUMENT_FORMS == get_args(P.ModelArgumentForm)
    assert tuple(P.MEMORY_MEANINGS) == get_args(P.MemoryMeaning)
    assert P.WEIGHT_FORMATS == get_args(P.WeightFormat)
    assert P.RULES == get_args(P.RuleName)
    assert contract.MULTI_RANK_STRATEGIES == get_args(contract.MultiRank)
    assert set(P.RENAMED_READINESS_STYLES.values()) <= set(P.READINESS_STYLES)
