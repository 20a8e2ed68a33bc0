"""A plain aligned table for the terminal (cheap: `list` must start fast, so no rich here).

Every cell and header is escaped (safetext.clean) before it is measured or printed: a cell may hold a
container's label, a peer's name, a run's model or a recipe's field, and no table is a way to the terminal.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Collection, Sequence
from typing import TextIO

from metralectl.present.style import style
from metralectl.safetext import clean

GAP = 2  # spaces between columns


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[int] = (),
                 hide: Collection[str] = ()) -> str:
    """The table; `right` are indexes of right-aligned columns, `hide` headers of columns left out."""
    keep = [i for i, h in enumerate(headers) if h not in hide]
    headers = [clean(str(headers[i])) for i in keep]
    rows = [[clean(str(row[i])) for i in keep] for row in rows]
    right = [keep.index(i) for i in right if i in keep]
    widths = column_widths(headers, rows)

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)]
        return (" " * GAP).join(parts).rstrip()

    out = [style(line(headers), "1", sys.stdout)]
    out += [line(r) for r in rows]
    return "\n".join(out)


def column_widths(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    widths = [len(clean(h)) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(clean(cell)))
    return widths


def to_fit(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int | None,
           optional: Sequence[str]) -> list[str]:
    """The optional columns to leave out, taken in the order given (least needed first), until the table is at
    most `width` characters wide; none when width is None. What is left may still be wider: the rest is needed."""
    if width is None:
        return []
    widths = dict(zip(headers, column_widths(headers, rows)))
    total = sum(widths.values()) + GAP * (len(headers) - 1)
    hidden: list[str] = []
    for name in optional:
        if total <= width:
            break
        if name in widths:
            total -= widths[name] + GAP
            hidden.append(name)
    return hidden


def terminal_width(stream: TextIO = sys.stdout) -> int | None:
    """The width of the terminal `stream` writes to (COLUMNS when set, as `ls` and Click take it); None when it is
    not a terminal: a pipe or a file gets every column, for the program that reads it."""
    try:
        if not stream.isatty():
            return None
        columns = os.environ.get("COLUMNS", "")
        if columns.isdigit() and int(columns) > 0:
            return int(columns)
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return None
