"""tui/outside.py: the rule for outside text in widgets, without an app."""

from __future__ import annotations

import pytest
from rich.text import Text
from textual.content import Content

from metralectl.safetext import clean, markup as rich_markup
from metralectl.tui.outside import cell, line, log, markup, prose, scrub

# What Textual reads as a tag but Rich's escape (safetext.markup) does not touch: a tag may start with a space,
# a capital or `$` in Textual's grammar, and `@click` inside one is an action run on click.
TEXTUAL_ONLY = ["[ @click=app.quit]x", "[Bold @click=app.quit]x[/]", "[$accent]x", "[B]x[/B]"]
TRICKY = TEXTUAL_ONLY + ["[@click=app.quit]x[/]", "[/]", "[link=file:///etc/passwd]y", "a\\[b]c", "end\\",
                         "\\\\[b]", "[[x]]", "\x1b]0;T\x07 [b]\u202e"]


@pytest.mark.parametrize("text", TRICKY)
def test_markup_is_shown_by_textual_exactly_as_clean_shows_it(text: str) -> None:
    content = Content.from_markup(markup(text))
    assert content.plain == clean(text) and not content.spans


def test_rich_markup_escape_is_not_enough_for_textual() -> None:
    """Why the palette uses tui.outside.markup: safetext.markup leaves these as tags Textual obeys."""
    for text in TEXTUAL_ONLY:
        assert Content.from_markup(rich_markup(text)).spans, text


def test_line_and_prose_are_texts_with_controls_escaped() -> None:
    assert line("a\nb\x1b[2J", style="bold").plain == "a\\nb\\x1b[2J"
    assert prose("a\n\tb\x9b6n\u2028").plain == "a\n\tb\\x9b6n\\u2028"
    assert line("[/]").plain == "[/]"  # a Text: never read as markup
    assert log("\x1b[31mred\x1b[0m\x1b]0;T\x07") == "red\\x1b]0;T\\x07"  # uncoloured, as `logs` under NO_COLOR
    assert log("10%\r99%\n") == "99%"


def test_scrub_escapes_what_a_text_we_built_holds_and_keeps_its_styles() -> None:
    built = Text("ok ", style="dim")
    built.append("\x1b]0;T", style="bold")
    built.append(" end\n")
    shown = scrub(built)
    assert shown.plain == "ok \\x1b]0;T end\n"
    assert shown.style == "dim"
    assert [(shown.plain[s.start:s.end], str(s.style)) for s in shown.spans] == [("\\x1b]0;T", "bold")]
    clean_text = Text("nothing to escape", style="red")
    assert scrub(clean_text) is clean_text


def test_cell_takes_any_value() -> None:
    assert cell("[/bold]").plain == "[/bold]" and cell(3).plain == "3" and cell(None).plain == "None"
    assert cell(Text("\x1b", style="red")).plain == "\\x1b"
