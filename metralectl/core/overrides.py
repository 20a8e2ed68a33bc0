"""`--set KEY=VALUE`: overrides that go through the same checker and are shown as deviations."""

from __future__ import annotations

from typing import Any

from metralectl.core.catalog import Catalog, parse_set_value
from metralectl.core.contract import EngineContract
from metralectl.core.schema import did_you_mean
from metralectl.errors import ExitCode, RecipeInvalid, UsageError
from metralectl.core.recipe import Recipe, RecipeOrigin
from metralectl.core.yamlsrc import Document, KeyPath, overlay
from metralectl.safetext import clean

_SECTIONS = ("serve", "resources", "env", "checkpoint", "validated")
_TOP_LEVEL = ("hardware", "image", "image-tag", "description", "engine", "runtime")
_UNSTATED = {("runtime",): "docker"}  # what a key the recipe leaves out means, for its deviation line
_ALIASES = {"image.tag": "image-tag"}  # `--set image.tag=dev` reads as the recipe key `image-tag`


def parse_set(text: str, catalog: Catalog, engine: str) -> tuple[KeyPath, Any]:
    """`max-seq-len=4096` (a serve flag), `resources.port=9000`, `env.NAME=V`, `hardware=hopper`, `image-tag=dev`."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError(f"--set {text!r} is not KEY=VALUE", "e.g. --set max-seq-len=4096 or --set resources.port=9000")
    value = parse_set_value(raw)
    key = _ALIASES.get(key, key)
    if key == "image-tag" and value is not None and not isinstance(value, str):
        value = str(value)  # a version-like tag (`--set image-tag=3.0`) is a name, not a number
    parts = key.split(".", 1)
    if parts[0] in _SECTIONS and len(parts) == 2:
        return (parts[0], parts[1]), value
    if len(parts) == 1 and key in _TOP_LEVEL:
        return (key,), value
    bare = key.removeprefix("--")
    contract = catalog.engines.get(engine)
    if len(parts) == 1 and contract is not None and contract.flag(bare) is not None:
        spec = contract.flag(bare)
        assert spec is not None
        if spec.recipe == "resources" and spec.resource:
            return ("resources", spec.resource), value
        return ("serve", bare), value
    guess = did_you_mean(bare, _known_keys(contract))
    raise UsageError(f"--set {clean(key, 80)}: not a serve flag or a recipe key",
                     f"did you mean `{guess}`?" if guess else
                     "use a serve flag (max-seq-len=4096) or SECTION.KEY (resources.port=9000, env.NAME=VALUE)")


def _known_keys(contract: EngineContract | None) -> list[str]:
    """What a --set key may be: the engine's flags (and their other spellings), then the recipe's keys."""
    from metralectl.core.checker import RESOURCE_KEYS
    from metralectl.core.checker_checkpoint import CHECKPOINT_KEYS
    from metralectl.core.checker_sections import VALIDATED_KEYS

    flags = [*contract.flags, *contract.aliases] if contract is not None else []
    sections = [f"resources.{k}" for k in RESOURCE_KEYS] + [f"checkpoint.{k}" for k in CHECKPOINT_KEYS]
    return flags + sections + [f"validated.{k}" for k in VALIDATED_KEYS] + list(_TOP_LEVEL) + list(_ALIASES)


def _get(data: object, path: KeyPath) -> object:
    for part in path:
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def apply_sets(catalog: Catalog, recipe: Recipe, sets: list[str]) -> Recipe:
    """The recipe with the overrides applied and re-checked; raises RecipeInvalid naming the --set."""
    if not sets:
        return recipe
    base = catalog.documents[recipe.name]
    top = Document("--set", {})
    changes: list[tuple[KeyPath, Any]] = []
    for text in sets:
        path, value = parse_set(text, catalog, recipe.engine)
        node = top.data
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
        top.origins[path] = f"--set {clean(text, 120)}"  # the problem names it: shown escaped
        top.marks[path] = (0, 0)
        changes.append((path, value))
    from metralectl.core import inherit

    moved = inherit.served_name(catalog, top, recipe.name, base.data if isinstance(base.data, dict) else {}, top.data)
    if moved:  # `--set checkpoint.repo=...` alone would serve the new checkpoint under the recipe's pinned name
        raise RecipeInvalid(moved, exit_code=ExitCode.USAGE)
    merged = overlay(base, top)
    for path in top.origins:  # a problem about an overridden key names the --set, not the file
        merged.origins[path] = top.origins[path]
        merged.marks[path] = (0, 0)
    checked, problems = catalog.check_document(merged, RecipeOrigin("set", recipe.origin.path,
                                                                    recipe.origin.overrides, recipe.origin.extends))
    if checked is None:  # the recipe itself passed: what the --set made of it is a usage error
        raise RecipeInvalid(problems, exit_code=ExitCode.USAGE)
    base_data = base.data
    stated = {path: _get(base_data, path) if _get(base_data, path) is not None else _UNSTATED.get(path)
              for path, _ in changes}
    deviations = tuple((".".join(map(str, path)), stated[path], value) for path, value in changes
                       if stated[path] != value)
    return Recipe(**{**checked.__dict__, "origin": recipe.origin, "deviations": deviations})
