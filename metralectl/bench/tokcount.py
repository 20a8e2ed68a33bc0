"""Counting generated tokens with the model's own tokenizer, for servers that report no usage.

Needs the `tokenizers` package (not a dependency of metralectl: only this optional path uses it).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from metralectl.errors import UsageError

Counter = Callable[[str], int]


def resolve(path: str) -> Path:
    """The tokenizer.json a `tokenizer=` parameter names (a file, or a directory holding one)."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise UsageError(f"--param tokenizer={path}: no tokenizer.json there",
                         "name a tokenizer.json, or the model directory (or HF snapshot) that holds one")
    return p


@lru_cache(maxsize=4)
def counter(path: str) -> Counter:
    """A function: generated text -> its token count (special tokens not added)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError("--param tokenizer needs the `tokenizers` package",
                         "install it into metralectl's environment (e.g. `uv tool install --with tokenizers ...`)") from None
    try:
        tok = Tokenizer.from_file(str(resolve(path)))
    except UsageError:
        raise
    except Exception as exc:  # the library raises its own types for a malformed file
        raise UsageError(f"--param tokenizer={path}: cannot load it: {exc}") from None
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)
