"""An engine's own description of its serve surface (serve-options.json): Metrale's `met dump-serve-options`,
or vLLM's argument parser dumped by scripts/vllm-options.py in the same shape.

Metrale publishes its dump beside each release's recipes; vLLM's is made from the installed package. This module
reads one, and compares it with the flags of our contract (engine/<name>.yaml), which is how drift is caught
(scripts/engine-contract.py check, tests/unit/test_engine_contract.py, tests/unit/test_vllm_contract.py). A dump
of an argparse parser says more than Metrale's (the action, the value converter, the `--no-*` negation): those
records decide the value type (`value_type`) where Metrale's leave it to be inferred from the default. Pure; json only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from metralectl.core.engine_flags import FlagSpec

SCHEMA_VERSIONS = (2,)  # the shape of serve-options.json this reader understands
LEVER_CLASSES = ("runtime", "dev", "tool", "build", "harness")
# A serve flag's value as our types read it (None: no default; a mapping or list: a json flag's).
FlagValue = bool | int | float | str | dict[str, Any] | list[Any] | None


class ServeOptionsError(ValueError):
    """The file is not a serve-options.json this reader understands."""


@dataclass(frozen=True)
class DumpFlag:
    key: str  # the clap field name, e.g. max_seq_len
    flag: str  # the long option without dashes, e.g. max-seq-len
    presence_only: bool
    options: tuple[str, ...]
    default: str | None  # clap's default as text; None = no clap default
    cli_aliases: tuple[str, ...]
    recipe_aliases: tuple[str, ...]  # the spelling an engine recipe must use (max_model_len, host, ...)
    negation: str | None = None  # an argparse BooleanOptionalAction's `--no-*` spelling (vLLM), without dashes
    value_type: str | None = None  # our type word when the dump says it (an argparse dump), else None: inferred


@dataclass(frozen=True)
class DumpLever:
    env: str
    klass: str  # runtime | dev | tool | build | harness
    type: str  # switch | text | int | path | float
    default: str | None
    flag: str | None  # the serve flag that also sets it
    reader: str


@dataclass(frozen=True)
class ServeOptions:
    schema_version: int
    engine_version: str
    flags: tuple[DumpFlag, ...]
    levers: tuple[DumpLever, ...]
    sha256: str

    def flag(self, name: str) -> DumpFlag | None:
        return next((f for f in self.flags if f.flag == name), None)


def sha256_file(path: Path) -> str:
    import hashlib  # here, not at the top: `list` reads a cached catalog and never hashes (OpenSSL's load)

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# An argparse dump's value converters (scripts/vllm-options.py `type`), by our type word; any other is a string.
INT_CONVERTERS = ("int", "human_readable_int", "human_readable_int_or_auto")
JSON_CONVERTERS = ("loads", "union_dict_and_str", "parse_dataclass")


def _argparse_type(raw: dict[str, Any]) -> str | None:
    """Our type for one record of an argparse dump (None for a record without `action`: Metrale's)."""
    action = raw.get("action")
    if not isinstance(action, str):
        return None
    if action == "boolean_optional":
        return "negatable"
    if raw.get("presence_only"):
        return "flag"
    if raw.get("options"):
        return "choice"
    converter = raw.get("type")
    if converter in INT_CONVERTERS:
        return "int"
    if converter == "float":
        return "float"
    if converter in JSON_CONVERTERS:
        return "json"
    return "string"


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ServeOptionsError(f"{where} must be a list of strings")
    return tuple(value)


def parse(data: bytes, name: str = "serve-options.json") -> ServeOptions:
    """Read serve-options.json bytes; ServeOptionsError names what is wrong."""
    try:
        top = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ServeOptionsError(f"{name} is not JSON: {exc}") from None
    if not isinstance(top, dict):
        raise ServeOptionsError(f"{name} must be a JSON object")
    version = top.get("schema_version")
    if version not in SCHEMA_VERSIONS:
        raise ServeOptionsError(f"{name} has schema_version {version!r}; this metralectl reads "
                                f"{', '.join(map(str, SCHEMA_VERSIONS))}")
    flags = []
    for i, raw in enumerate(top.get("flags") or []):
        where = f"{name}: flags[{i}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("flag"), str) or not isinstance(raw.get("key"), str):
            raise ServeOptionsError(f"{where} needs string `key` and `flag`")
        default, negation = raw.get("default"), raw.get("negation")
        if negation is not None and not isinstance(negation, str):
            raise ServeOptionsError(f"{where}.negation must be a string")
        flags.append(DumpFlag(raw["key"], raw["flag"], bool(raw.get("presence_only")),
                              _strings(raw.get("options"), where + ".options"),
                              None if default is None else str(default),
                              _strings(raw.get("cli_aliases"), where + ".cli_aliases"),
                              _strings(raw.get("recipe_aliases"), where + ".recipe_aliases"),
                              negation, _argparse_type(raw)))
    levers = []
    for i, raw in enumerate(top.get("levers") or []):
        if not isinstance(raw, dict) or not isinstance(raw.get("env"), str):
            raise ServeOptionsError(f"{name}: levers[{i}] needs a string `env`")
        default = raw.get("default")
        levers.append(DumpLever(raw["env"], str(raw.get("class", "")).lower(), str(raw.get("type", "text")),
                                None if default in (None, "unset") else str(default),
                                raw.get("flag") if isinstance(raw.get("flag"), str) else None,
                                str(raw.get("reader", ""))))
    if not flags:
        raise ServeOptionsError(f"{name} lists no flags")
    import hashlib

    return ServeOptions(int(version), str(top.get("engine_version", "")), tuple(flags), tuple(levers),
                        hashlib.sha256(data).hexdigest())


def load(path: Path) -> ServeOptions:
    from metralectl.filecap import FileRefused, read_bytes

    try:  # at most what a release's serve-options.json may be (release_archive.LIMITS)
        data = read_bytes(path, 16 << 20, "engine option dump")
    except OSError as exc:
        raise ServeOptionsError(f"cannot read {path}: {exc.strerror or exc}") from None
    except FileRefused as exc:
        raise ServeOptionsError(exc.message) from None
    return parse(data, str(path))


# --- types of a flag that the dump does not state ----------------------------------------------

def inferred_type(flag: DumpFlag) -> str:
    """The value type a flag's dump record implies (our contract may refine a `string`)."""
    if flag.presence_only:
        return "flag"
    if flag.options:
        return "choice"
    if flag.value_type is not None:
        return flag.value_type
    if flag.default is None:
        return "string"
    for kind, convert in (("int", int), ("float", float)):
        try:
            convert(flag.default)
        except ValueError:
            continue
        return kind
    return "string"


def typed_default(text: str | None, kind: str, words: tuple[str, ...] = ()) -> FlagValue:
    """The dump's default text as a value of our type (None when clap has no default)."""
    if text is None:
        return None
    if kind in ("flag", "negatable"):
        return text == "true"
    if text in words:
        return text
    if kind == "json":  # an argparse dump writes a mapping or list default as JSON; a config object's repr is no value
        try:
            value = json.loads(text)
        except ValueError:
            return None
        return value if isinstance(value, (dict, list)) else None
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    return text


def flag_drift(dump: DumpFlag, spec: FlagSpec) -> list[str]:
    """How our contract's spec of a flag disagrees with the engine's record of it ([] = none)."""
    out = []
    if dump.presence_only != (spec.type == "flag"):
        out.append(f"presence-only is {dump.presence_only} in the dump, our type is {spec.type}")
    if dump.negation != spec.negation:
        out.append(f"negation differs: dump {dump.negation!r}, ours {spec.negation!r}")
    if dump.value_type is not None and dump.value_type != spec.type and not (
            dump.value_type == "string" and spec.type == "path"):
        out.append(f"the dump's type is {dump.value_type}, ours is {spec.type}")
    if tuple(dump.options) != tuple(spec.choices):
        out.append(f"choices differ: dump {list(dump.options)}, ours {list(spec.choices)}")
    if dump.options and spec.type != "choice":
        out.append(f"the dump lists options, our type is {spec.type} (want choice)")
    if spec.type in ("int", "float") and dump.default is not None and dump.default not in spec.words:
        if inferred_type(dump) not in ("int", "float") or (spec.type == "int" and inferred_type(dump) != "int"):
            out.append(f"type {spec.type} does not fit the dump's default {dump.default!r}")
    try:
        expected = typed_default(dump.default, spec.type, spec.words)
    except ValueError:
        expected = dump.default
    ours = spec.default
    if spec.type == "flag":
        expected, ours = bool(expected), bool(ours)
    if expected != ours or (expected is not None and type(expected) is not type(ours) and spec.type != "float"):
        out.append(f"default differs: dump {dump.default!r}, ours {spec.default!r}")
    if tuple(dump.cli_aliases) != tuple(spec.aliases):
        out.append(f"aliases differ: dump {list(dump.cli_aliases)}, ours {list(spec.aliases)}")
    if tuple(dump.recipe_aliases) != tuple(spec.recipe_keys):
        out.append(f"recipe keys differ: dump {list(dump.recipe_aliases)}, ours {list(spec.recipe_keys)}")
    return out
