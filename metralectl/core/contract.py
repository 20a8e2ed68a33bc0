"""The engine's serve contract (engine/<name>.yaml): flags, levers, rules, readiness.

Pure: loads and checks the contract, and checks one value against one flag. Which flags and levers a
given engine release or commit has, and the recipe policy it enforces, live in its revisions
(metralectl.core.engine_revisions), built from the engine's own serve-options.json.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metralectl.core import engine_profile as P
from metralectl.core.schema import Checker, type_name
from metralectl.core.yamlsrc import Document

if TYPE_CHECKING:
    from metralectl.core.engine_revisions import Policy, Revision

# json: a mapping or list in the recipe, rendered as one compact JSON word (vLLM's --speculative-config);
# negatable: a boolean with both spellings, `true` → --NAME, `false` → --`negation:` (--no-cont-batching).
FLAG_TYPES = ("int", "float", "string", "path", "choice", "flag", "switch", "json", "negatable")
# setting: a recipe states it as its revision's policy requires; resources: rendered from `resources:`;
# launcher: metralectl sets it; forbidden: never in a recipe (reason: says why).
RECIPE_ROLES = ("setting", "resources", "launcher", "forbidden")
SWITCH_VALUES = ("auto", "on", "off")
MULTI_RANK_STRATEGIES = ("none", "rendezvous")
_FLAG_KEYS = ("type", "default", "min", "max", "exclusive-min", "exclusive-max", "choices", "words", "recipe",
              "with", "resource", "requires", "conflicts", "needs-model", "must-match", "aliases", "help", "reason",
              "unset-word", "negation", "leading-dash")
LEADING_DASH = ("allowed", "refused")  # may a string value begin with '-' (default refused: read as an option)
_LEVER_KEYS = ("type", "default", "min", "max", "recipe", "help", "reason")
_READINESS_KEYS = ("style", "marker", "health-path", "health-ready-status", "health-status-key", "health-faulted", "health-reason-key")
_TOP_KEYS = ("schema", "name", "display-name", "binary", "serve-command", "model-argument", "version-command",
             "default-port", "default-bind", "readiness", "log-phases", "log-failures", "endpoints", "flags",
             "request-dialect", "log-prefix", "rules", "auth-flags", "multi-rank", "metrics", "weights", "memory-utilization", "quants", "launcher-sets",
             "exclusive-groups", "rank-symmetric", "levers", "env-passthrough", "served-name-flag")


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


@dataclass(frozen=True)
class LogPattern:
    key: str  # the phase or failure cause
    pattern: re.Pattern[str]
    remedy: str = ""
    source: str = ""  # which engine source / release the wording comes from


@dataclass(frozen=True)
class Readiness:
    """How the engine says it is ready: GET health_path answers ready_status; a faulted body is a failure."""

    health_path: str = "/health"
    ready_status: int = 200
    status_key: str = "status"  # the JSON key of a /health answer that names the state
    faulted: str = "faulted"  # its value once a GPU fault is latched
    reason_key: str = "reason"
    style: str = "health-when-loaded"  # engine_profile.READINESS_STYLES
    marker: re.Pattern[str] | None = None  # warm-up-marker: the log line that says warm-up is done


@dataclass(frozen=True)
class EngineContract:
    name: str
    display_name: str
    binary: str
    serve_command: tuple[str, ...]
    default_port: int
    default_bind: str
    readiness: Readiness
    flags: dict[str, FlagSpec]
    levers: dict[str, Lever]
    exclusive_groups: tuple[tuple[tuple[str, ...], str], ...]
    rank_symmetric: tuple[str, ...]
    env_passthrough: tuple[str, ...]
    endpoints: dict[str, str]
    log_phases: tuple[LogPattern, ...] = ()
    log_failures: tuple[LogPattern, ...] = ()
    aliases: dict[str, str] = field(default_factory=dict)
    revisions: dict[str, Revision] = field(default_factory=dict)  # engine release/commit -> its surface
    default_revision: str = ""  # what a recipe without `engine-revision:` targets
    synced_policy: Policy | None = None  # the policy for a synced release this contract does not name
    lever_refinements: dict[str, dict[str, Any]] = field(default_factory=dict)  # `levers:` of the contract
    # which OpenAI request extensions the engine takes: {ignore-eos|min-tokens|stream-usage|continuous-usage:
    # accepted|refused|unknown}; the benchmark probes the server when anything is unknown
    request_dialect: dict[str, str] = field(default_factory=dict)
    rules: tuple[str, ...] = ()  # engine_profile.RULES this engine's recipes are held to
    model_argument: P.ModelArgument = field(default_factory=P.ModelArgument)
    metrics: P.MetricsMap = field(default_factory=P.MetricsMap)
    weights: P.Weights = field(default_factory=P.Weights)
    memory_meaning: str = "fraction-of-total"  # what resources.memory-utilization means to it
    quants: tuple[str, ...] = ()  # the checkpoint quant words its recipes use
    launcher_sets: dict[str, Any] = field(default_factory=dict)  # flags every launch sets (llama.cpp --metrics)
    log_prefix: re.Pattern[str] | None = None  # what precedes a log line's message (None: the tracing prefix)
    auth_flags: tuple[str, ...] = ()  # serve flags that, all set, put authentication on the endpoint
    multi_rank: str = "none"  # none | rendezvous (ranks meet at --master-addr/--master-port: Metrale's EP=2)
    served_name_flag: str | None = None  # the flag that names the model /v1/models reports (model-name, alias)

    def has_rule(self, rule: str) -> bool:
        return rule in self.rules

    def flag(self, name: str) -> FlagSpec | None:
        return self.flags.get(self.aliases.get(name, name))

    def revision(self, revision_id: str | None) -> Revision | None:
        return self.revisions.get(revision_id or self.default_revision)

    def env_allowed(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.env_passthrough)


def parse_contract(doc: Document, engine_dir: Path | None = None) -> tuple[EngineContract | None, Checker]:
    """Build the contract from its YAML document (and, from engine_dir, the serve-options.json each
    revision pins); problems are reported on the returned Checker."""
    from metralectl.core import engine_revisions
    check = Checker(doc)
    top = check.mapping(doc.data, (), "the engine contract")
    check.known_keys(top, (), _TOP_KEYS + engine_revisions.TOP_KEYS, "the engine contract")
    name = check.string(top, (), "name")
    flags: dict[str, FlagSpec] = {}
    aliases: dict[str, str] = {}
    for flag_name, raw in check.mapping(top.get("flags"), ("flags",), "flags").items():
        spec = _parse_flag(check, str(flag_name), raw)
        if spec:
            flags[spec.name] = spec
            for alias in (*spec.aliases, *(k.replace("_", "-") for k in spec.recipe_keys)):
                aliases[alias] = spec.name  # --served-model-name, and an engine recipe's max_model_len
    for spec in flags.values():
        for other in (spec.trigger, *spec.requires, *spec.conflicts):
            if other and other not in flags:
                check.error(("flags", spec.name), f"refers to unknown flag {other!r}")
    # The lever table is the engine's (each revision's serve-options.json); `levers:` here refines it.
    refinements = engine_revisions.parse_lever_refinements(check, top)
    revisions, default_revision, synced_policy = engine_revisions.parse_revisions(
        check, top, flags, refinements, engine_dir)
    default = revisions.get(default_revision)
    levers = dict(default.levers) if default is not None else {}
    groups = []
    for i, raw in enumerate(top.get("exclusive-groups") or []):
        body = check.mapping(raw, ("exclusive-groups", i), "an exclusive group")
        members = tuple(check.string_list(body, ("exclusive-groups", i), "flags", required=True))
        groups.append((members, str(body.get("reason", ""))))
    readiness = _readiness(check, top)
    if not check.ok or name is None:
        return None, check
    contract = EngineContract(
        name=name,
        display_name=str(top.get("display-name", name)),
        binary=str(top.get("binary", name)),
        serve_command=tuple(top.get("serve-command") or ()),
        default_port=int(top.get("default-port", 8888)),
        default_bind=str(top.get("default-bind", "127.0.0.1")),
        readiness=readiness,
        flags=flags,
        levers=levers,
        exclusive_groups=tuple(groups),
        rank_symmetric=tuple(top.get("rank-symmetric") or ()),
        env_passthrough=tuple(top.get("env-passthrough") or ()),
        endpoints={str(k): str(v) for k, v in (top.get("endpoints") or {}).items()},
        log_phases=_patterns(check, top, "log-phases", "phase"),
        log_failures=_patterns(check, top, "log-failures", "cause"),
        aliases=aliases,
        revisions=revisions,
        default_revision=default_revision,
        synced_policy=synced_policy,
        lever_refinements=refinements,
        request_dialect=_dialect(check, top),
        rules=P.parse_rules(check, top),
        model_argument=P.parse_model_argument(check, top.get("model-argument")),
        metrics=P.parse_metrics(check, top.get("metrics"), name),
        weights=P.parse_weights(check, top.get("weights")),
        memory_meaning=P.parse_memory_meaning(check, top),
        quants=tuple(check.string_list(top, (), "quants", required=True)),
        launcher_sets=_launcher_sets(check, top, flags),
        log_prefix=_log_prefix(check, top),
        auth_flags=tuple(check.string_list(top, (), "auth-flags")),
        multi_rank=str(top.get("multi-rank", "none")),
        served_name_flag=_served_name_flag(check, top, flags),
    )
    for flag in contract.auth_flags:
        if flag not in flags:
            check.error(("auth-flags",), f"names unknown flag {flag!r}")
    if contract.multi_rank not in MULTI_RANK_STRATEGIES:
        check.error(("multi-rank",), f"unknown multi-rank strategy {contract.multi_rank!r}",
                    f"use one of {', '.join(MULTI_RANK_STRATEGIES)}")
    if contract.model_argument.flag and contract.model_argument.flag not in flags:
        check.error(("model-argument", "flag"), f"names unknown flag {contract.model_argument.flag!r}")
    if contract.metrics.enabled_by and contract.metrics.enabled_by not in contract.launcher_sets:
        check.error(("metrics", "enabled-by"), f"--{contract.metrics.enabled_by} turns /metrics on: list it under "
                                               "`launcher-sets:` so every launch sets it")
    return (contract if check.ok else None), check


def _served_name_flag(check: Checker, top: dict[str, Any], flags: dict[str, FlagSpec]) -> str | None:
    """The flag a recipe sets the served model name with: `extends:` may not carry it to another checkpoint."""
    name = top.get("served-name-flag")
    if name is None:
        return None
    spec = flags.get(str(name))
    if spec is None or spec.type != "string" or spec.recipe != "setting":
        check.error(("served-name-flag",), f"must name a declared string flag a recipe sets, not {name!r}")
        return None
    return spec.name


_DIALECT_KEYS = ("ignore-eos", "min-tokens", "stream-usage", "continuous-usage")


def _dialect(check: Checker, top: dict[str, Any]) -> dict[str, str]:
    body = check.mapping(top.get("request-dialect", {}), ("request-dialect",), "request-dialect")
    check.known_keys(body, ("request-dialect",), _DIALECT_KEYS, "request-dialect")
    out = {}
    for key in _DIALECT_KEYS:
        value = str(body.get(key, "unknown"))
        if value not in ("accepted", "refused", "unknown"):
            check.error(("request-dialect", key), f"{value!r}: expected accepted, refused or unknown")
        out[key] = value
    return out
def _log_prefix(check: Checker, top: dict[str, Any]) -> re.Pattern[str] | None:
    if not top.get("log-prefix"):
        return None
    try:
        return re.compile(str(top["log-prefix"]))
    except re.error as exc:
        check.error(("log-prefix",), f"not a valid regular expression: {exc}")
        return None


def _launcher_sets(check: Checker, top: dict[str, Any], flags: dict[str, FlagSpec]) -> dict[str, Any]:
    """Flags metralectl sets on every launch of this engine, with their values (`--metrics`, `--offline`)."""
    body = check.mapping(top.get("launcher-sets", {}), ("launcher-sets",), "launcher-sets")
    out: dict[str, Any] = {}
    for name, value in body.items():
        spec = flags.get(str(name))
        if spec is None:
            check.error(("launcher-sets", name), f"sets unknown flag {name!r}")
            continue
        if spec.recipe != "launcher":
            check.error(("launcher-sets", name), f"--{name} is set by the launcher: give it `recipe: launcher`")
        problem = spec.check_value(value)
        if problem:
            check.error(("launcher-sets", name), f"--{name} {problem}")
        out[spec.name] = value
    return out


def _readiness(check: Checker, top: dict[str, Any]) -> Readiness:
    body = check.mapping(top.get("readiness", {}), ("readiness",), "readiness")
    check.known_keys(body, ("readiness",), _READINESS_KEYS, "readiness")
    status = body.get("health-ready-status", 200)
    if not isinstance(status, int) or isinstance(status, bool) or not 200 <= status < 300:
        check.error(("readiness", "health-ready-status"), f"must be a 2xx HTTP status, not {status!r}")
        status = 200
    style = P.parse_readiness_style(check, body)
    return Readiness(str(body.get("health-path", "/health")), status, str(body.get("health-status-key", "status")),
                     str(body.get("health-faulted", "faulted")), str(body.get("health-reason-key", "reason")),
                     style.style, style.marker)


def _patterns(check: Checker, top: dict[str, Any], key: str, label: str) -> tuple[LogPattern, ...]:
    out = []
    for i, raw in enumerate(top.get(key) or []):
        body = check.mapping(raw, (key, i), key)
        check.known_keys(body, (key, i), (label, "pattern", "remedy", "source"), f"a {key} entry")
        if not str(body.get("source") or "").strip():
            check.error((key, i), "names no `source:`", "say which engine source or release the wording comes from")
        try:
            out.append(LogPattern(str(body.get(label)), re.compile(str(body.get("pattern"))), str(body.get("remedy", "")),
                                  str(body.get("source", ""))))
        except re.error as exc:
            check.error((key, i, "pattern"), f"not a valid regular expression: {exc}")
    return tuple(out)


def _parse_flag(check: Checker, name: str, raw: Any) -> FlagSpec | None:
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
