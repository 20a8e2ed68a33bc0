"""Text from outside (recipes, container labels, engine logs, servers' errors, doctor findings, bench records)
as the dashboard's widgets show it: the CLI's rule (metralectl/safetext.py), in Textual's terms.

A widget given a plain string reads it as markup (Label, Static, a DataTable cell, a notification, a command
palette entry): `[@click=app.quit]` in a label would run an action when clicked, `[link=file:///…]` make a
link, a stray `[/]` crash the dashboard. So outside text reaches a widget as a Rich `Text` (never parsed),
built here with its control characters escaped (a Log widget drops only some of them, a Text none of ESC,
C1 or bidi); where Textual insists on markup (the palette), `markup()` escapes every `[`.
"""

from __future__ import annotations

from rich.style import Style
from rich.text import Text

from metralectl.safetext import clean, log_line, printable


def line(text: object, style: str | Style = "") -> Text:
    """One value from outside (a name, a label, a server's one-line message): every control escaped."""
    return Text(clean(str(text)), style=style)


def prose(text: object, style: str | Style = "") -> Text:
    """A message that may span lines (ours, quoting outside text): line breaks and tabs kept, every other
    control escaped."""
    return Text(printable(str(text)), style=style)


def log(text: str) -> str:
    """One line of an engine's log for a Log widget (which reads no markup but passes ESC, C1 and bidi
    characters through, and would split a line at U+2028 or NEL): as `metralectl logs` prints it uncoloured."""
    return log_line(text)


def scrub(text: Text) -> Text:
    """A Text we assembled (styles kept) whose pieces came from outside: every control escaped as prose()
    does. Unchanged (the same object) when there is nothing to escape, the usual case."""
    plain = text.plain
    if printable(plain) == plain:
        return text
    cuts = sorted({0, len(plain), *(o for span in text.spans for o in (span.start, span.end))})
    out = Text(style=text.style, justify=text.justify, overflow=text.overflow, no_wrap=text.no_wrap, end=text.end)
    for start, end in zip(cuts, cuts[1:]):  # within a piece every span covers all of it or none of it
        piece = Text(printable(plain[start:end]))
        for span in text.spans:
            if span.start <= start and end <= span.end:
                piece.stylize(span.style)
        out.append_text(piece)
    return out


def cell(value: object) -> Text:
    """A table cell or column header: a Text of ours scrubbed, anything else one line from outside."""
    return scrub(value) if isinstance(value, Text) else line(value)


def markup(text: object) -> str:
    """One value from outside for a place that only takes Textual markup (a command palette entry): shown
    exactly as clean() shows it. Textual reads `[` as a tag unless a backslash precedes it, and drops that one
    backslash, so escaping every `[` leaves nothing to read as a tag (safetext.markup() is Rich's rule,
    whose tags start only with a lowercase letter, `#`, `/` or `@`; Textual's may start with a space,
    a capital or `$`)."""
    return clean(str(text)).replace("[", "\\[")
