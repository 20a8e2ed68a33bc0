"""The Library's filter box: words narrow the table. Pure.

Every word must match. Plain words match the recipe name, engine, model, quant, hardware, repo or tags
(substring, any case). Keywords: `fits`, `cached` (weights complete), `image` (image present),
`mtp`, `serving`; `!word` negates; `hw:gb10` / `quant:fp8` / `tag:ep2` / `engine:llama-cpp` match one
field exactly.
"""

from __future__ import annotations

from metralectl.tui.services import LibraryItem

KEYWORDS = {
    "fits": lambda i: i.row.fits is True,
    "cached": lambda i: i.row.weights == "complete",
    "image": lambda i: i.image_present is True,
    "mtp": lambda i: i.row.mtp,
    "serving": lambda i: i.serving,
}


def _word(item: LibraryItem, word: str) -> bool:
    r = item.row
    if word in KEYWORDS:
        return bool(KEYWORDS[word](item))
    field, sep, value = word.partition(":")
    if sep and value:
        if field in ("hw", "hardware"):
            return r.hardware == value
        if field == "quant":
            return r.quant == value
        if field == "tag":
            return value in r.tags
        if field == "engine":
            return r.engine == value
    haystack = " ".join((r.name, r.engine, r.model, r.quant, r.hardware, r.repo, *r.tags)).lower()
    return word in haystack


def matches(item: LibraryItem, query: str) -> bool:
    for raw in query.lower().split():
        negate = raw.startswith("!") and len(raw) > 1
        word = raw[1:] if negate else raw
        if _word(item, word) == negate:
            return False
    return True


def apply(items: tuple[LibraryItem, ...] | list[LibraryItem], query: str) -> list[LibraryItem]:
    return [i for i in items if matches(i, query)]
