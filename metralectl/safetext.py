"""Text from outside (servers, engines, peers, archives, labels) made safe for a terminal or a log line. Pure.

Control characters would let that text move the cursor, clear the screen, set the window title, write the
clipboard (OSC 52), hide what follows or forge a line of our own output; they are shown as escapes instead
(`\\x1b`, `\\n`, `\\u202e`), and the text is capped. The one rule, whatever prints it:
- clean():     one line (a name, a label, a server's message): every Cc/Cf/Zl/Zp/Cs/Co/Cn character escaped;
- printable(): prose (an answer, a multi-line message of ours that quotes outside text): line breaks and tabs
               kept, every other control escaped as clean() does;
- markup():    clean()'s text for a place that renders Rich markup (a progress bar's description, a table
               cell given as a string): `[` escaped too, so `[link=…]` or a stray `[/]` is shown, not obeyed;
- log_line():  one line of an engine's own log (`logs`, `run`'s followed log): what a terminal would leave
               visible after a carriage return, the engine's SGR colours kept only when we colour, every
               other control escaped.
docs/security.md lists where each applies.
"""

from __future__ import annotations

import re
import unicodedata

NAME_LIMIT = 64  # a name another machine gave itself (a peer's, a hello's): what is shown of it
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPED = ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn")
# Rich's own rule (rich.markup.escape): a `[` that opens a tag is preceded by a backslash, and backslashes
# already before it are doubled, so they stay literal; rich is not imported here (a foundation module)
_MARKUP_TAG = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")
_SGR = re.compile(r"\x1b\[[0-9;:]*m")  # Select Graphic Rendition: colour and weight, nothing else


def clean(text: str, limit: int | None = None) -> str:
    """`text` with every control, format and separator character escaped; at most `limit` characters."""
    if text.isprintable():  # no Other or Separator character but the space: nothing to escape (the usual case)
        return text if limit is None or len(text) <= limit else text[: max(limit - 1, 0)] + "…"
    out = []
    for ch in text:
        if ch in _NAMED:
            out.append(_NAMED[ch])
        elif unicodedata.category(ch) in _ESCAPED:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    result = "".join(out)
    return result if limit is None or len(result) <= limit else result[: max(limit - 1, 0)] + "…"


def printable(text: str) -> str:
    """`text` for a terminal as text: line breaks and tabs kept, every other control or format character
    escaped as clean() does (an engine's answer prints as prose but cannot move the cursor or set a title)."""
    if text.isprintable():
        return text
    return "\n".join("\t".join(clean(part) for part in line.split("\t")) for line in text.split("\n"))


def markup(text: str, limit: int | None = None) -> str:
    """clean(text) for Rich markup: shown exactly as clean() shows it, never read as a tag. Put it before
    plain text or at the end, not right before a tag of ours (a trailing backslash would escape that tag)."""
    return _MARKUP_TAG.sub(lambda m: f"{m.group(1)}{m.group(1)}\\{m.group(2)}", clean(text, limit))


def log_line(text: str, color: bool = False) -> str:
    """One line of an engine's log for a terminal. A carriage return inside it (a progress bar redrawn in
    place) keeps only what follows the last one, as a terminal would show it, without letting the engine
    overwrite our own text; SGR colour sequences are kept when `color` (then reset at the end, so no colour
    leaks into the next line) and dropped otherwise (NO_COLOR, a pipe); every other control is escaped:
    no title, clipboard, cursor or screen sequence reaches the terminal."""
    text = text.rstrip("\r\n")
    if "\r" in text:
        text = text.rsplit("\r", 1)[1]
    if "\x1b" not in text:
        return clean(text)
    parts, kept, at = [], False, 0
    for match in _SGR.finditer(text):
        parts.append(clean(text[at:match.start()]))
        if color:
            parts.append(match.group(0))
            kept = True
        at = match.end()
    parts.append(clean(text[at:]))
    return "".join(parts) + ("\x1b[0m" if kept else "")
