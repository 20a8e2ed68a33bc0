"""The one answer when a command needs a served model and there is none (errors.NotServed, exit 1).

`logs`, `chat`, `bench`, `swap` and `stop` meet it; a name that is no recipe at all is the catalog's own
answer instead (errors.NotFound, exit 64, with "did you mean"), as `run` and `show` give it.
"""

from __future__ import annotations

from collections.abc import Sequence

from metralectl.errors import MetralError, NotFound, NotServed


def not_served(recipe: str | None, served: Sequence[str], hint: str | None = None) -> MetralError:
    """NotServed (nothing serves, or not `recipe`), or NotFound when `recipe` names no recipe of the catalog."""
    unknown = unknown_recipe(recipe) if recipe is not None else None
    return unknown if unknown is not None else NotServed(recipe, served, hint)


def unknown_recipe(name: str) -> NotFound | None:
    """The catalog's NotFound for a name it does not know; None when it knows it (or cannot be read: then
    what serves is the better answer)."""
    from metralectl.core.catalog import load_catalog

    try:
        load_catalog().recipe(name)
    except NotFound as exc:
        return exc
    except MetralError:
        return None
    return None
