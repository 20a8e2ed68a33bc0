"""The engine's serve contract (engine/<name>.yaml): flags, levers, rules, readiness.

Pure: loads and checks the contract. One flag's spec and the check of one value against it are
core.engine_flags'. Which flags and levers a given engine release or commit has, and the recipe policy
it enforces, live in its revisions (metralectl.core.engine_revisions), built from the engine's own
serve-options.json.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, get_args

from metralectl.core import engine_profile as P
from metralectl.core import engine_revisions
from metralectl.core.engine_config import ConfigFile, parse_config_file
from metralectl.core.engine_flags import FlagSpec, Lever, parse_flag
from metralectl.core.engine_revisions import Policy, Revision
from metralectl.core.engine_token_file import TokenFile, parse_token_file
from metralectl.core.schema import Checker
from metralectl.core.yamlsrc import Document

MultiRank = Literal["none", "rendezvous"]
MULTI_RANK_STRATEGIES: tuple[MultiRank, ...] = get_args(MultiRank)
_READINESS_KEYS = ("style", "marker", "health-path", "health-ready-status", "health-status-key", "health-faulted", "health-reason-key")
_TOP_KEYS = ("schema", "name", "display-name", "binary", "serve-command", "model-argument", "version-command",
             "default-port", "default-bind", "readiness", "log-phases", "log-failures", "endpoints", "flags",
             "request-dialect", "log-prefix", "rules", "auth-flags", "multi-rank", "metrics", "weights", "memory-utilization", "fit-roles", "quants", "launcher-sets",
             "exclusive-groups", "rank-symmetric", "levers", "env-passthrough", "served-name-flag", "process",
             "config-file", "token-file")


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
    style: P.ReadinessStyleName = "health-when-loaded"
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
    rules: tuple[P.RuleName, ...] = ()  # engine_profile.RULES this engine's recipes are held to
    model_argument: P.ModelArgument = field(default_factory=P.ModelArgument)
    metrics: P.MetricsMap = field(default_factory=P.MetricsMap)
    weights: P.Weights = field(default_factory=P.Weights)
    memory_meaning: P.MemoryMeaning = "fraction-of-total"  # what resources.memory-utilization means to it
    fit_roles: P.FitRoles = field(default_factory=P.FitRoles)  # the flags of the fit estimate's generic KV pool
    quants: tuple[str, ...] = ()  # the checkpoint quant words its recipes use
    launcher_sets: dict[str, Any] = field(default_factory=dict)  # flags every launch sets (llama.cpp --metrics)
    log_prefix: re.Pattern[str] | None = None  # what precedes a log line's message (None: the tracing prefix)
    auth_flags: tuple[str, ...] = ()  # serve flags that, all set, put authentication on the endpoint
    multi_rank: MultiRank = "none"  # none | rendezvous (ranks meet at --master-addr/--master-port: Metrale's EP=2)
    served_name_flag: str | None = None  # the flag that names the model /v1/models reports (model-name, alias)
    process: P.ProcessStart | None = None  # how it starts as a host process (`runtime: process`); None: it cannot
    config_file: ConfigFile | None = None  # the file a recipe's `engine-config:` becomes (core/engine_config.py)
    token_file: TokenFile | None = None  # how it is handed metralectl's engine token (core/engine_token_file.py)

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
    check = Checker(doc)
    top = check.mapping(doc.data, (), "the engine contract")
    check.known_keys(top, (), _TOP_KEYS + engine_revisions.TOP_KEYS, "the engine contract")
    name = check.string(top, (), "name")
    flags: dict[str, FlagSpec] = {}
    aliases: dict[str, str] = {}
    for flag_name, raw in check.mapping(top.get("flags"), ("flags",), "flags").items():
        spec = parse_flag(check, str(flag_name), raw)
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
        fit_roles=P.parse_fit_roles(check, top.get("fit-roles"), flags),
        quants=tuple(check.string_list(top, (), "quants", required=True)),
        launcher_sets=_launcher_sets(check, top, flags),
        log_prefix=_log_prefix(check, top),
        auth_flags=tuple(check.string_list(top, (), "auth-flags")),
        multi_rank=cast(MultiRank, str(top.get("multi-rank", "none"))),  # checked below
        served_name_flag=_served_name_flag(check, top, flags),
        process=P.parse_process(check, top.get("process")),
        config_file=parse_config_file(check, top.get("config-file"), flags),
        token_file=parse_token_file(check, top.get("token-file"), flags),
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
