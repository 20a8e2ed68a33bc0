"""Names from outside: a value is data, never a path, until it passed `check(kind, value)`.

A file name from a Hub listing, a blob id, a commit, an LFS oid, a release's recipe id or path, a
quant: each kind has one grammar, matched in full (`fullmatch`: no trailing newline slips through);
path-like kinds are checked component by component as well (no `..`, no hidden characters, nothing
named like metralectl's own files). docs/security.md has the table. Writing under a directory
metralectl owns is the other half, ownedfs.Owned. Foundation layer: stdlib only.
"""

from __future__ import annotations

import re
import unicodedata

from metralectl.errors import ExitCode, MetralError
from metralectl.safetext import clean

_HEX40 = r"[0-9a-f]{40}"
_HEX64 = r"[0-9a-f]{64}"
_HF_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
OURS_PREFIX = ".metralectl"  # our sidecars and folders inside a snapshot or repository: never a name from outside

# kind -> the whole value's grammar. Path-like kinds are checked by component (below) as well.
GRAMMARS: dict[str, re.Pattern[str]] = {
    "commit": re.compile(_HEX40),
    "sha256": re.compile(_HEX64),
    "git oid": re.compile(f"{_HEX40}|{_HEX64}"),
    "blob id": re.compile(f"{_HEX40}|{_HEX64}"),  # a blob's name under blobs/: an LFS sha256 or a git oid
    "repo": re.compile(f"(?:{_HF_PART}/)?{_HF_PART}"),
    "quant": re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}"),
    "recipe name": re.compile(r"[a-z0-9][a-z0-9._-]{0,63}"),
    "recipe id": re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}(?:/[A-Za-z0-9][A-Za-z0-9._-]{0,63}){0,3}"),
    "release path": re.compile(r"[A-Za-z0-9._-]{1,128}(?:/[A-Za-z0-9._-]{1,128}){0,7}"),
    "version": re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}"),  # an engine version, a release's own name
    "asset name": re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}"),  # a release asset's file name (no "/")
    "file name": re.compile(r"[^/\x00]{1,255}"),  # one component; characters checked below
    "repo path": re.compile(r"[^\x00]{1,1024}"),  # a file's path in a Hub repository; components below
}
_PATH_KINDS = {"repo path", "release path", "file name"}
_HIDDEN_CATEGORIES = ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn")


class UnsafeName(MetralError):
    """A name from outside failed its grammar: nothing was written with it."""

    exit_code = ExitCode.DATA


def _component_problem(part: str) -> str | None:
    if part in ("", ".", ".."):
        return f"the path component {part!r} is not a name"
    if len(part.encode("utf-8", "surrogatepass")) > 255:
        return "a path component is longer than 255 bytes"
    if "\\" in part:
        return "a backslash in a file name"
    if part.startswith(OURS_PREFIX):
        return f"names beginning with {OURS_PREFIX!r} are metralectl's own files"
    if part != part.strip():
        return "leading or trailing white space"
    if part.isascii() and part.isprintable():
        return None  # printable ASCII holds no hidden category (the common case, checked fast)
    for ch in part:
        if unicodedata.category(ch) in _HIDDEN_CATEGORIES:
            return f"the character U+{ord(ch):04X} ({unicodedata.category(ch)}) is not allowed in a name"
    return None


def problem(kind: str, value: object) -> str | None:
    """Why `value` is not a `kind` (None: it is). Unknown kinds are a bug, not a pass."""
    grammar = GRAMMARS[kind]
    if not isinstance(value, str):
        return f"not a string but {type(value).__name__}"
    if not grammar.fullmatch(value):
        return f"does not match the {kind} grammar {grammar.pattern!r}"
    if kind in _PATH_KINDS:
        if value.startswith("/"):
            return "an absolute path"
        for part in value.split("/"):
            why = _component_problem(part)
            if why is not None:
                return why
    return None


def check(kind: str, value: object, source: str = "") -> str:
    """`value` when it is a well-formed `kind`; else UnsafeName naming where it came from."""
    why = problem(kind, value)
    if why is None:
        assert isinstance(value, str)
        return value
    shown = clean(value if isinstance(value, str) else repr(value), 120)
    origin = f"{source} gave " if source else ""
    raise UnsafeName(f"{origin}a {kind} that is not one: {shown!r} ({why}); nothing was written with it",
                     "a server, archive or file that sends such names is broken or hostile; check where it "
                     "came from (HF_ENDPOINT, the release URL, files left in the cache)")


def is_valid(kind: str, value: object) -> bool:
    return problem(kind, value) is None
