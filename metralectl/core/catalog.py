"""Load the data directories (shipped, then the user's overlay) into one checked catalog.

Shipped data that fails its checks is a bug in this release (DataError). A user recipe that fails
is reported with its problems and left out; the others still load.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from metralectl import paths
from metralectl.core.contract import EngineContract, parse_contract
from metralectl.errors import DataError, NotFound, Problem, RecipeInvalid
from metralectl.core.hardware import HardwareClass, parse_hardware
from metralectl.core.image_info import ImageInfo, parse_image
from metralectl.core.model_info import ModelInfo, parse_model
from metralectl.core.recipe import Recipe, RecipeOrigin
from metralectl.core.schema import did_you_mean
from metralectl.core.yamlsrc import Document, YamlSyntax, load_file, load_text


@dataclass
class Refused:
    """A recipe file that failed the checker."""

    path: str
    problems: list[Problem]
    name: str = ""  # the recipe's `name:` when it has one (the file may be named otherwise)
    overrides: str | None = None  # the shipped (or synced) recipe it would have replaced, now hidden by it


@dataclass
class Catalog:
    engines: dict[str, EngineContract] = field(default_factory=dict)
    hardware: dict[str, HardwareClass] = field(default_factory=dict)
    models: dict[str, dict[str, ModelInfo]] = field(default_factory=dict)  # hardware id -> model id -> info
    images: dict[str, ImageInfo] = field(default_factory=dict)
    recipes: dict[str, Recipe] = field(default_factory=dict)
    documents: dict[str, Document] = field(default_factory=dict)  # recipe name -> its (merged) document
    refused: list[Refused] = field(default_factory=list)

    def models_for(self, hardware: str) -> dict[str, ModelInfo]:
        """The models a class serves: its own, then those it inherits."""
        chain: list[str] = []
        current: str | None = hardware
        while current and current not in chain:
            chain.append(current)
            hw = self.hardware.get(current)
            current = hw.inherits if hw else None
        out: dict[str, ModelInfo] = {}
        for hw_id in reversed(chain):
            out.update(self.models.get(hw_id, {}))
        return out

    def recipe(self, name: str) -> Recipe:
        if name in self.recipes:
            return self.recipes[name]
        refused = next((r for r in self.refused if name in (r.name, _stem(r.path))), None)
        if refused is not None:
            raise RecipeInvalid(refused.problems)
        guess = did_you_mean(name, self.recipes)
        hint = f"did you mean `{guess}`?" if guess else "`metralectl list` shows the recipes"
        raise NotFound(f"no recipe named {name!r}", hint)

    def model_of(self, recipe: Recipe) -> ModelInfo:
        return self.models_for(recipe.hardware)[recipe.model]

    def image_for(self, recipe: Recipe) -> ImageInfo:
        """The image a recipe runs: its image under the recipe's `image-tag:` when it names one."""
        return self.images[recipe.image].with_tag(recipe.image_tag)

    def check_document(self, doc: Document, origin: RecipeOrigin) -> tuple[Recipe | None, list[Problem]]:
        """Check one recipe document against this catalog (resolving `extends:` first)."""
        merged, problems = self._resolve_extends(doc)
        if merged is None:
            return None, problems
        from metralectl.core.checker import check_recipe  # only when checking: a cached catalog skips it

        recipe, found = check_recipe(merged, self, origin)
        if recipe is not None and any(p.severity == "error" for p in problems):
            recipe = None  # the inheritance itself is refused (a served name carried to another checkpoint)
        elif recipe is not None and problems:
            recipe = dataclasses.replace(recipe, warnings=tuple(p.render() for p in problems) + recipe.warnings)
        return recipe, problems + found

    def _resolve_extends(self, doc: Document) -> tuple[Document | None, list[Problem]]:
        from metralectl.core import inherit

        return inherit.resolve(self, doc)


def _stem(path: str) -> str:
    return Path(path).name.rsplit(".", 1)[0]


def _yaml_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


def _load(path: Path, root: Path | None = None) -> Document:
    name = str(path.relative_to(root)) if root is not None and path.is_relative_to(root) else str(path)
    return load_file(path, name)


def _shipped_problems(problems: list[Problem]) -> None:
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        detail = "\n".join(p.render() for p in errors[:10])
        raise DataError(f"the shipped data is broken (a bug in this release):\n{detail}",
                        "reinstall metralectl; if it persists, report it")


def load_catalog(data_root: Path | None = None, user_dir: Path | None = None, *, include_user: bool = True,
                 use_cache: bool = True) -> Catalog:
    """The checked catalog. Parsing ~40 YAML files costs ~40 ms, so the result is cached on disk,
    keyed by every source file's path, size and mtime (any edit re-checks everything)."""
    root = data_root or paths.data_root()
    user = (user_dir if user_dir is not None else paths.user_data_dir("recipes")) if include_user else None
    if not use_cache:
        return _build_catalog(root, user)
    from metralectl.core import catalog_cache
    key = catalog_cache.fingerprint(root, user)
    cached = catalog_cache.read(key)
    if isinstance(cached, Catalog):
        return cached
    catalog = _build_catalog(root, user)
    catalog_cache.write(key, catalog)
    return catalog


def _build_catalog(root: Path, user_dir: Path | None) -> Catalog:
    catalog = Catalog()
    try:
        _load_engines(catalog, root)
        _load_kernels(catalog, root)
        _load_images(catalog, root)
        shipped_docs = [(_load(p, root), p) for p in _yaml_files(root / "recipes")]
        for data in _plugin_data():  # an engine plugin's own engine file, images and recipes, as shipped data
            _load_engines(catalog, data)
            _load_images(catalog, data)
            shipped_docs += [(_load(p, data), p) for p in _yaml_files(data / "recipes")]
    except YamlSyntax as exc:
        _shipped_problems([exc.problem])
        raise
    for doc, path in _bases_first(shipped_docs):
        recipe, problems = catalog.check_document(doc, RecipeOrigin("shipped", doc.path))
        _shipped_problems(problems)
        if recipe is not None:
            catalog.recipes[recipe.name] = recipe
            catalog.documents[recipe.name] = catalog._resolve_extends(doc)[0] or doc  # what --set and extends build on
    if user_dir is not None:
        _load_user_images(catalog, user_dir.parent / "images")
        from metralectl.core import synced_set
        synced_set.load_into(catalog, user_dir.parent / "synced")  # a synced engine release, below the user's own
        load_user_recipes(catalog, user_dir)
    return catalog


def _bases_first(docs: list[tuple[Document, Path]]) -> list[tuple[Document, Path]]:
    """Shipped recipes in an order where a recipe comes after the one it `extends:`."""
    names = {_name(d) for d, _ in docs}
    done: set[str] = set()
    ordered: list[tuple[Document, Path]] = []
    pending = list(docs)
    while pending:
        ready = [item for item in pending if _base_name(item[0]) not in names - done] or pending[:1]
        for item in ready:
            pending.remove(item)
            ordered.append(item)
            done.add(_name(item[0]))
    return ordered


def _load_user_images(catalog: Catalog, directory: Path) -> None:
    """Your own images (a locally built Hopper tag, a mirror): added to, or replacing, shipped ones."""
    for path in _yaml_files(directory):
        try:
            image, check = parse_image(_load(path))
        except YamlSyntax as exc:
            catalog.refused.append(Refused(str(path), [exc.problem]))
            continue
        if image is None or not check.ok:
            catalog.refused.append(Refused(str(path), check.problems))
            continue
        catalog.images[image.id] = image


def load_user_recipes(catalog: Catalog, directory: Path) -> None:
    docs: list[tuple[Path, Document]] = []
    for path in _yaml_files(directory):
        try:
            docs.append((path, _load(path)))
        except YamlSyntax as exc:
            catalog.refused.append(Refused(str(path), [exc.problem]))
    # A recipe extends the effective one of its base name, so user bases load before what extends them.
    user_names = {str(d.data.get("name")) for _, d in docs if isinstance(d.data, dict)}
    done: set[str] = set()
    while docs:
        ready = [(p, d) for p, d in docs if _base_name(d) not in user_names - done]
        if not ready:  # the rest extend each other in a cycle: refuse each, naming the cycle
            for path, doc in docs:
                catalog.refused.append(Refused(str(path), name=_name(doc), problems=[doc.problem(
                    ("extends",), f"`extends:` forms a cycle: {_cycle_of(doc, docs)}",
                    "one recipe of the cycle must stand on its own (or extend a shipped recipe)")]))
                _shadow(catalog, _name(doc))
            return
        for item in ready:
            docs.remove(item)
            _add_user_recipe(catalog, *item)
            done.add(_name(item[1]))


def _cycle_of(doc: Document, docs: list[tuple[Path, Document]]) -> str:
    by_name = {_name(d): d for _, d in docs}
    chain, current = [_name(doc)], _base_name(doc)
    while current is not None and current not in chain and current in by_name:
        chain.append(current)
        current = _base_name(by_name[current])
    return " → ".join([*chain, current or "?"])


def _shadow(catalog: Catalog, name: str) -> None:
    """A refused user recipe named like a shipped one hides it: `run NAME` must not quietly run the
    shipped recipe the user meant to replace (it says why the user's was refused instead)."""
    catalog.recipes.pop(name, None)
    catalog.documents.pop(name, None)


def _name(doc: Document) -> str:
    return str(doc.data.get("name")) if isinstance(doc.data, dict) else ""


def _base_name(doc: Document) -> str | None:
    base = doc.data.get("extends") if isinstance(doc.data, dict) else None
    return str(base) if base is not None else None


def _add_user_recipe(catalog: Catalog, path: Path, doc: Document) -> None:
    name = _name(doc)
    shipped = catalog.recipes.get(name) if name else None
    overrides = shipped.origin.path if shipped and shipped.origin.kind in ("shipped", "synced") else None
    origin = RecipeOrigin("user", str(path), overrides=overrides, extends=_base_name(doc))
    recipe, problems = catalog.check_document(doc, origin)
    if recipe is None:
        catalog.refused.append(Refused(str(path), problems, name, overrides))
        _shadow(catalog, name)
        return
    catalog.recipes[recipe.name] = recipe
    catalog.documents[recipe.name] = catalog._resolve_extends(doc)[0] or doc


def _plugin_data() -> list[Path]:
    """The data directories engine plugins ship (`Engine.data_dir`: engine/, images/, recipes/ below it)."""
    from metralectl.core.engines.registry import engines

    dirs = [engine.data_dir for engine in engines().values() if engine.data_dir is not None]
    return list(dict.fromkeys(dirs))


def _load_engines(catalog: Catalog, root: Path) -> None:
    for path in _yaml_files(root / "engine"):
        contract, check = parse_contract(_load(path, root), path.parent)
        _shipped_problems(check.problems)
        if contract:
            catalog.engines[contract.name] = contract


def _load_kernels(catalog: Catalog, root: Path) -> None:
    kernels = root / "kernels"
    raw: dict[str, Document] = {}
    for hw_dir in sorted(p for p in kernels.iterdir() if p.is_dir()) if kernels.is_dir() else []:
        if (hw_dir / "hardware.yaml").is_file():
            raw[hw_dir.name] = _load(hw_dir / "hardware.yaml", root)
    # Parents first, so a child can inherit what it does not state.
    pending = dict(raw)
    while pending:
        progressed = False
        for hw_id, doc in list(pending.items()):
            parent_id = doc.data.get("inherits") if isinstance(doc.data, dict) else None
            if parent_id and parent_id not in catalog.hardware:
                if parent_id not in pending:
                    _shipped_problems([doc.problem(("inherits",), f"inherits unknown hardware class {parent_id!r}")])
                continue
            hw, check = parse_hardware(doc, catalog.hardware.get(parent_id) if parent_id else None)
            _shipped_problems(check.problems)
            if hw is not None:
                if hw.id != hw_id:
                    _shipped_problems([doc.problem(("id",), f"id {hw.id!r} differs from its directory {hw_id!r}")])
                catalog.hardware[hw.id] = hw
            del pending[hw_id]
            progressed = True
        if not progressed:
            _shipped_problems([d.problem(("inherits",), "hardware inheritance forms a cycle") for d in pending.values()])
    for hw_id in catalog.hardware:
        models: dict[str, ModelInfo] = {}
        for model_dir in sorted(p for p in (kernels / hw_id).iterdir() if p.is_dir()):
            if (model_dir / "model.yaml").is_file():
                model, check = parse_model(_load(model_dir / "model.yaml", root), hw_id)
                _shipped_problems(check.problems)
                if model is not None:
                    models[model.id] = model
        catalog.models[hw_id] = models


def _load_images(catalog: Catalog, root: Path) -> None:
    for path in _yaml_files(root / "images"):
        image, check = parse_image(_load(path, root))
        _shipped_problems(check.problems)
        if image:
            catalog.images[image.id] = image


def check_files(catalog: Catalog, files: list[Path]) -> list[tuple[str, Recipe | None, list[Problem]]]:
    """`recipes check PATH...`: check files against the catalog without adding them to it."""
    results: list[tuple[str, Recipe | None, list[Problem]]] = []
    for path in files:
        try:
            doc = _load(path)
        except YamlSyntax as exc:
            results.append((str(path), None, [exc.problem]))
            continue
        recipe, problems = catalog.check_document(doc, RecipeOrigin("file", str(path)))
        results.append((str(path), recipe, problems))
    return results


def parse_set_value(text: str) -> object:
    """A --set value read like a YAML scalar (so `true`, `8192`, `0.85`, `off` mean what they say)."""
    try:
        return load_text(text, "--set").data if text.strip() else ""
    except YamlSyntax:
        return text
