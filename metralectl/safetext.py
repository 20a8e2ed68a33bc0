"""Text from outside (servers, engines, peers, archives) made safe for a terminal or a log line. Pure.

Control characters would let that text move the cursor, clear the screen, hide what follows or forge a
line of our own output; they are shown as escapes instead (`\\x1b`, `\\n`), and the text is capped.
"""

from __future__ import annotations

import unicodedata

NAME_LIMIT = 64  # a name another machine gave itself (a peer's, a hello's): what is shown of it
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def clean(text: str, limit: int | None = None) -> str:
    """`text` with every control, format and separator character escaped; at most `limit` characters."""
    out = []
    for ch in text:
        if ch in _NAMED:
            out.append(_NAMED[ch])
        elif unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"):
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
