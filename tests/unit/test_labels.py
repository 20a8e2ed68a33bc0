"""The one label table (core/labels.py): the names are a contract with containers an earlier version
started, so they are pinned here; no other module may spell a label out or define its own LABEL_ name;
every label the docs and golden files show is one of them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from metralectl.core import labels

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "metralectl"
TABLE = "core/labels.py"


def test_the_names_never_change() -> None:
    assert labels.ALL == (
        "ai.metrale.metralectl.managed", "ai.metrale.metralectl.recipe", "ai.metrale.metralectl.spec-hash",
        "ai.metrale.metralectl.owner", "ai.metrale.metralectl.rank", "ai.metrale.metralectl.run-id",
        "ai.metrale.metralectl.endpoint", "ai.metrale.metralectl.sets", "ai.metrale.metralectl.engine",
        "ai.metrale.metralectl.probe", "ai.metrale.metralectl.doctor", "ai.metrale.metralectl.engine-auth",
        "ai.metrale.metralectl.gpu-ids")


def test_all_lists_every_label_of_the_table() -> None:
    names = {v for k, v in vars(labels).items() if k.startswith("LABEL_") and k != "LABEL_PREFIX"}
    assert names == set(labels.ALL) and len(labels.ALL) == len(set(labels.ALL))


def stray_labels(root: Path) -> list[str]:
    """Label literals (also inside f-strings) and LABEL_ definitions outside the table."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == TABLE:
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and labels.LABEL_PREFIX in node.value:
                found.append(f"{rel}:{node.lineno}: spells out {node.value!r}")
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found += [f"{rel}:{node.lineno}: defines {t.id}" for t in targets
                          if isinstance(t, ast.Name) and t.id.startswith("LABEL_")]
    return found


def test_no_module_spells_out_or_defines_a_label() -> None:
    assert stray_labels(PACKAGE) == []


def test_the_check_finds_a_stray_label(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text('LABEL_X = "ai.metrale.metralectl.x"\n'
                                     'def f(c, n):\n    return c.labels.get(f"ai.metrale.metralectl.{n}")\n')
    assert sorted(stray_labels(tmp_path)) == ["mod.py:1: defines LABEL_X",
                                              "mod.py:1: spells out 'ai.metrale.metralectl.x'",
                                              "mod.py:3: spells out 'ai.metrale.metralectl.'"]


def test_every_label_in_the_docs_and_tests_is_in_the_table() -> None:
    """A renamed label in prose or a golden file (`ai.metrale.metralectl.seams.endpoint`) is caught here."""
    pattern = re.compile(re.escape(labels.LABEL_PREFIX) + r"\.[a-z0-9-]+(?:\.[a-z0-9-]+)*")
    unknown = []
    files = [*(REPO / "docs").rglob("*.md"), REPO / "README.md", *(REPO / "tests").rglob("*.py"),
             *(REPO / "tests" / "golden").glob("*")]
    for path in files:
        if path.is_file() and path.resolve() != Path(__file__).resolve():
            for match in pattern.finditer(path.read_text(errors="replace")):
                if match.group(0) not in labels.ALL:
                    unknown.append(f"{path.relative_to(REPO)}: {match.group(0)}")
    assert unknown == []
