"""The top-level `--help` text as Click last rendered it, kept on disk so the next `--help` needs no Click.

Importing Click and Typer and building the command tree costs several times Python's own start, and
the text they produce only changes with the code that declares the commands, the Click and Typer
installed, and the terminal width (Click wraps to it). Those are the key, written on the file's
first line and compared in full; a miss, or any trouble reading or writing, renders through Click as
before (cli/main.py fills the cache then).
"""

from __future__ import annotations

import os
import shutil
import sys
import zlib
from pathlib import Path

from metralectl import __version__, paths

HELP_FORMS = (["--help"], ["-h"])
_CLI_DIR = Path(__file__).resolve().parent


def _stat_line(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return f"{path}:absent"
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def _library(name: str) -> str:
    """Where `import name` would find the package (first hit on sys.path), without importing it."""
    for entry in sys.path:
        candidate = os.path.join(entry or ".", name, "__init__.py")
        if os.path.exists(candidate):
            return _stat_line(candidate)
    return f"{name}:absent"


def key(cli_dir: Path = _CLI_DIR) -> str:
    """Everything the help text depends on: the command modules, Click and Typer, the width Click wraps to."""
    parts = [__version__, f"columns={shutil.get_terminal_size().columns}", _library("click"), _library("typer")]
    try:
        names = sorted(e.name for e in os.scandir(cli_dir) if e.name.endswith(".py"))
    except OSError:
        names = []
    parts += [_stat_line(str(cli_dir / name)) for name in names]
    return " ".join(parts)


def _path(full_key: str) -> Path:
    # The name only spreads keys over files; the whole key inside the file decides (no hashlib: its
    # OpenSSL load alone is a tenth of this path's budget).
    return paths.cache_dir() / f"help-{zlib.crc32(full_key.encode()):08x}.txt"


def read() -> str | None:
    full_key = key()
    try:
        stored = _path(full_key).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    first, _, text = stored.partition("\n")
    return text if first == full_key and text else None


def write(text: str) -> None:
    from metralectl.atomicfile import write_atomic

    full_key = key()
    try:
        write_atomic(_path(full_key), f"{full_key}\n{text}")
    except OSError:
        pass  # a read-only or full cache dir costs speed, never correctness
