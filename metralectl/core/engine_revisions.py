"""Engine revisions: the flags and levers one engine release or commit has, and its recipe policy.

A *base* revision is an engine release whose own `met dump-serve-options` output (serve-options.json)
is pinned under engine/ with its sha256: its flag set and lever table come from that file, and our
contract's spec of every one of its flags must agree with it (type, choices, default, aliases) —
any drift refuses the contract. A *delta* revision is a later engine commit whose flag surface we
know only from its sources: the base's flags plus the flags it `adds`, each with the engine file and
commit it was read from (`source:` on the flag). A *synced* revision is built at load time from the
serve-options.json of a release `metralectl recipes sync` fetched.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metralectl.core import serve_options
from metralectl.core.engine_flags import FlagSpec, Lever
from metralectl.core.schema import Checker

if TYPE_CHECKING:
    from metralectl.core.contract import EngineContract

TOP_KEYS = ("revisions", "default-revision", "synced-policy")
REQUIRED_MODES = ("all", "clap-defaults", "listed")
FALSE_MODES = ("allowed", "refused")
_REVISION_KEYS = ("release", "commit", "engine-version", "serve-options", "help-dump", "sha256", "source", "base",
                  "adds", "evidence", "policy")
_POLICY_KEYS = ("required", "presence-false", "excluded", "keys", "source")
_LEVER_REFINEMENT_KEYS = ("type", "min", "recipe", "reason")


@dataclass(frozen=True)
class Policy:
    """What a recipe must state for this revision (the engine's recipe/explicit.rs of that commit)."""

    required: str  # "all": every settable flag; "clap-defaults": every flag with a clap default; "listed": `keys`
    presence_false: str  # "allowed": `key: false` is written and rendered as the flag's absence
    excluded: tuple[str, ...] = ()  # never required (a recipe may still state them)
    source: str = ""
    keys: tuple[str, ...] = ()  # for "listed": the flags every recipe of this engine states

    @property
    def false_allowed(self) -> bool:
        return self.presence_false == "allowed"

    def requires(self, spec: FlagSpec) -> bool:
        if spec.recipe != "setting" or spec.name in self.excluded:
            return False
        if self.required == "listed":
            return spec.name in self.keys
        if self.required == "all":
            return True
        return spec.type != "flag" and spec.default is not None


@dataclass(frozen=True)
class Revision:
    id: str
    commit: str
    policy: Policy
    specs: dict[str, FlagSpec]  # the flags this revision has, in the engine's order
    levers: dict[str, Lever]
    release: str | None = None  # the engine release (bNN) when the revision is one
    base: str | None = None
    source: str = ""
    serve_options: str | None = None  # the pinned dump, relative to the engine directory
    sha256: str | None = None
    engine_version: str = ""
    evidence: str = ""
    synced: bool = False
    added: tuple[str, ...] = field(default=())  # for a delta: the flags it adds to its base

    @property
    def label(self) -> str:
        return self.release or self.id


def parse_lever_refinements(check: Checker, top: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`levers:` in the contract: our refinements of the engine's table (a numeric type, a minimum)."""
    out: dict[str, dict[str, Any]] = {}
    for name, raw in check.mapping(top.get("levers") or {}, ("levers",), "levers").items():
        body = check.mapping(raw, ("levers", name), f"lever {name}")
        check.known_keys(body, ("levers", name), _LEVER_REFINEMENT_KEYS, f"lever {name}")
        out[str(name)] = body
    return out


def build_levers(options: serve_options.ServeOptions, refinements: dict[str, dict[str, Any]]) -> dict[str, Lever]:
    levers: dict[str, Lever] = {}
    for raw in options.levers:
        extra = refinements.get(raw.env, {})
        allowed = extra.get("recipe", raw.klass == "runtime")
        levers[raw.env] = Lever(raw.env, str(extra.get("type", raw.type)), bool(allowed), raw.default,
                                extra.get("min"), "", str(extra.get("reason", "")), raw.klass, raw.flag)
    return levers


def _policy(check: Checker, raw: Any, where: tuple[Any, ...], flags: dict[str, FlagSpec]) -> Policy | None:
    body = check.mapping(raw, where, "a policy")
    check.known_keys(body, where, _POLICY_KEYS, "a policy")
    required, false = body.get("required"), body.get("presence-false")
    if required not in REQUIRED_MODES:
        check.error(where + ("required",), f"must be one of {', '.join(REQUIRED_MODES)}, not {required!r}")
    if false not in FALSE_MODES:
        check.error(where + ("presence-false",), f"must be one of {', '.join(FALSE_MODES)}, not {false!r}")
    excluded = tuple(check.string_list(body, where, "excluded"))
    keys = tuple(check.string_list(body, where, "keys", required=required == "listed"))
    for field_name, names in (("excluded", excluded), ("keys", keys)):
        for name in names:
            if name not in flags:
                check.error(where + (field_name,), f"names unknown flag {name!r}")
    if keys and required != "listed":
        check.error(where + ("keys",), "`keys:` is read only with `required: listed`")
    if not str(body.get("source") or "").strip():
        check.error(where, "a policy names its `source:` (the engine file and commit it comes from)")
    if required not in REQUIRED_MODES or false not in FALSE_MODES:
        return None
    return Policy(str(required), str(false), excluded, str(body.get("source", "")), keys)


def parse_revisions(check: Checker, top: dict[str, Any], flags: dict[str, FlagSpec],
                    refinements: dict[str, dict[str, Any]],
                    engine_dir: Path | None) -> tuple[dict[str, Revision], str, Policy | None]:
    revisions: dict[str, Revision] = {}
    table = check.mapping(top.get("revisions") or {}, ("revisions",), "revisions")
    bases: list[tuple[Revision, serve_options.ServeOptions]] = []
    for rev_id, raw in table.items():
        where = ("revisions", rev_id)
        body = check.mapping(raw, where, f"revision {rev_id}")
        check.known_keys(body, where, _REVISION_KEYS, f"revision {rev_id}")
        commit = check.string(body, where, "commit")
        policy = _policy(check, body.get("policy"), where + ("policy",), flags)
        if commit is None or policy is None:
            continue
        common: dict[str, Any] = {"id": str(rev_id), "commit": commit, "policy": policy,
                                  "release": body.get("release"), "source": str(body.get("source", "")),
                                  "evidence": str(body.get("evidence", ""))}
        if body.get("help-dump"):
            specs = _help_dump_specs(check, body, where, flags, engine_dir)
            if specs is not None:
                revisions[str(rev_id)] = Revision(**common, specs=specs, levers={}, sha256=str(body.get("sha256")),
                                                  engine_version=str(body.get("engine-version", "")))
            continue
        if body.get("serve-options"):
            loaded = _base(check, body, where, flags, refinements, engine_dir)
            if loaded is not None:
                specs, levers, options = loaded
                rev = Revision(**common, specs=specs, levers=levers, serve_options=str(body["serve-options"]),
                               sha256=options.sha256, engine_version=options.engine_version)
                revisions[rev.id] = rev
                bases.append((rev, options))
            continue
        base = revisions.get(str(body.get("base")))
        if base is None:
            check.error(where, "a revision either pins `serve-options:` or names an earlier `base:` revision")
            continue
        added = tuple(check.string_list(body, where, "adds"))
        for name in added:
            if name not in flags or not flags[name].source:
                check.error(where + ("adds",), f"adds {name!r}, which is not a flag of `flags:` with a `source:`")
        specs = {**base.specs, **{n: flags[n] for n in added if n in flags}}
        revisions[str(rev_id)] = Revision(**common, specs=specs, levers=base.levers, base=base.id, added=added,
                                          engine_version=base.engine_version)
    _extras(check, flags, bases)
    default = str(top.get("default-revision") or "")
    if revisions and default not in revisions:
        check.error(("default-revision",), f"names no revision of `revisions:` ({default!r})",
                    f"use one of {', '.join(revisions)}")
    synced = _policy(check, top["synced-policy"], ("synced-policy",), flags) if "synced-policy" in top else None
    return revisions, default, synced


def _base(check: Checker, body: dict[str, Any], where: tuple[Any, ...], flags: dict[str, FlagSpec],
          refinements: dict[str, dict[str, Any]], engine_dir: Path | None
          ) -> tuple[dict[str, FlagSpec], dict[str, Lever], serve_options.ServeOptions] | None:
    if engine_dir is None:
        check.error(where + ("serve-options",), "no engine directory to read the pinned serve-options.json from")
        return None
    try:
        options = serve_options.load(engine_dir / str(body["serve-options"]))
    except serve_options.ServeOptionsError as exc:
        check.error(where + ("serve-options",), str(exc))
        return None
    if options.sha256 != body.get("sha256"):
        check.error(where + ("sha256",), f"the pinned serve-options.json has sha256 {options.sha256}, "
                                         f"not the recorded {body.get('sha256')}",
                    "the pinned dump is the engine's, byte for byte: restore it, or record a new release")
    specs: dict[str, FlagSpec] = {}
    for dump in options.flags:
        spec = flags.get(dump.flag)
        if spec is None:
            check.error(("flags",), f"--{dump.flag} of the engine's {body.get('release')} serve-options.json "
                                    "is missing from `flags:`", "run `scripts/engine-contract.py generate`")
            continue
        for problem in serve_options.flag_drift(dump, spec):
            check.error(("flags", dump.flag), f"drifts from the engine's {body.get('release')} dump: {problem}",
                        "run `scripts/engine-contract.py generate`, then review the diff")
        specs[spec.name] = spec
    for name in refinements:
        if name not in {lv.env for lv in options.levers}:
            check.error(("levers", name), f"refines {name}, which the engine's lever table does not declare")
    return specs, build_levers(options, refinements), options


def _help_dump_specs(check: Checker, body: dict[str, Any], where: tuple[Any, ...], flags: dict[str, FlagSpec],
                     engine_dir: Path | None) -> dict[str, FlagSpec] | None:
    """A revision whose authority is the engine's pinned `--help` text: every declared flag, under every
    spelling we accept or render, must be an option that text lists."""
    from metralectl.core import help_dump
    if engine_dir is None:
        check.error(where + ("help-dump",), "no engine directory to read the pinned help text from")
        return None
    try:
        dump = help_dump.load(engine_dir / str(body["help-dump"]))
    except help_dump.HelpDumpError as exc:
        check.error(where + ("help-dump",), str(exc))
        return None
    if dump.sha256 != body.get("sha256"):
        check.error(where + ("sha256",), f"the pinned help text has sha256 {dump.sha256}, not the recorded "
                                         f"{body.get('sha256')}", "the pinned text is the binary's, byte for byte")
    for name, spec in flags.items():
        spellings = [spec.option, *(f"--{a}" if not a.startswith("-") else a for a in spec.aliases)]
        if spec.negation:
            spellings.append(f"--{spec.negation}")
        for option in spellings:
            if option not in dump.options:
                check.error(("flags", name), f"{option} is not an option of the engine's pinned help "
                                             f"({body.get('help-dump')})", "check the spelling against `--help`")
    return dict(flags)


def _extras(check: Checker, flags: dict[str, FlagSpec], bases: list[tuple[Revision, Any]]) -> None:
    """A flag of our table must come from a pinned dump, or name the engine source it was read from."""
    if not bases:
        return
    in_dumps = {name for rev, _ in bases for name in rev.specs}
    for name, spec in flags.items():
        if name not in in_dumps and not spec.source:
            check.error(("flags", name), "is in no pinned serve-options.json and names no `source:`",
                        "remove it, or say which engine file@commit it was read from")


def synced_revision(contract: EngineContract, rev_id: str, commit: str, release: str | None,
                    options: serve_options.ServeOptions, source: str) -> Revision:
    """A revision for a synced release: its own dump decides the flags; our specs add types and roles
    where we know the flag, and a flag we do not know gets the type its dump record implies."""
    specs: dict[str, FlagSpec] = {}
    for dump in options.flags:
        known = contract.flags.get(dump.flag)
        kind = serve_options.inferred_type(dump)
        if known is None:
            spec = FlagSpec(dump.flag, kind, "setting", serve_options.typed_default(dump.default, kind),
                            choices=dump.options, aliases=dump.cli_aliases, recipe_keys=dump.recipe_aliases)
        else:
            kind = kind if kind in ("flag", "choice") else (known.type if known.type not in ("flag", "choice") else kind)
            try:
                default = serve_options.typed_default(dump.default, kind, known.words)
            except ValueError:
                kind, default = "string", dump.default
            spec = dataclasses.replace(known, type=kind, default=default, choices=dump.options,
                                       aliases=dump.cli_aliases, recipe_keys=dump.recipe_aliases)
        specs[spec.name] = spec
    policy = contract.synced_policy or Policy("clap-defaults", "allowed", (), "metralectl default")
    policy = dataclasses.replace(policy, excluded=tuple(n for n in policy.excluded if n in specs))
    levers = build_levers(options, contract.lever_refinements)
    return Revision(rev_id, commit, policy, specs, levers, release=release, source=source,
                    sha256=options.sha256, engine_version=options.engine_version, synced=True)
