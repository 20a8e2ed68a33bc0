#!/usr/bin/env python3
"""Dump SGLang's own server argument parser as an option dump (engine/sglang/<version>/serve-options.json).

Run it with a Python that can import `sglang.srt.server_args` (not metralectl's):

  ENV=$(bash tests/realengines/sglang_args_env.sh)     # the sglang wheel unpacked + the vLLM CPU venv's Python
  env -i PATH=/usr/bin:/bin HOME=$HOME PYTHONPATH=$ENV/site $ENV/python scripts/sglang-options.py \
      > engine/sglang/0.5.23/serve-options.json

It builds the parser `python -m sglang.launch_server` builds (`sglang.srt.server_args.prepare_server_args`:
an `argparse.ArgumentParser` given to `ServerArgs.add_cli_args`) and writes every action of it in the shape
scripts/vllm-options.py writes vLLM's (its record/default/help functions, loaded from beside this file), with two
SGLang differences: its deprecated actions (`DeprecatedStoreTrueAction`, ...) are recorded as the argparse action
they behave as, and choices built from a set (`--sampling-backend`) are sorted so the dump is deterministic.
SGLang's server_args needs torch and a few small packages to import, not a GPU: sglang_args_env.sh reuses the
CPU torch of the vLLM venv the tests already build. Run it with a clean environment (SGLANG_* variables move
some defaults and choices).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

PARSER = "sglang.srt.server_args.ServerArgs.add_cli_args"
# SGLang's own action classes, by the argparse action they behave as (sglang/srt/arg_groups/argparse_actions.py).
_BEHAVES_AS = {"DeprecatedStoreTrueAction": "store_true", "DeprecatedStoreConstAction": "store_const",
               "DeprecatedAliasStoreAction": "store", "LoRAPathAction": "store"}


def _vllm_dumper() -> Any:
    path = Path(__file__).resolve().with_name("vllm-options.py")
    spec = importlib.util.spec_from_file_location("vllm_options", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(dumper: Any, action: argparse.Action) -> dict[str, Any]:
    if isinstance(action.choices, (set, frozenset)):
        action.choices = sorted(action.choices, key=str)
    out: dict[str, Any] = dumper.record(action)
    kind = _BEHAVES_AS.get(out["action"])
    if out["action"] == "DeprecatedStoreConstAction" and action.nargs != 0:
        kind = "store"  # its valued form: retires a flag whose one accepted value (choices) moved elsewhere
    if kind is not None:
        out["action"] = kind
        out["presence_only"] = out["is_bool"] = kind in ("store_true", "store_const")
    return out


def dump() -> dict[str, Any]:
    dumper = _vllm_dumper()
    sys.argv = [sys.argv[0]]
    from sglang.srt.server_args import ServerArgs
    from sglang.version import __version__

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    flags = [record(dumper, a) for a in parser._actions
             if a.option_strings and not isinstance(a, argparse._HelpAction)]
    positionals = [a.dest for a in parser._actions if not a.option_strings]
    return {"schema_version": dumper.SCHEMA_VERSION, "engine": "sglang", "engine_version": __version__,
            "parser": PARSER, "generator": "scripts/sglang-options.py", "positionals": positionals,
            "flags": flags, "levers": []}


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    sys.stdout.write(json.dumps(dump(), indent=2, ensure_ascii=True) + "\n")


if __name__ == "__main__":
    main()
