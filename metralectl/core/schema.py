"""Small helpers for checking YAML documents against expected keys and types.

They report Problems (file, line, column, key, message, hint) instead of raising, so one pass can
list every problem in a file.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from metralectl.errors import Problem
from metralectl.core.yamlsrc import Document, KeyPath


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    matches = difflib.get_close_matches(str(word), list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


def type_name(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"


class Checker:
    """Collects problems about one document."""

    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self.problems: list[Problem] = []

    @property
    def ok(self) -> bool:
        return not any(p.severity == "error" for p in self.problems)

    def error(self, keypath: KeyPath, message: str, hint: str | None = None) -> None:
        self.problems.append(self.doc.problem(keypath, message, hint))

    def warn(self, keypath: KeyPath, message: str, hint: str | None = None) -> None:
        self.problems.append(self.doc.problem(keypath, message, hint, severity="warning"))

    def mapping(self, value: Any, keypath: KeyPath, what: str) -> dict[str, Any]:
        """value as a mapping, or {} after reporting that it is not one."""
        if isinstance(value, dict):
            return value
        self.error(keypath, f"{what} must be a mapping (key: value lines), not {type_name(value)}")
        return {}

    def known_keys(self, data: dict[str, Any], keypath: KeyPath, allowed: Iterable[str], what: str) -> None:
        allowed = list(allowed)
        for key in data:
            if key not in allowed:
                guess = did_you_mean(str(key), allowed)
                hint = f"did you mean `{guess}`?" if guess else f"valid keys: {', '.join(allowed)}"
                self.error(keypath + (key,), f"unknown key {key!r} in {what}", hint)

    def required(self, data: dict[str, Any], keypath: KeyPath, keys: Iterable[str], what: str) -> None:
        for key in keys:
            if key not in data:
                self.error(keypath, f"{what} is missing the required key {key!r}", f"add `{key}: ...`")

    def string(self, data: dict[str, Any], keypath: KeyPath, key: str, *, required: bool = True,
               nullable: bool = False) -> str | None:
        if key not in data:
            if required:
                self.error(keypath, f"missing the required key {key!r}", f"add `{key}: ...`")
            return None
        value = data[key]
        if value is None and nullable:
            return None
        if not isinstance(value, str) or not value.strip():
            self.error(keypath + (key,), f"must be a non-empty string, not {type_name(value)}")
            return None
        return value

    def number(self, data: dict[str, Any], keypath: KeyPath, key: str, *, required: bool = True,
               nullable: bool = False, minimum: float | None = None, integer: bool = False) -> float | None:
        if key not in data:
            if required:
                self.error(keypath, f"missing the required key {key!r}", f"add `{key}: ...`")
            return None
        value = data[key]
        if value is None and nullable:
            return None
        ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok_type:
            self.error(keypath + (key,), f"must be {'an integer' if integer else 'a number'}, not {type_name(value)}")
            return None
        if minimum is not None and value < minimum:
            self.error(keypath + (key,), f"must be at least {minimum}, not {value}")
            return None
        number: float = value  # an int or a float: checked above
        return number

    def boolean(self, data: dict[str, Any], keypath: KeyPath, key: str, *, required: bool = False,
                nullable: bool = False, default: bool | None = None) -> bool | None:
        """`true` or `false` and nothing else: not `1` (Python's 1 == True), not "yes", not "true" quoted."""
        if key not in data or (data[key] is None and nullable):
            if required and key not in data:
                self.error(keypath, f"missing the required key {key!r}", f"add `{key}: true` or `{key}: false`")
            return default
        value = data[key]
        if not isinstance(value, bool):
            self.error(keypath + (key,), f"must be `true` or `false`, not {type_name(value)}",
                       f"write `{key}: true` or `{key}: false` (unquoted)")
            return None
        return value

    def string_list(self, data: dict[str, Any], keypath: KeyPath, key: str, *, required: bool = False) -> list[str]:
        if key not in data:
            if required:
                self.error(keypath, f"missing the required key {key!r}", f"add `{key}: [...]`")
            return []
        value = data[key]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.error(keypath + (key,), f"must be a list of strings, not {type_name(value)}")
            return []
        return value
