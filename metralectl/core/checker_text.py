"""Text rules of the recipe checker: names in their grammar, dates that exist, no control characters.

A recipe's strings reach the engine's command line (serve values), the container's environment, the
HF cache (repo, revision) and the terminal (`show`, `list`). A value that would be read as another
option, a name with a newline, a date that never was: each is refused with its position and a fix.
"""

from __future__ import annotations

import datetime
import re
import unicodedata
from typing import Any

from metralectl import names
from metralectl.core.schema import Checker, type_name
from metralectl.core.yamlsrc import KeyPath

# Prose a person reads (may span lines); every other string is one line.
PROSE: tuple[KeyPath, ...] = (("description",), ("validated", "source"), ("validated", "notes"),
                              ("provenance", "deviations", None, "why"), ("provenance", "deviations", None, "upstream"),
                              ("provenance", "deviations", None, "ours"))
# Values whose grammar (a recipe name, a repo id, a commit, a date) already refuses every such character.
GRAMMAR_KEYS: frozenset[KeyPath] = frozenset({("name",), ("extends",), ("checkpoint", "repo"), ("checkpoint", "revision"),
                                              ("validated", "date"), ("provenance", "commit"), ("provenance", "sha256"),
                                              ("provenance", "taken")})
_HIDDEN = ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn")  # metralectl.names': nothing a one-line value needs
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _is_prose(keypath: KeyPath) -> bool:
    return any(len(p) == len(keypath) and all(a is None or a == b for a, b in zip(p, keypath)) for p in PROSE)


def hidden_character(text: str, *, prose: bool = False) -> str | None:
    """The first character of `text` a recipe may not hold, described (None: there is none). Prose keeps
    line breaks and tabs; neither may carry a terminal control, a bidi override or a line separator."""
    for ch in text:
        category = unicodedata.category(ch)
        if prose and (ch in "\n\t" or (category in ("Cf", "Cn", "Co") and ch not in _BIDI)):
            continue  # an emoji's zero-width joiner, a soft hyphen: shown escaped if ever printed
        if category in _HIDDEN or ch in _BIDI:
            name = unicodedata.name(ch, "") or {"\x1b": "ESC", "\x07": "BEL", "\n": "LINE FEED",
                                                 "\r": "CARRIAGE RETURN", "\t": "TAB"}.get(ch, category)
            return f"U+{ord(ch):04X} ({name})"
    return None


def check_text(check: Checker, data: Any, keypath: KeyPath = ()) -> None:
    """Every string value of the document, at any depth, free of hidden characters. Keys are not looked at
    here: each is a known key, a flag or an environment name, whose own check refuses anything else; nor are
    the values with a grammar of their own (GRAMMAR_KEYS), which would be reported twice."""
    if isinstance(data, dict):
        for key, value in data.items():
            if keypath + (key,) not in GRAMMAR_KEYS:
                check_text(check, value, keypath + (key,))
    elif isinstance(data, list):
        for i, item in enumerate(data):
            check_text(check, item, keypath + (i,))
    elif isinstance(data, str):
        prose = _is_prose(keypath)
        found = hidden_character(data, prose=prose)
        if found:
            what = "line breaks and tabs are the only control characters prose may hold" if prose else \
                "a one-line value holds no control, format or line-separator character"
            check.error(keypath, f"{data!r} holds {found}: {what} (it would reach a terminal, the engine's "
                                 "command line or the container's environment as is)",
                        "remove the character (a `\\e`, `\\x..` or `\\u....` escape in quotes writes one)")


def name_problem(kind: str, value: str) -> str | None:
    """Why `value` is not a `kind` (metralectl.names' grammar, matched in full: no trailing newline)."""
    return names.problem(kind, value)


def recipe_name(check: Checker, keypath: KeyPath, value: Any, what: str = "recipe name") -> str | None:
    """`value` when it is a recipe name (its grammar: lower-case letters, digits, '.', '_', '-')."""
    if not isinstance(value, str) or name_problem("recipe name", value) is not None:
        shown = repr(value) if isinstance(value, str) else type_name(value)
        hidden = hidden_character(value) if isinstance(value, str) else None
        check.error(keypath, f"{what} {shown} must be 1-64 lower-case letters, digits, '.', '_' or '-', "
                             "starting with a letter or digit" + (f" (it holds {hidden})" if hidden else ""),
                    "rename it, e.g. `qwen3.5-35b-a3b-long`: it names files, containers and labels")
        return None
    return value


def checkpoint_repo(check: Checker, keypath: KeyPath, value: str) -> str | None:
    """A Hub repository id as ORG/NAME: the "repo" grammar (names), with the organisation required (every
    checkpoint a recipe pulls lives under one; a bare legacy id such as `gpt2` names no owner)."""
    hidden = hidden_character(value)
    why = f"it holds {hidden}" if hidden else None
    if why is None and (name_problem("repo", value) is not None or "/" not in value):
        why = "not ORG/NAME" if "/" not in value else "a character or length the Hub does not allow"
    if why is not None:
        check.error(keypath, f"{value!r} is not a Hugging Face repo id ({why})",
                    "write it as ORG/NAME: letters, digits, '.', '_', '-', each part starting and ending "
                    "with a letter or digit")
        return None
    return value


def commit(check: Checker, keypath: KeyPath, value: str, hint: str | None = None) -> str | None:
    if name_problem("commit", value) is not None:
        check.error(keypath, f"{value!r} is not a 40-character commit id (lower-case hex)", hint)
        return None
    return value


def iso_date(check: Checker, keypath: KeyPath, value: str | None) -> str | None:
    """A calendar date written YYYY-MM-DD that exists (no 2026-02-30, no month 13). The clock is not read:
    a date ahead of this box's clock is let through, so the same file checks the same on every box (a box
    whose clock is behind would otherwise refuse the shipped recipes)."""
    if value is None:
        return None
    if not _DATE_RE.fullmatch(value):
        check.error(keypath, f"date {value!r} is not YYYY-MM-DD", "write the ISO date, e.g. 2026-12-01")
        return None
    try:
        datetime.date.fromisoformat(value)
    except ValueError as exc:
        check.error(keypath, f"date {value!r} does not exist ({exc})", "write a real calendar date, e.g. 2026-02-28")
        return None
    return value
