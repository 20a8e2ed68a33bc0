"""A plain aligned table for the terminal (cheap: `list` must start fast, so no rich here)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from metralectl.present.style import style


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[int] = ()) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)]
        return "  ".join(parts).rstrip()

    out = [style(line(headers), "1", sys.stdout)]
    out += [line(r) for r in rows]
    return "\n".join(out)
