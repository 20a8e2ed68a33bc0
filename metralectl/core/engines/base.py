"""The Engine protocol: what differs between engines in code, beyond their data (docs/engines.md, "Where
engines differ"). Each built-in engine is one module of this package with one class; a third party's engine
is a class in its own package, registered in the entry-point group `metralectl.engines`.

DataEngine gives every hook its data-driven default (the generic behaviour), so an engine overrides only what
its server does differently. The data roles (readiness style, model-argument form, memory meaning, metrics
series, request dialect) stay in the engine's yaml, read by core/contract.py into closed Literal vocabularies
(core/engine_profile.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from metralectl.core.fit import Part
    from metralectl.core.model_info import ModelInfo
    from metralectl.core.recipe import Recipe


class ServerAnswers(Protocol):
    """What a server answered to the identification probe (bench/engine_id.py `Answers`): JSON, or None."""

    @property
    def models(self) -> object: ...
    @property
    def serve_config(self) -> object: ...
    @property
    def hardware(self) -> object: ...
    @property
    def props(self) -> object: ...
    @property
    def metrics(self) -> str | None: ...
    @property
    def openapi(self) -> object: ...


@runtime_checkable
class Engine(Protocol):
    """One engine's behaviour in code. `name` is the recipe's `engine:` and the data file's stem."""

    name: str
    # Identification of a running server (bench/engine_id.py): the `/v1/models` owned_by words that say
    # it is this engine, and the prefix of its /metrics series.
    owned_by: tuple[str, ...]
    metric_prefix: str | None
    # Multi-rank launch: the flag after which the rank arguments go (None: the engine takes none).
    rank_arguments_after: str | None
    # A plugin's own data (engine/<name>.yaml with its pinned authority, images/, recipes/), loaded by the
    # catalog as shipped data; None for metralectl's own engines (their data is metralectl's).
    data_dir: Path | None
    # The engine whose releases carry a recipe set (`recipes sync`: index.json + recipes.tar.gz) in its own recipe
    # format (`recipes import` converts its serve configs), and the engine an image file naming none is for (image
    # files written before they named their engine). One built-in engine says each (registry.the_builtin).
    publishes_recipe_sets: bool
    owns_unnamed_images: bool

    def signatures(self, answers: ServerAnswers) -> list[str]:
        """Evidence, beyond owned_by and metrics, that the server is this engine (each a short phrase)."""
        ...

    def supporting(self, answers: ServerAnswers) -> list[str]:
        """Answers that agree with this engine but prove nothing alone."""
        ...

    def version(self, answers: ServerAnswers) -> str | None:
        """The build the server reports, raw (the caller escapes and caps it)."""
        ...

    def rank_arguments(self, rank: int, world_size: int, master_addr: str) -> list[str]:
        """The words that make one process a rank of a multi-rank launch."""
        ...

    def kv_pool(self, model: ModelInfo, recipe: Recipe) -> Part | None:
        """The fit estimate's KV part when the engine sizes its cache its own way; None: the generic pool
        (context length × sequences blocks from the flags its data's `fit-roles:` names, core/fit.py)."""
        ...


class DataEngine:
    """The defaults: everything the engine's data says, nothing more. Subclass and override what differs."""

    name = ""
    owned_by: tuple[str, ...] = ()
    metric_prefix: str | None = None
    rank_arguments_after: str | None = None
    data_dir: Path | None = None
    publishes_recipe_sets = False
    owns_unnamed_images = False

    def signatures(self, answers: ServerAnswers) -> list[str]:
        return []

    def supporting(self, answers: ServerAnswers) -> list[str]:
        return []

    def version(self, answers: ServerAnswers) -> str | None:
        return None

    def rank_arguments(self, rank: int, world_size: int, master_addr: str) -> list[str]:
        return []

    def kv_pool(self, model: ModelInfo, recipe: Recipe) -> Part | None:
        return None
