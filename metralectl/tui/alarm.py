"""Styles that must stay readable without colour. Under NO_COLOR, Textual turns every colour into a grey of
the same luminance: red (dark) becomes dark grey on near-black, so a FAIL would read as the dimmest text on
screen. These styles say "look here" with reverse video instead, which survives any palette."""

from __future__ import annotations

import os


def _plain() -> bool:
    return bool(os.environ.get("NO_COLOR"))


def alarm() -> str:
    """A failure, a problem count, a DEGRADED state."""
    return "bold reverse" if _plain() else "bold red"


def caution() -> str:
    """A warning, a cancelled run."""
    return "bold underline" if _plain() else "bold yellow"
