"""Hostile text for the dashboard's outside-text tests, and how they read what the widgets render.

HOSTILE is what a recipe from a synced set, a container label on a shared daemon, an engine's log, a
server's error, a doctor finding or a bench record on disk can hold: Textual/Rich markup (an action run
when clicked, a link, a closing tag that matches nothing, which ends the dashboard with a MarkupError) and
terminal controls (a window title set through OSC, a C1 CSI that asks the terminal to answer, a bidi
override). What a test asserts: nothing crashed, the markup is shown as text, no control character is
in what the screen renders, and clicking the crafted word runs no action.
"""

from __future__ import annotations

import unicodedata

from rich.cells import cell_len
from textual.app import App
from textual.pilot import Pilot

CLICK = "[@click=app.toggle_theme]CLICK[/]"
MARKUP = f"{CLICK} [link=file:///etc/passwd]L[/link][/bold]"
CONTROLS = "\x1b]0;T\x07\x9b6n\u202eR\u2028"
HOSTILE = f"{MARKUP} {CONTROLS}"
# how each part is shown: the markup as typed, the controls as safetext.clean escapes them
SHOWN = (CLICK, "[/bold]", "\\x1b]0;T\\x07")  # (a narrow column or a wrapped line cuts what follows)
_RAW = ("Cc", "Cf", "Zl", "Zp", "Cs", "Co")


def screen_lines(app: App[object]) -> list[str]:
    """The text of every cell of the current screen (dialogs, toasts and all) as the compositor renders it
    for the terminal; control segments (cursor moves Textual itself emits) left out. Private API: the
    headless driver writes nothing, and an SVG screenshot would have escaped what we look for."""
    strips = app.screen._compositor.render_strips()
    return ["".join(segment.text for segment in strip if not segment.control) for strip in strips]


def raw_controls(app: App[object]) -> list[str]:
    """Every control, format or separator character the screen would send to the terminal as it is."""
    return sorted({f"U+{ord(ch):04X}" for text in screen_lines(app) for ch in text
                   if unicodedata.category(ch) in _RAW})


def assert_shown_safely(app: App[object], *shown: str) -> None:
    """No raw control character on screen, and each of `shown` (default: every part of HOSTILE) on one line."""
    lines = screen_lines(app)
    assert raw_controls(app) == [], "\n".join(lines)
    for part in shown or SHOWN:
        assert any(part in text for text in lines), f"{part!r} not shown:\n" + "\n".join(lines)


async def click_the_crafted_word(pilot: Pilot[object], app: App[object]) -> None:
    """Click the first CLICK on screen (shown literally or, were it read as markup, as the action's label);
    the theme must not have changed: the crafted `[@click=app.toggle_theme]` ran nothing."""
    theme = app.theme
    for y, text in enumerate(screen_lines(app)):
        x = text.find("CLICK")
        if x >= 0:
            await pilot.click(offset=(cell_len(text[:x]) + 1, y))
            await pilot.pause(0.1)
            break
    else:
        raise AssertionError("CLICK is not on screen:\n" + "\n".join(screen_lines(app)))
    assert app.is_running and app.theme == theme, "clicking the crafted label ran its action"
