"""Recipe sections the checker reads beside `serve:`: `env:`, `validated:`, `source:`/`provenance:`."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Protocol

from metralectl.core import checker_text as text
from metralectl.core.recipe import Provenance, Validated
from metralectl.core.schema import Checker, did_you_mean, type_name
from metralectl.core.yamlsrc import KeyPath

if TYPE_CHECKING:
    from metralectl.core.contract import EngineContract
    from metralectl.core.engine_revisions import Revision

ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # fullmatch: no trailing newline
SWITCH_WORDS = ("1", "0")  # what a switch lever's value is: the engine documents `1` (on) and `0` (off)
VALIDATED_KEYS = ("source", "engine-revision", "hardware", "date", "decode-tok-s", "image", "notes")
SOURCES = ("engine", "book")
PROVENANCE_KEYS = ("repo", "path", "commit", "sha256", "taken", "release", "deviations")
DEVIATION_KEYS = ("key", "upstream", "ours", "why")


class _World(Protocol):
    hardware: dict[str, Any]


def check_env(check: Checker, top: dict[str, Any], contract: EngineContract | None,
              revision: Revision | None) -> dict[str, str]:
    """A recipe's env: Runtime levers of the revision's table, or the contract's pass-through names."""
    env = check.mapping(top.get("env") or {}, ("env",), "env")
    out: dict[str, str] = {}
    levers = revision.levers if revision is not None else (contract.levers if contract else {})
    for name, value in env.items():
        key: KeyPath = ("env", name)
        name = str(name)
        if not ENV_NAME_RE.fullmatch(name):
            check.error(key, f"{name!r} is not a valid environment variable name")
            continue
        if isinstance(value, (dict, list)) or value is None:
            check.error(key, f"an environment value must be a plain value, not {type_name(value)}")
            continue
        if contract is None:
            continue
        lever = levers.get(name)
        label = f"engine revision {revision.label}" if revision is not None else contract.display_name
        runtime = [n for n, lv in levers.items() if lv.recipe]
        if lever is not None:
            if not lever.recipe:
                why = lever.reason or (f"the engine's lever table classes it {lever.klass.capitalize()}, and a "
                                       "recipe may set Runtime levers only")
                guess = did_you_mean(name, runtime)
                check.error(key, f"{name} cannot be set in a recipe: {why}",
                            f"did you mean the Runtime lever `{guess}`?" if guess else
                            "a recipe's env may set the engine's Runtime levers (`met dump-serve-options`)")
                continue
            problem = _lever_value(lever.type, lever.minimum, value)
            if problem:
                check.error(key, f"{name} {problem}")
                continue
        elif name.startswith("METRALE_") and contract.has_rule("env-levers"):
            guess = did_you_mean(name, runtime)
            check.error(key, f"{name} is not a lever of {label}; the engine refuses to start with an "
                             "undeclared METRALE_* name",
                        f"did you mean `{guess}`?" if guess else "see `met dump-serve-options` for the levers")
            continue
        elif not contract.env_allowed(name):
            check.error(key, f"{name} is not a runtime lever of {contract.display_name}",
                        f"a recipe's env may name the engine's Runtime levers (METRALE_*) "
                        f"or {', '.join(contract.env_passthrough)}")
            continue
        out[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def _number(value: object, kind: type[int] | type[float]) -> float | None:
    """An environment value is text: `1.0` and "1.0" mean the same number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            return kind(value.strip())
        except ValueError:
            return None
    return value if isinstance(value, int) or (kind is float and isinstance(value, float)) else None


def _lever_value(kind: str, minimum: float | None, value: Any) -> str | None:
    if kind == "int":
        number = _number(value, int)
        if number is None or number < (minimum or 0):
            return f"must be a whole number ≥ {minimum or 0}, not {type_name(value)}"
    elif kind == "float":
        if _number(value, float) is None:
            return f"must be a number, not {type_name(value)}"
    elif kind == "switch":
        if isinstance(value, bool) or str(value) not in SWITCH_WORDS:
            return (f"is a switch: write '1' (on) or '0' (off), not {type_name(value)} (the engine reads the "
                    "text, and `true` or 'yes' is not `1`)")
    elif kind in ("text", "path") and isinstance(value, str) and not value.strip():
        return "must not be empty"
    return None


def check_validated(check: Checker, top: dict[str, Any], world: _World) -> Validated:
    where: KeyPath = ("validated",)
    body = check.mapping(top.get("validated") or {}, where, "validated")
    check.known_keys(body, where, VALIDATED_KEYS, "validated")
    hw = check.string(body, where, "hardware", required=False, nullable=True)
    if hw and hw not in world.hardware:
        check.error(where + ("hardware",), f"unknown hardware class {hw!r}")
    elif hw and isinstance(top.get("hardware"), str) and hw != top["hardware"]:
        check.error(where + ("hardware",), f"the figures were measured on {hw}, and this recipe runs on "
                                           f"{top['hardware']}: `list` would show them as this recipe's",
                    f"state what was measured on {top['hardware']}, or `validated: {{hardware: null, "
                    "decode-tok-s: null}` until it is")
    date = text.iso_date(check, where + ("date",),
                         check.string(body, where, "date", required=False, nullable=True))
    tok_s = check.number(body, where, "decode-tok-s", required=False, nullable=True, minimum=0)
    return Validated(
        source=check.string(body, where, "source", required=False, nullable=True),
        engine_revision=check.string(body, where, "engine-revision", required=False, nullable=True),
        hardware=hw, date=date, decode_tok_s=tok_s,
        image=check.string(body, where, "image", required=False, nullable=True),
        notes=check.string(body, where, "notes", required=False, nullable=True),
    )


def check_source(check: Checker, top: dict[str, Any]) -> tuple[str | None, Provenance | None]:
    """`source: engine` (with `provenance:` naming the upstream file) or `source: book`."""
    source = top.get("source")
    if source is not None and source not in SOURCES:
        check.error(("source",), f"source must be one of {', '.join(SOURCES)}, not {type_name(source)}",
                    "engine: re-expressed from an engine recipe (give `provenance:`); book: from the engine book")
        source = None
    if "provenance" not in top:
        if source == "engine":
            check.error(("source",), "an engine recipe names the upstream file it re-expresses",
                        "add `provenance:` with repo, path, commit, sha256 and taken")
        return source, None
    where: KeyPath = ("provenance",)
    body = check.mapping(top["provenance"], where, "provenance")
    check.known_keys(body, where, PROVENANCE_KEYS, "provenance")
    strings = {k: check.string(body, where, k) for k in ("repo", "path", "commit", "sha256")}
    taken = check.string(body, where, "taken", required=False, nullable=True)
    release = check.string(body, where, "release", required=False, nullable=True)
    commit, sha = strings["commit"], strings["sha256"]
    if commit:
        text.commit(check, where + ("commit",), commit, "the upstream file's commit, all 40 hex digits")
    if sha and text.name_problem("sha256", sha) is not None:
        check.error(where + ("sha256",), f"{sha!r} is not a sha256 (64 lower-case hex digits)")
    text.iso_date(check, where + ("taken",), taken)
    deviations = []
    for i, raw in enumerate(body.get("deviations") or []):
        here = where + ("deviations", i)
        item = check.mapping(raw, here, "a deviation")
        check.known_keys(item, here, DEVIATION_KEYS, "a deviation")
        fields = [check.string(item, here, k) for k in ("key", "why")]
        if all(fields):
            deviations.append((str(item["key"]), _text(item.get("upstream")), _text(item.get("ours")), str(item["why"])))
    if None in strings.values() or not check.ok:
        return source, None
    return source, Provenance(str(strings["repo"]), str(strings["path"]), str(commit), str(sha), taken, release,
                              tuple(deviations))


def _text(value: Any) -> str:
    if value is None:
        return "(absent)"
    return str(value).lower() if isinstance(value, bool) else str(value)
