"""One serve flag and one environment lever of an engine, as its contract declares them (engine/<name>.yaml
`flags:`; the levers come from the engine's own table): the spec, a recipe's value checked against it, the
argv words it renders to, and a `flags:` entry parsed. Pure. The contract as a whole is core.contract's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from metralectl.core.schema import Checker, type_name

# json: a mapping or list in the recipe, rendered as one compact JSON word (vLLM's --speculative-config);
# negatable: a boolean with both spellings, `true` → --NAME, `false` → --`negation:` (--no-cont-batching).
FLAG_TYPES = ("int", "float", "string", "path", "choice", "flag", "switch", "json", "negatable")
# setting: a recipe states it as its revision's policy requires; resources: rendered from `resources:`;
# launcher: metralectl sets it; forbidden: never in a recipe (reason: says why).
RECIPE_ROLES = ("setting", "resources", "launcher", "forbidden")
SWITCH_VALUES = ("auto", "on", "off")
_FLAG_KEYS = ("type", "default", "min", "max", "exclusive-min", "exclusive-max", "choices", "words", "recipe",
              "with", "resource", "requires", "conflicts", "needs-model", "must-match", "aliases", "help", "reason",
              "unset-word", "negation", "leading-dash")
LEADING_DASH = ("allowed", "refused")  # may a string value begin with '-' (default refused: read as an option)


@dataclass(frozen=True)
class FlagSpec:
    name: str
    type: str
    recipe: str
    default: Any = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_min: float | None = None
    exclusive_max: float | None = None
    choices: tuple[str, ...] = ()
    words: tuple[str, ...] = ()
    trigger: str | None = None  # `with:` the flag that, once set, makes this one required
    resource: str | None = None  # for resources: the resources key it is rendered from
    requires: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    needs_model: str | None = None  # e.g. "mtp": the model must support it
    must_match: str | None = None  # e.g. "checkpoint-quant"
    aliases: tuple[str, ...] = ()  # the engine's other spellings of the option (--served-model-name)
    help: str = ""
    reason: str = ""
    unset_word: str | None = None
    recipe_keys: tuple[str, ...] = ()  # the spelling an engine recipe must use instead (max_model_len)
    source: str = ""  # for a flag the pinned dump lacks: the engine file@commit it was read from
    negation: str | None = None  # negatable: the flag name that says `false` (no-cont-batching)
    leading_dash: bool = False  # `leading-dash: allowed`: the engine's parser takes a value that begins with '-'

    @property
    def option(self) -> str:
        return f"--{self.name}"

    @property
    def is_boolean(self) -> bool:
        return self.type == "flag"

    def check_value(self, value: Any, *, false_allowed: bool = True) -> str | None:
        """Why value is not acceptable for this flag, or None when it is. A presence-only flag takes
        `true` or `false` (`false` = the flag's absence) where the revision's policy allows it."""
        if self.type == "flag":
            if value is True or (value is False and false_allowed):
                return None
            if value is False:
                return ("a boolean key is written `true` or left out under this engine revision; "
                        "`false` restates the default")
            spelled = "`true` or `false`" if false_allowed else "`true` or leave it out"
            return f"is a presence-only switch: write {spelled}, not {type_name(value)}"
        if self.type == "negatable":
            return None if isinstance(value, bool) else f"must be `true` or `false`, not {type_name(value)}"
        if self.type == "json":
            if isinstance(value, (dict, list)):
                return None
            return f"must be a mapping or a list (written as YAML; rendered as JSON), not {type_name(value)}"
        if isinstance(value, str) and value in self.words:
            return None
        if self.type == "switch":
            return None if value in SWITCH_VALUES else f"must be one of auto, on, off — not {type_name(value)}"
        if self.type == "choice":
            return None if value in self.choices else f"must be one of {', '.join(self.choices)} — not {type_name(value)}"
        if self.type in ("string", "path"):
            if not isinstance(value, str) or not value.strip():
                return f"must be a non-empty string, not {type_name(value)}"
            if value.lstrip().startswith("-") and not self.leading_dash:
                return (f"value {value!r} begins with '-': the engine's parser would read it as another option "
                        f"(`{self.option} {value}`), not as this flag's value")
            return None
        if self.type == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                words = f" (or one of {', '.join(self.words)})" if self.words else ""
                return f"must be an integer{words}, not {type_name(value)}"
        elif self.type == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                words = f" (or one of {', '.join(self.words)})" if self.words else ""
                return f"must be a number{words}, not {type_name(value)}"
        return self._range_problem(value)

    def _range_problem(self, value: float) -> str | None:
        if value != value:  # NaN
            return "must be a number, not NaN"
        if self.minimum is not None and value < self.minimum:
            return f"must be at least {self.minimum}, not {value}"
        if self.maximum is not None and value > self.maximum:
            return f"must be at most {self.maximum}, not {value}"
        if self.exclusive_min is not None and value <= self.exclusive_min:
            return f"must be greater than {self.exclusive_min}, not {value}"
        if self.exclusive_max is not None and value >= self.exclusive_max:
            return f"must be less than {self.exclusive_max}, not {value}"
        return None

    def render_value(self, value: Any) -> list[str]:
        """The argv words for this flag set to value (booleans are presence-only)."""
        if self.type == "flag":
            return [self.option] if value is True else []  # `false` is the flag's absence
        if self.type == "negatable":
            return [self.option if value is True else f"--{self.negation}"]
        if self.type == "json":
            return [self.option, json.dumps(value, separators=(",", ":"), sort_keys=True)]
        if self.unset_word is not None and value == self.unset_word:
            return []  # the word that means "not set" (auto-compact: off) is the flag's absence
        return [self.option, _format_scalar(value)]


def _format_scalar(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Lever:
    """A METRALE_* environment lever from the engine's table (serve-options.json `levers`)."""

    name: str
    type: str  # switch | text | int | float | path (the table's type, or our refinement)
    recipe: bool  # may a recipe's env: set it (the table's class is Runtime, unless we say otherwise)
    default: Any = None
    minimum: float | None = None
    help: str = ""
    reason: str = ""
    klass: str = "runtime"  # the engine's class: runtime | dev | tool | build | harness
    flag: str | None = None  # the serve flag that also sets it


def parse_flag(check: Checker, name: str, raw: Any) -> FlagSpec | None:
    """One `flags:` entry of the contract, checked; None (problems on `check`) when it cannot be a flag."""
    where = ("flags", name)
    body = check.mapping(raw, where, f"flag {name}")
    check.known_keys(body, where, _FLAG_KEYS + ("recipe-keys", "source"), f"flag {name}")
    kind = body.get("type")
    role = body.get("recipe", "setting")
    if kind not in FLAG_TYPES:
        check.error(where + ("type",), f"unknown flag type {kind!r}", f"use one of {', '.join(FLAG_TYPES)}")
        return None
    if role not in RECIPE_ROLES:
        check.error(where + ("recipe",), f"unknown recipe role {role!r}", f"use one of {', '.join(RECIPE_ROLES)}")
        return None
    if role == "resources" and not body.get("resource"):
        check.error(where, "a resources flag must name its `resource:` key")
    if kind == "choice" and not body.get("choices"):
        check.error(where, "a choice flag must list its `choices:`")
    if kind == "flag" and role == "resources":
        check.error(where + ("recipe",), "a presence-only flag cannot be rendered from resources")
    if (kind == "negatable") != bool(body.get("negation")):
        check.error(where, "a negatable flag names its `negation:` (the flag that says false), and only it does")
    dash = body.get("leading-dash", "refused")
    if dash not in LEADING_DASH:
        check.error(where + ("leading-dash",), f"leading-dash is one of {', '.join(LEADING_DASH)}, not {dash!r}")
    elif dash == "allowed" and kind not in ("string", "path"):
        check.error(where + ("leading-dash",), "leading-dash is for a string or path flag",
                    "a number's sign is its range: write `min:` below 0 where the engine takes negatives")
    return FlagSpec(
        name=name, type=kind, recipe=role, default=body.get("default"),
        minimum=body.get("min"), maximum=body.get("max"),
        exclusive_min=body.get("exclusive-min"), exclusive_max=body.get("exclusive-max"),
        choices=tuple(str(c) for c in body.get("choices") or ()), words=tuple(str(w) for w in body.get("words") or ()),
        trigger=body.get("with"), resource=body.get("resource"),
        requires=tuple(body.get("requires") or ()), conflicts=tuple(body.get("conflicts") or ()),
        needs_model=body.get("needs-model"), must_match=body.get("must-match"),
        aliases=tuple(body.get("aliases") or ()), help=str(body.get("help", "")), reason=str(body.get("reason", "")),
        unset_word=body.get("unset-word"), recipe_keys=tuple(str(k) for k in body.get("recipe-keys") or ()),
        source=str(body.get("source", "")), negation=body.get("negation"), leading_dash=dash == "allowed",
    )
