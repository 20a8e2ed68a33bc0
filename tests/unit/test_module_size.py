"""Rooms small enough to hold in one's head: no module in metralectl/ is longer than 400 lines.

Lines are counted as `wc -l` counts them. A module that grows past the limit is split along a seam of
meaning (what a newcomer would guess), not cut at line 400. The one kind of exception is generated data
(a table a script writes), listed in GENERATED with the script that writes it; the package holds none
today. TEMPORARY names a module being split on another branch as this test landed; its entry goes when
that branch merges (the last test fails once an allowance is no longer needed).
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "metralectl"
LIMIT = 400

# path under metralectl/ -> the script that generates it (never hand-edited, so its length is not a room's)
GENERATED: dict[str, str] = {}
# path under metralectl/ -> who is splitting it; deleted when that lands
TEMPORARY: dict[str, str] = {}


def lines_of(path: Path) -> int:
    return path.read_bytes().count(b"\n")


def too_long(root: Path, allowed: set[str], limit: int = LIMIT) -> list[str]:
    """`path: N lines` for every .py under root longer than limit, but those allowed."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel not in allowed and lines_of(path) > limit:
            found.append(f"{rel}: {lines_of(path)} lines")
    return found


def test_no_module_is_longer_than_the_limit() -> None:
    found = too_long(PACKAGE, set(GENERATED) | set(TEMPORARY))
    assert not found, (f"modules over {LIMIT} lines (split each along a seam of meaning; docs/ARCHITECTURE.md "
                       "names what each module holds):\n" + "\n".join(found))


def test_every_allowance_is_still_needed() -> None:
    stale = [rel for rel in (*GENERATED, *TEMPORARY)
             if not (PACKAGE / rel).is_file() or lines_of(PACKAGE / rel) <= LIMIT]
    assert not stale, f"allowed modules that are gone or short now (delete their entries here): {stale}"


def test_the_check_finds_a_long_module(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "long.py").write_text("x = 1\n" * 401)
    (tmp_path / "short.py").write_text("x = 1\n" * 400)
    (tmp_path / "data.py").write_text("x = 1\n" * 900)
    assert too_long(tmp_path, {"data.py"}) == ["sub/long.py: 401 lines"]
