"""The recipe checker's `serve:` section: each engine flag against its revision's spec, the revision's pin
rule, and the relations between flags (requires, conflicts, the MTP head's quant, exclusive groups)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from metralectl.core.contract import EngineContract
from metralectl.core.engine_flags import FlagSpec
from metralectl.core.engine_revisions import Revision
from metralectl.core.hardware import HardwareClass
from metralectl.core.model_info import ModelInfo
from metralectl.core.schema import Checker, did_you_mean
from metralectl.core.yamlsrc import KeyPath


@dataclass
class Context:
    """What the sections checked so far decided, for the ones that depend on it."""

    contract: EngineContract | None = None
    revision: Revision | None = None
    hardware: HardwareClass | None = None
    model: ModelInfo | None = None
    quant: str | None = None


def check_serve(check: Checker, body: dict[str, Any], where: KeyPath, ctx: Context, *, head: bool,
           base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check a serve mapping; with base, body holds per-rank overrides of base."""
    contract, revision = ctx.contract, ctx.revision
    if contract is None or revision is None:
        return {}
    values: dict[str, Any] = dict(base or {})
    written: dict[str, str] = {}  # flag -> the key it was written as (a flag may have several spellings)
    invalid: set[str] = set()  # written but refused: reported once, not also as "missing"
    for key, value in body.items():
        spec = contract.flag(str(key))
        if spec is None:
            _unknown_flag(check, where + (key,), str(key), contract)
            continue
        if spec.name in written:
            check.error(where + (key,), f"--{spec.name} is given twice, as `{written[spec.name]}` and as `{key}`",
                        f"keep one of them (`{spec.name}` is its name)")
            invalid.add(spec.name)
            continue
        written[spec.name] = str(key)
        if spec.name not in revision.specs:
            having = [r.label for r in contract.revisions.values() if spec.name in r.specs]
            check.error(where + (key,), f"--{spec.name} is not a flag of engine revision {revision.label}",
                        f"it is one of {', '.join(having)}: name that revision in `engine-revision:`"
                        if having else None)
            continue
        spec = revision.specs[spec.name]
        if spec.recipe == "resources":
            check.error(where + (key,), f"--{spec.name} is a resource, not a serve setting",
                        f"set it as `resources.{spec.resource}`")
            continue
        if spec.recipe in ("launcher", "forbidden"):
            why = spec.reason or "metralectl sets it itself when it launches the recipe"
            check.error(where + (key,), f"--{spec.name} cannot be set in a recipe: {why}")
            continue
        problem = spec.check_value(value, false_allowed=revision.policy.false_allowed)
        if problem:
            check.error(where + (key,), f"--{spec.name} {problem}", _value_hint(spec, revision, value))
            invalid.add(spec.name)
            continue
        values[spec.name] = value
    if base is None:
        _required(check, values, where, revision, invalid)
    _relations(check, values, where, contract, ctx)
    return {name: values[name] for name in revision.specs if name in values}


def _unknown_flag(check: Checker, keypath: KeyPath, key: str, contract: EngineContract) -> None:
    bare = key.removeprefix("--")
    if bare != key and contract.flag(bare):
        check.error(keypath, f"write the flag without its dashes: `{bare}:`")
        return
    negated = next((spec for spec in contract.flags.values() if spec.negation == bare), None)
    if negated is not None:
        check.error(keypath, f"--{bare} is written `{negated.name}: false`")
        return
    guess = did_you_mean(bare, list(contract.flags) + list(contract.aliases))
    help_command = " ".join([*_start_words(contract), "--help"])
    check.error(keypath, f"unknown engine flag --{bare} ({contract.display_name} has no such serve flag)",
                f"did you mean `{guess}`?" if guess else f"see `{help_command}` for the flag list")


def _start_words(contract: EngineContract) -> list[str]:
    """How the engine's serve command starts: an image that runs the command it is given has the whole of it in
    serve-command (`vllm serve`, `python3 -m sglang.launch_server`), one whose entrypoint is the binary has the
    words after it (`serve`)."""
    command = list(contract.serve_command)
    if command and command[0] == contract.binary.split()[0]:
        return command
    return [contract.binary, *command]


def _value_hint(spec: FlagSpec, revision: Revision, value: Any = None) -> str | None:
    if isinstance(value, str) and value.lstrip().startswith("-") and spec.type in ("string", "path"):
        return (f"write the value without the leading '-'; only an engine file can let --{spec.name} take one "
                "(`leading-dash: allowed`, where the engine's parser accepts it)")
    if spec.type == "flag":
        if revision.policy.false_allowed:
            return f"write `{spec.name}: true` (on) or `{spec.name}: false` (off: the flag's absence)"
        return f"write `{spec.name}: true`, or remove the line to keep the default (off)"
    if spec.default is not None:
        return f"the engine default is {spec.default}"
    return spec.help or None


def _is_set(values: dict[str, Any], name: str | None) -> bool:
    """Set = stated with a value; a presence-only flag pinned `false` is the flag's absence."""
    return name is not None and values.get(name) is not None and values.get(name) is not False


def _add_hint(spec: FlagSpec, false_allowed: bool = True) -> str:
    """A line to add that the next check accepts (never `false` where the revision refuses it)."""
    if spec.type == "flag":
        return f"add `{spec.name}: false` (off) or `{spec.name}: true`" if false_allowed else f"add `{spec.name}: true`"
    if spec.default is not None:
        return f"add `{spec.name}: {_yaml_word(spec.default)}` (the engine default) or the value you validated"
    return f"add `{spec.name}: ...` (the value the engine resolves it to for this model)"


def _yaml_word(value: Any) -> str:
    return "true" if value is True else "false" if value is False else str(value)


def _required(check: Checker, values: dict[str, Any], where: KeyPath, revision: Revision,
              invalid: Collection[str] = ()) -> None:
    policy = revision.policy
    rule = {"all": "every settable flag pinned", "listed": f"{', '.join(policy.keys)} stated"}.get(
        policy.required, "every flag with an engine default pinned")
    for spec in revision.specs.values():
        if spec.name in values or spec.name in invalid:
            continue
        if policy.requires(spec):
            check.error(where, f"missing --{spec.name}: engine revision {revision.label} wants {rule} "
                               "(nothing inherited silently)", _add_hint(spec, policy.false_allowed))
        elif spec.trigger and _is_set(values, spec.trigger):
            check.error(where, f"missing --{spec.name}: it must be explicit when {spec.trigger} is set",
                        _add_hint(spec, policy.false_allowed))


def _relations(check: Checker, values: dict[str, Any], where: KeyPath, contract: EngineContract,
               ctx: Context) -> None:
    for name, value in values.items():
        spec = contract.flags[name]
        key = where + (name,)
        if not _is_set(values, name):
            continue
        for needed in spec.requires:
            if not _is_set(values, needed):
                check.error(key, f"--{name} requires --{needed}", f"set `{needed}: true` or drop `{name}`")
        for other in spec.conflicts:
            if _is_set(values, other):
                check.error(key, f"--{name} conflicts with --{other}", f"keep one of `{name}` and `{other}`")
        if (spec.must_match == "checkpoint-quant" and contract.has_rule("mtp-quant") and ctx.quant
                and value != ctx.quant):
            check.error(key, f"--{name} {value} does not match the checkpoint's quantization {ctx.quant} "
                             "(mixing produces gibberish)", f"write `{name}: {ctx.quant}`")
        if spec.needs_model == "mtp" and value is True and ctx.model is not None:
            if ctx.model.mtp_supported is False:
                check.error(key, f"{ctx.model.display_name} has no MTP weights, so --{name} cannot work",
                            f"remove `{name}: true` (or use self-speculative / ngram-speculative)")
            elif ctx.model.mtp_supported is None:
                check.warn(key, f"whether {ctx.model.display_name} ships MTP weights is unknown")
    drafts = values.get("num-drafts")
    methods = ("speculative", "self-speculative", "ngram-speculative", "dflash")
    if isinstance(drafts, int) and drafts > 1 and not any(_is_set(values, m) for m in methods):
        # validate_serve_args refuses it (stated in the engine's recipes @61e6559)
        check.error(where + ("num-drafts",), f"--num-drafts {drafts} needs a speculative method",
                    "set `speculative: true` (MTP), or `num-drafts: 1`")
    if values.get("fp8-kv-calibration-tokens") and values.get("kv-cache-dtype") not in (None, "fp8"):
        check.error(where + ("fp8-kv-calibration-tokens",), "FP8 KV calibration only applies to kv-cache-dtype fp8",
                    "set it to 0, or use `kv-cache-dtype: fp8`")
    for members, reason in contract.exclusive_groups:
        chosen = [m for m in members if _is_set(values, m)]
        if len(chosen) > 1:
            check.error(where + (chosen[1],), f"only one of {', '.join('--' + m for m in members)} may be set; "
                                             f"this recipe sets {' and '.join(chosen)} ({reason})",
                        f"keep one of {', '.join(chosen)}")
