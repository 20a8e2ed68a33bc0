"""What the three front ends say about a library row, in one wording: why FITS is not `yes` (`list`'s
footnotes, the line under the dashboard's Library, the page's Fits cell) and why Run/Swap cannot be
asked for (the dashboard's disabled keys, the page's disabled buttons; app/library.blocked computes it).

Pure and import-free: `list` (cli/catalog_list.py) reads its rows from app/library_cache.py and
calls this without loading the catalog.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

_SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def fit_words(fits: bool | None, reason: str) -> str | None:
    """Why a recipe does not (`no`) or may not (`?`) fit this box, as every front end shows it; None when
    it fits (its reason is then the memory arithmetic, which MEM GB already shows)."""
    if fits is True or not reason:
        return None
    return reason


def fit_cell(fits: bool | None) -> str:
    return "?" if fits is None else ("yes" if fits else "no")


def mark(number: int) -> str:
    """A footnote's mark: ¹, ², … ¹⁰."""
    return str(number).translate(_SUPERSCRIPT)


def footnotes(judged: Iterable[tuple[bool | None, str]]) -> tuple[list[str], list[str]]:
    """`list`'s FITS cells and its footnotes: each `no`/`?` cell carries the mark of its reason, each distinct
    reason is one footnote (numbered in the order the rows first meet it)."""
    cells: list[str] = []
    numbered: dict[str, int] = {}
    for fits, reason in judged:
        words = fit_words(fits, reason)
        if words is None:
            cells.append(fit_cell(fits))
            continue
        number = numbered.setdefault(words, len(numbered) + 1)
        cells.append(fit_cell(fits) + mark(number))
    return cells, [f"{mark(n)} {words}" for words, n in numbered.items()]


def footnote_block(lines: Sequence[str], label: str = "FITS") -> list[str]:
    """The footnotes under a table: the first after the column's name, the others aligned below it."""
    return [f"{label if i == 0 else ' ' * len(label)} {line}" for i, line in enumerate(lines)]
