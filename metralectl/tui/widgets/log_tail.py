"""The engine's log: a Log widget that takes lines in batches and keeps at most `max_lines`.

Lines arrive through a Coalescer (one message per burst, however many lines), so following
thousands of lines per second costs one append and one repaint per frame, not one per line.

Every line is the engine's own text: it is escaped as `metralectl logs` escapes it uncoloured
(safetext.log_line) whichever method writes it; Log reads no markup, but would pass ESC, C1 and bidi
characters to the terminal and split a line at U+2028 or NEL.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from textual.widgets import Log

from metralectl.safetext import printable
from metralectl.tui.outside import log

MAX_LINES = 5000


class LogTail(Log):
    def __init__(self, *, max_lines: int = MAX_LINES, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(max_lines=max_lines, auto_scroll=True, id=id, classes=classes)
        self.received = 0

    def append(self, lines: Sequence[str]) -> None:
        if not lines:
            return
        self.received += len(lines)
        if self.max_lines and len(lines) > self.max_lines:
            lines = lines[-self.max_lines:]
        self.write_lines(lines)

    def write_lines(self, lines: Iterable[str], scroll_end: bool | None = None) -> LogTail:
        return super().write_lines([log(x) for x in lines], scroll_end)  # write_line comes here too

    def write(self, data: str, scroll_end: bool | None = None) -> LogTail:
        return super().write(printable(data), scroll_end)  # not used here; its line breaks kept

    def on_resize(self) -> None:
        if self.auto_scroll:  # lines written before the first layout: start at the newest
            self.scroll_end(animate=False, x_axis=False)

    @property
    def following(self) -> bool:
        return self.auto_scroll

    def toggle_follow(self) -> bool:
        self.auto_scroll = not self.auto_scroll
        if self.auto_scroll:
            self.scroll_end(animate=False)
        return self.auto_scroll
