"""Which engines exist: the entry-point group `metralectl.engines` (name = a recipe's `engine:`, value =
`module:Class`), read once, lazily: only a question about an engine (a fit estimate, a launch, an
identification) loads it, so `--help` and `list` never scan package metadata (tests/unit/test_engine_plugins.py).

metralectl's own engines are declared in that group in pyproject.toml. An editable install made before the
group existed carries no such metadata, so this package's own modules (each with an `ENGINE` class) are read
too, beneath anything the entry points name: a third party's plugin is found only through its entry point.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from importlib import metadata
from typing import Literal

from metralectl.core.engines.base import DataEngine, Engine
from metralectl.errors import DataError

GROUP = "metralectl.engines"
_loaded: dict[str, Engine] | None = None


def engines() -> dict[str, Engine]:
    """Every registered engine by name, sorted (discovered on the first call)."""
    global _loaded
    if _loaded is None:
        found = dict(_builtin())
        for point in metadata.entry_points(group=GROUP):
            found[point.name] = _instance(point.name, point.value)
        _loaded = dict(sorted(found.items()))
    return _loaded


def engine_for(name: str) -> Engine:
    """The engine named by a recipe; an engine with data but no class behaves as the data says (DataEngine)."""
    engine = engines().get(name)
    if engine is None:
        generic = DataEngine()
        generic.name = name
        return generic
    return engine


def the_builtin(role: Literal["publishes_recipe_sets", "owns_unnamed_images"]) -> str:
    """The one built-in engine that has `role` (base.Engine says what each means); read from this package's own
    modules, never the entry points: a plugin cannot take these over."""
    names = [engine.name for engine in _builtin().values() if getattr(engine, role, False)]
    if len(names) != 1:
        raise DataError(f"built-in engines with {role}: {names or 'none'}; exactly one must say it",
                        "a bug in this release: report it")
    return names[0]


@cache
def _builtin() -> dict[str, Engine]:
    import metralectl.core.engines as package

    out: dict[str, Engine] = {}
    for info in pkgutil.iter_modules(package.__path__):
        if info.name in ("base", "registry"):
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        engine = getattr(module, "ENGINE", None)
        if engine is not None:
            out[engine.name] = engine()
    return out


def _instance(name: str, value: str) -> Engine:
    module_name, _, attr = value.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
        engine = cls()
    except Exception as exc:  # a broken third-party plugin: name it, never a traceback
        raise DataError(f"engine plugin {name!r} ({value}) could not be loaded: {type(exc).__name__}: {exc}",
                        hint="reinstall or remove the package that declares it in the `metralectl.engines` "
                             "entry-point group") from None
    if not isinstance(engine, Engine) or engine.name != name:
        raise DataError(f"engine plugin {name!r} ({value}) is not an Engine named {name!r}",
                        hint="its class sets `name` to the entry point's name and implements "
                             "metralectl.core.engines.base.Engine")
    return engine
