"""The loadable recipes larger than the box's whole memory budget, for the gateway's /v1/models.

The loader refuses such a recipe every time (loader._make_room: 503 `model_too_large`, no Retry-After), so the
listing says `too_large` for it, with its need and the budget, rather than `loadable`. The numbers come from the
loader's own ops (budget(), footprint(): they read files), found on a worker thread, never on the event loop, and
kept REFRESH_S: a listing after that answers with what was found and has it found again behind it (only a listing
with nothing found yet waits for the first finding). A need or budget unknown (None) is not too large, and an ops
call that fails counts as unknown: the listing is never broken by it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from metralectl.core.budget import Budget, Footprint

REFRESH_S = 30.0  # the longest a finding is used before it is made again


@dataclass(frozen=True)
class TooLarge:
    needs_gb: float
    budget_gb: float

    def fields(self) -> dict[str, object]:
        """The listing's extra fields, in GB."""
        return {"status": "too_large", "needs_gb": round(self.needs_gb, 2), "budget_gb": round(self.budget_gb, 2)}


class Sizes(Protocol):
    """What of loader.Ops this reads (blocking: called on a thread)."""

    def budget(self) -> Budget: ...

    def footprint(self, recipe: str) -> Footprint: ...


def find(ops: Sizes, recipes: Iterable[str]) -> dict[str, TooLarge]:
    """recipe -> its numbers, for each of `recipes` whose footprint is more than the whole budget (the loader's own
    test); blocking."""
    try:
        budget = ops.budget().gb
    except Exception:  # unknown: nothing is said to be too large
        return {}
    if budget is None:
        return {}
    found: dict[str, TooLarge] = {}
    for recipe in sorted(set(recipes)):
        try:
            need = ops.footprint(recipe).gb
        except Exception:  # unknown: loadable, as the loader would try it
            continue
        if need is not None and need > budget + 1e-9:
            found[recipe] = TooLarge(need, budget)
    return found


class Oversize:
    """find()'s answer for the loader's recipes, made on a thread, one finding at a time, kept `refresh_s`."""

    def __init__(self, ops: Sizes, recipes: Iterable[str], refresh_s: float = REFRESH_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ops, self.recipes = ops, tuple(sorted(set(recipes)))
        self.refresh_s, self.clock = refresh_s, clock
        self._found: dict[str, TooLarge] | None = None  # None: not found yet
        self._at = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """A finding, begun on a thread unless one is under way (the gateway begins one as it starts)."""
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._refresh())

    async def _refresh(self) -> None:
        try:
            found = await asyncio.to_thread(find, self.ops, self.recipes) if self.recipes else {}
        except Exception:  # find() catches the ops' own; anything else is no finding, never a broken listing
            found = {}
        self._found, self._at = found, self.clock()

    async def get(self) -> dict[str, TooLarge]:
        """The recipes too large: what was found, a new finding begun behind it once it is `refresh_s` old; the first
        listing waits for the first finding."""
        if self._found is None or self.clock() - self._at >= self.refresh_s:
            self.start()
        if self._found is None and self._task is not None:
            await asyncio.shield(self._task)  # a listing that goes away leaves the finding to end for the next
        return self._found or {}
