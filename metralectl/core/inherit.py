"""`extends:`: a recipe built on another. What it inherits, what it may not, and why a parent is missing.

Inherited: every setting, as the checker then checks it. Not inherited: where the parent came from
(`source:`, `provenance:`), and its `validated:` figures once the child serves another checkpoint or runs
on another hardware class (they were measured on the parent's). Refused: a child that serves another
checkpoint under the parent's pinned served name (the engine's `served-name-flag`, Metrale's
`model-name`): clients would see the parent's model in /v1/models (docs/recipes.md, "extends:").
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from metralectl.core import checker_text
from metralectl.core.schema import Checker, did_you_mean
from metralectl.core.yamlsrc import Document, KeyPath, overlay
from metralectl.errors import Problem

if TYPE_CHECKING:
    from metralectl.core.catalog import Catalog

NOT_INHERITED = ("source", "provenance")


def resolve(catalog: Catalog, doc: Document) -> tuple[Document | None, list[Problem]]:
    """The child merged over its parent, and the problems of the inheritance (None: no parent to merge)."""
    data = doc.data if isinstance(doc.data, dict) else {}
    if data.get("extends") is None:
        return doc, []
    check = Checker(doc)
    base_name = checker_text.recipe_name(check, ("extends",), data["extends"], "extends:")
    if base_name is None:
        return None, check.problems
    base = catalog.documents.get(base_name)
    if base is None:
        return None, [_missing_parent(catalog, doc, base_name)]
    parent = base.data if isinstance(base.data, dict) else {}
    changed = _changed(parent, data)
    dropped = NOT_INHERITED + (("validated",) if changed else ())
    inherited = Document(base.path, {k: v for k, v in parent.items() if k not in dropped}, base.marks, base.origins)
    problems: list[Problem] = []
    if changed:
        problems += served_name(catalog, doc, base_name, parent, data)
        if "validated" not in data:
            inherited.data["validated"] = {}  # nothing measured for this checkpoint here: TOK/S shows `-`
            figures = _mapping(parent.get("validated"))
            if figures.get("decode-tok-s") is not None:
                problems.append(doc.problem(changed[0], f"the validated figures of {base_name} (decode "
                                            f"{figures['decode-tok-s']} tok/s) are not inherited: they were "
                                            f"measured on its {_what(changed[0])}",
                                            "state this recipe's own `validated:` once you have measured it",
                                            severity="warning"))
    return overlay(inherited, doc, drop=("extends",)), problems


def _mapping(value: Any) -> dict[Any, Any]:
    return value if isinstance(value, dict) else {}


def _norm(key: str, value: object) -> object:
    return value.lower() if key == "repo" and isinstance(value, str) else value


def _changed(parent: dict[str, Any], child: dict[str, Any]) -> list[KeyPath]:
    """The keys (as the child writes them) where it serves another checkpoint or hardware than its parent."""
    out: list[KeyPath] = []
    mine, theirs = child.get("checkpoint"), parent.get("checkpoint")
    if isinstance(mine, dict) and isinstance(theirs, dict):
        out += [("checkpoint", key) for key in ("repo", "model", "quant")
                if key in mine and _norm(key, mine[key]) != _norm(key, theirs.get(key))]
    if "hardware" in child and child["hardware"] != parent.get("hardware"):
        out.append(("hardware",))
    return out


def _what(keypath: KeyPath) -> str:
    return {"repo": "checkpoint", "model": "model", "quant": "quantization"}.get(str(keypath[-1]), "hardware class")


def served_name(catalog: Catalog, doc: Document, base_name: str, parent: dict[str, Any],
                child: dict[str, Any]) -> list[Problem]:
    """A child (or a `--set`) of another checkpoint (repo or model) that would serve under the parent's pinned
    name: refused, naming the served-name flag, at the line that moved the checkpoint."""
    moved = [k for k in _changed(parent, child) if k[0] == "checkpoint" and k[1] in ("repo", "model")]
    engine = catalog.engines.get(str(child.get("engine", parent.get("engine"))))
    if not moved or engine is None or engine.served_name_flag is None:
        return []
    spec = engine.flags[engine.served_name_flag]
    spellings = (spec.name, *spec.aliases)
    theirs, mine = _mapping(parent.get("serve")), _mapping(child.get("serve"))
    pinned = next((theirs[s] for s in spellings if theirs.get(s) is not None), None)
    if pinned is None or any(s in mine for s in spellings):
        return []
    line, column = doc.where(moved[0])
    checkpoint = child["checkpoint"]
    new = checkpoint.get("repo") if moved[0][1] == "repo" else checkpoint.get("model")
    suggestion = new if isinstance(new, str) and checker_text.hidden_character(new) is None else "<the name>"
    return [Problem(doc.origin(moved[0]), line, column, f"serve.{spec.name}",
                    f"this recipe serves {new!r} but inherits {base_name}'s --{spec.name} {pinned!r}: clients "
                    f"would see {base_name}'s model in /v1/models (and compare it with its figures)",
                    f"state the name this checkpoint is served under: `{spec.name}: {suggestion}` in `serve:` "
                    f"(or `--set {spec.name}={suggestion}`)")]


def _missing_parent(catalog: Catalog, doc: Document, name: str) -> Problem:
    """Why `extends: name` finds nothing: a refused recipe of that name hides it, or there is none."""
    refused = next((r for r in catalog.refused if name in (r.name, Path(r.path).name.rsplit(".", 1)[0])), None)
    if refused is not None:
        errors = [p for p in refused.problems if p.severity == "error"] or refused.problems
        first = f" ({errors[0].location()}: {errors[0].key or 'document'}: {errors[0].message})" if errors else ""
        if refused.overrides:
            why = (f"the shipped {name!r} is hidden because your override {refused.path} was refused{first}")
            hint = f"fix {refused.path} (`metralectl recipes check {refused.path}`), or remove it to extend the shipped recipe"
        else:
            why = f"{name!r} ({refused.path}) was refused{first}"
            hint = f"fix it first: `metralectl recipes check {refused.path}`"
        return doc.problem(("extends",), f"cannot extend {name!r}: {why}", hint)
    guess = did_you_mean(name, catalog.documents)
    return doc.problem(("extends",), f"cannot extend unknown recipe {name!r}",
                       f"did you mean `{guess}`?" if guess else "`metralectl list` shows the recipes")
