"""Terminal colour: on for a TTY, off under NO_COLOR or TERM=dumb, forced by FORCE_COLOR."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # imported by every command's start (cli/state.py)
if TYPE_CHECKING:
    from typing import TextIO


def color_enabled(stream: TextIO) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return hasattr(stream, "isatty") and stream.isatty() and os.environ.get("TERM") != "dumb"


def style(text: str, code: str, stream: TextIO = sys.stdout) -> str:
    return f"\033[{code}m{text}\033[0m" if color_enabled(stream) else text
