"""safetext: the one rule for outside text on a terminal (issue 27, class 5). markup() is checked against Rich's
own renderer (what it shows is what clean() shows, and no tag acts); log_line() against what an engine writes."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from metralectl.safetext import clean, log_line, markup, printable
from tests.unit.ptyterm import HOSTILE, unsafe


def _rendered(markup_text: str) -> str:
    out = io.StringIO()
    Console(file=out, width=1000, color_system=None, highlight=False, legacy_windows=False).print(markup_text)
    return out.getvalue().rstrip("\n")


@pytest.mark.parametrize("text", [
    HOSTILE, "[bold]x[/bold]", "[/]", "[link=http://evil.example/]click[/link]", "trailing \\", "\\[red]x",
    "\\\\[red]x[/red]", "[[red]]", "a [b] c", "[@click=app.quit]x[/]", "x\\", "[#ff0000]red", "nested [red][/red]",
])
def test_markup_is_shown_by_rich_exactly_as_clean_shows_it(text: str) -> None:
    assert _rendered(markup(text)) == clean(text)


def test_markup_caps_like_clean() -> None:
    assert _rendered(markup("[red]" + "x" * 100, 20)) == clean("[red]" + "x" * 100, 20)


def test_clean_and_printable_leave_nothing_that_acts_on_a_terminal() -> None:
    assert unsafe(clean(HOSTILE).encode()) == []
    assert unsafe(printable(HOSTILE + "\nline two\tcell").encode()) == []
    assert printable("a\nb\tc") == "a\nb\tc"
    assert clean("plain text, ü, 日本") == "plain text, ü, 日本"  # the fast path: nothing to escape


@pytest.mark.parametrize("line,color,shown", [
    ("INFO loading", False, "INFO loading"),
    ("\x1b[32mINFO\x1b[0m loading", False, "INFO loading"),  # the engine's colours dropped without ours
    ("\x1b[32mINFO\x1b[0m loading", True, "\x1b[32mINFO\x1b[0m loading\x1b[0m"),  # kept, then reset
    ("Loading  10%\rLoading  55%\rLoading 100%", False, "Loading 100%"),  # what the terminal would show
    ("line\r\n", False, "line"),
    ("\x1b]0;PWNED\x07title", True, "\\x1b]0;PWNED\\x07title"),  # no title, with colour or without
    ("\x1b]52;c;ZXZpbA==\x07", True, "\\x1b]52;c;ZXZpbA==\\x07"),  # no clipboard write
    ("\x1b[2J\x1b[Hcleared", True, "\\x1b[2J\\x1b[Hcleared"),  # no screen clear, no cursor move
    ("\x9b2J\u202eevil\u200b", True, "\\x9b2J\\u202eevil\\u200b"),  # 8-bit CSI, bidi, zero width
])
def test_log_line(line: str, color: bool, shown: str) -> None:
    assert log_line(line, color) == shown
    assert unsafe(log_line(line, color).encode(), color=color) == []
