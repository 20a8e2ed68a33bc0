"""Counts in text a person reads: `1 file`, `2 files`, `0 files` — one rule, used everywhere a number
meets a noun (never `1 files` nor `item(s)`). tests/unit/test_singulars.py holds the package to it."""

from __future__ import annotations


def noun(n: float, singular: str, plural: str | None = None) -> str:
    """The noun that agrees with n: `file` for 1, `files` otherwise (`plural` for an irregular one:
    entry/entries, process/processes)."""
    return singular if n == 1 else plural or singular + "s"


def count(n: float, singular: str, plural: str | None = None) -> str:
    """n and its noun: `1 file`, `3 files`, `0.5 requests`."""
    shown = str(n) if isinstance(n, int) else f"{n:g}"
    return f"{shown} {noun(n, singular, plural)}"
