"""A small bar chart of a metric's recent history, with optional horizontal reference lines
(the thermal park/resume lines, a memory budget). Drawn with eighth blocks through the line API
(one Strip per row, built once per data change): cheap enough to redraw every second at 200×50.
Colours come from the stylesheet's component classes, so light and dark themes both work."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.strip import Strip
from textual.widget import Widget

from metralectl.tui.chart_data import RefLine

BLOCKS = " ▁▂▃▄▅▆▇█"
SEVERITY = {"error": 0, "warn": 1, "muted": 2}


class Chart(Widget):
    COMPONENT_CLASSES = {"chart--title", "chart--value", "chart--bar", "chart--warn", "chart--error",
                         "chart--muted", "chart--unknown"}

    def __init__(self, title: str, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.title = title
        self._values: list[float | None] = []
        self._current = "-"
        self._lines: tuple[RefLine, ...] = ()
        self._y_max: float | None = None
        self._note = ""
        self._strips: list[Strip] | None = None
        self._strips_for: tuple[int, int] = (0, 0)
        self._style_cache: dict[str, Style] | None = None
        self._shown: tuple[object, ...] | None = None

    def set_data(self, values: Sequence[float | None], current: str, *, lines: Sequence[RefLine] = (),
                 y_max: float | None = None, note: str = "") -> None:
        """The newest value last; `current` is the headline text; `y_max` fixes the scale (else auto)."""
        self._values = list(values[-512:])
        self._current = current
        self._lines = tuple(lines)
        self._y_max = y_max
        self._note = note
        # What the strips are drawn from: when it is what is on screen already (no GPU, an idle engine, a
        # history longer than the width that shifts only unknowns), there is nothing to repaint.
        width = self.size.width or len(self._values)
        shown = (self._values[-width:], current, self._lines, y_max, note, self._scale())
        if shown == self._shown:
            return
        self._shown = shown
        self._strips = None
        self.refresh()

    @property
    def current(self) -> str:
        return self._current

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips = self._style_cache = None  # the theme changed: colours must be looked up again

    def _scale(self) -> float:
        known = [v for v in self._values if v is not None and math.isfinite(v)]
        top = max([*known, *(line.value for line in self._lines), 0.0])
        if self._y_max is not None:
            return max(self._y_max, top)
        return top * 1.1 if top > 0 else 1.0

    def _styles(self) -> dict[str, Style]:
        """The base style and each component's, combined once per theme (rich_style is not free)."""
        if self._style_cache is None:
            base = self.rich_style
            self._style_cache = {"": base, **{name: base + self.get_component_rich_style(name)
                                              for name in self.COMPONENT_CLASSES}}
        return self._style_cache

    def headline(self, width: int, styles: dict[str, Style] | None = None) -> Text:
        """Title left, current value right; the note fills what is left (truncated first)."""
        styles = styles or self._styles()
        head = Text(self.title, style=styles["chart--title"])
        value = Text(self._current, style=styles["chart--value"])
        room = width - head.cell_len - value.cell_len - 1
        out = head.copy()
        if self._note and room > 4:
            note = Text(f" {self._note}", style=styles["chart--muted"])
            note.truncate(room - 1, overflow="ellipsis")
            out.append_text(note)
        out.append(" " * max(1, width - out.cell_len - value.cell_len), style=styles[""])
        out.append_text(value)
        out.truncate(width)
        return out

    def _line_rows(self, rows: int, scale: float) -> dict[int, RefLine]:
        placed: dict[int, RefLine] = {}
        for line in self._lines:
            at = min(rows - 1, max(0, int(line.value / scale * rows)))
            if at in placed:  # two lines in one row (3 rows cannot tell 70 from 80): one row, both labels
                other = placed[at]
                kind = min((line.kind, other.kind), key=lambda k: SEVERITY.get(k, 9))
                line = RefLine(max(line.value, other.value), f"{other.label}/{line.label}", kind)
            placed[at] = line
        return placed

    def _build(self, width: int, height: int) -> list[Strip]:
        styles = self._styles()
        head = self.headline(width, styles)
        strips = [Strip(list(head.render(self.app.console)), width).adjust_cell_length(width, styles[""])]
        rows = height - 1
        if rows <= 0:
            return strips
        scale = self._scale()
        columns = self._values[-width:]
        pad = width - len(columns)
        bar, unknown, blank = styles["chart--bar"], styles["chart--unknown"], styles[""]
        refs = self._line_rows(rows, scale)
        for r in range(rows):
            level_row = rows - 1 - r  # 0 = bottom row
            ref = refs.get(level_row)
            ref_style = styles[f"chart--{ref.kind}"] if ref else blank
            cells: list[tuple[str, Style]] = []
            for i in range(width):
                v = columns[i - pad] if i >= pad else None
                if v is None or not math.isfinite(v):
                    if i >= pad and level_row == 0:
                        cells.append(("·", unknown))
                    else:
                        cells.append(("╌", ref_style) if ref else (" ", blank))
                    continue
                fill = max(0, min(8, round(v / scale * rows * 8) - level_row * 8))
                cells.append(("╌", ref_style) if fill == 0 and ref else (BLOCKS[fill], bar))
            if ref is not None and width > len(ref.label) + 2:
                label = f" {ref.label}"
                cells = cells[: width - len(label)] + [(ch, ref_style) for ch in label]
            elif r == 0:  # the top row says what the full height is worth, and the highest value shown
                label = self._scale_label(scale, columns)
                if label and width > len(label) + 8:
                    cells = cells[: width - len(label)] + [(ch, styles["chart--muted"]) for ch in label]
            strips.append(Strip(_runs(cells), width))
        return strips

    @staticmethod
    def _scale_label(scale: float, columns: Sequence[float | None]) -> str:
        known = [v for v in columns if v is not None and math.isfinite(v)]
        if not known:
            return ""
        return f" top {_num(scale)} · peak {_num(max(known))}"

    def render_line(self, y: int) -> Strip:
        width, height = self.size.width, self.size.height
        if self._strips is None or self._strips_for != (width, height):
            self._strips = self._build(width, height) if width > 0 and height > 0 else []
            self._strips_for = (width, height)
        return self._strips[y] if 0 <= y < len(self._strips) else Strip.blank(width, self.rich_style)


def _num(value: float) -> str:
    """Three significant figures, no exponent for the sizes charts hold (0.12, 86.4, 1.23k)."""
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.3g}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:.3g}k"
    return f"{value:.3g}" if magnitude >= 0.01 or value == 0 else f"{value:.1e}"


def _runs(cells: list[tuple[str, Style]]) -> list[Segment]:
    """Adjacent cells of one style become one Segment."""
    segments: list[Segment] = []
    text: list[str] = []
    style: Style | None = None
    for ch, st in cells:
        if st is not style and text:
            segments.append(Segment("".join(text), style))
            text = []
        style = st
        text.append(ch)
    if text:
        segments.append(Segment("".join(text), style))
    return segments
