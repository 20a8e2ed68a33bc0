"""An engine's own `--help` text, pinned byte for byte, as the authority for which options it has.

For engines that publish no machine-readable option dump (llama.cpp's `llama-server --help`), the help
text of the pinned build is kept under engine/<name>/<revision>/ with its sha256, and every flag the
contract declares (its name, aliases and negation) must be one of the options that text lists; the
integration drift test holds the pinned text against the real binary's. Pure.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

_OPTION = re.compile(r"(?:^|[\s,])(-{1,2}[A-Za-z0-9][\w.-]*)")


class HelpDumpError(Exception):
    pass


@dataclass(frozen=True)
class HelpDump:
    options: frozenset[str]  # every spelling, with its dashes: -c, --ctx-size, --no-cont-batching
    sha256: str


def options_of(text: str) -> frozenset[str]:
    """The option spellings a getopt-style help lists: lines that start with `-`, up to the description
    (the first gap of two or more spaces once `-a,  --b` is read as one list)."""
    found: set[str] = set()
    for line in text.splitlines():
        if not line.startswith("-") or line.startswith("---"):
            continue
        head = re.split(r"\s{2,}", re.sub(r",\s+", ", ", line.rstrip()), maxsplit=1)[0]
        found.update(_OPTION.findall(head))
    return frozenset(found)


def load(path: Path) -> HelpDump:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise HelpDumpError(f"cannot read the pinned help text {path}: {exc.strerror or exc}") from exc
    return HelpDump(options_of(data.decode("utf-8", "replace")), hashlib.sha256(data).hexdigest())
