"""Text from outside (an engine release's recipes, archives, peers) made safe for a terminal or log."""

from __future__ import annotations


def printable(text: str, limit: int | None = None) -> str:
    """Control characters (escape sequences, bells, carriage returns) shown as \\xNN, not obeyed."""
    out = "".join(ch if ch.isprintable() or ch == " " else f"\\x{ord(ch):02x}" if ord(ch) < 256
                  else f"\\u{ord(ch):04x}" for ch in text)
    if limit is not None and len(out) > limit:
        return out[: limit - 1] + "…"
    return out
