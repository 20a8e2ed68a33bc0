#!/usr/bin/env python3
"""Dump TensorRT-LLM's own `trtllm-serve` click command as an option dump (engine/trtllm/<key>/serve-options.json).

  python3 scripts/trtllm-options.py SRC > engine/trtllm/4c05a748/serve-options.json

SRC is a TensorRT-LLM source tree at the pinned commit (at least tensorrt_llm/commands/serve.py; cached outside the
clone under /var/cache/metralectl/trtllm-src/<key>/, docs/engines.md "TensorRT-LLM"). Any Python with click runs it:
metralectl's venv does. The module is imported with its heavy imports (torch, the tensorrt_llm package, yaml,
strenum) stubbed in sys.modules, then click's OWN objects are read: the `serve` command's params, in click's order
(name, option strings, type, default, help, is_flag, multiple). Nothing of TensorRT-LLM runs.

What the option definitions take from other modules is not in the pinned source and is stubbed, not guessed:
`BuildConfig.max_*` (the defaults of --max_beam_width/--max_batch_size/--max_num_tokens/--max_seq_len) are written
as no default, and the choices of --log_level (`severity_map`) and --reasoning_parser
(`ReasoningParserFactory.parsers`) as a free string. The record shape is scripts/vllm-options.py's (schema 2).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import click

PARSER = "tensorrt_llm.commands.serve:serve (click)"
SERVE = Path("tensorrt_llm") / "commands" / "serve.py"
_TYPES = {"text": "str", "integer": "int", "float": "float", "boolean": "bool", "choice": "choice"}


class _Stub(types.ModuleType):
    """A module whose every attribute is a stub: a class for names, an empty mapping for data."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "severity_map":
            return {}
        return type(name, (), {"parsers": {}, "__getattr__": lambda self, n: None,
                               "max_beam_width": None, "max_batch_size": None, "max_num_tokens": None,
                               "max_seq_len": None})


def _stub_imports() -> None:
    for name in ("torch", "torch.cuda", "yaml", "strenum", "tensorrt_llm", "tensorrt_llm._tensorrt_engine",
                 "tensorrt_llm._torch", "tensorrt_llm._torch.auto_deploy", "tensorrt_llm._torch.auto_deploy.llm",
                 "tensorrt_llm._utils", "tensorrt_llm.executor", "tensorrt_llm.executor.utils",
                 "tensorrt_llm.inputs", "tensorrt_llm.inputs.multimodal", "tensorrt_llm.llmapi",
                 "tensorrt_llm.llmapi.disagg_utils", "tensorrt_llm.llmapi.llm_utils",
                 "tensorrt_llm.llmapi.mpi_session", "tensorrt_llm.llmapi.reasoning_parser", "tensorrt_llm.logger",
                 "tensorrt_llm.serve"):
        sys.modules[name] = _Stub(name)
    sys.modules["strenum"].StrEnum = str  # type: ignore[attr-defined]  # a base class of the module's own enum


def load_serve(src: Path) -> click.Command:
    _stub_imports()
    spec = importlib.util.spec_from_file_location("trtllm_serve_pinned", src / SERVE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    command = module.serve
    assert isinstance(command, click.Command), type(command)
    return command


def _first_sentence(text: str | None) -> str:
    paragraph = " ".join((text or "").split())
    return paragraph.split(". ", 1)[0].rstrip(".") + "." if paragraph else ""


def _default(param: click.Parameter) -> str | None:
    value = param.default
    if value is None or callable(value):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def record(param: click.Option) -> dict[str, Any]:
    longs = [o for o in param.opts if o.startswith("--")]
    shorts = [o for o in param.opts if not o.startswith("--")]
    type_name = _TYPES.get(param.type.name, param.type.name)
    choices = [str(c) for c in getattr(param.type, "choices", ())]
    if type_name == "choice" and not choices:
        type_name = "str"  # choices from a module the pinned source does not include (see the docstring)
    kind = "store_true" if param.is_flag else ("append" if param.multiple else "store")
    return {
        "key": param.name,
        "flag": longs[0][2:],
        "presence_only": bool(param.is_flag),
        "is_bool": bool(param.is_flag),
        "options": choices,
        "default": None if param.is_flag and param.default is False else _default(param),
        "help": _first_sentence(param.help),
        "cli_aliases": [o[2:] for o in longs[1:]],
        "recipe_aliases": [],
        "action": kind,
        "type": None if param.is_flag else type_name,
        "nargs": None,
        "negation": None,
        "short_options": shorts,
        "suppressed": bool(param.hidden),
    }


def dump(src: Path, version: str) -> dict[str, Any]:
    command = load_serve(src)
    flags = [record(p) for p in command.params if isinstance(p, click.Option)]
    positionals = [p.name for p in command.params if isinstance(p, click.Argument)]
    return {"schema_version": 2, "engine": "trtllm", "engine_version": version, "parser": PARSER,
            "generator": "scripts/trtllm-options.py", "positionals": positionals, "flags": flags, "levers": []}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path, help="a TensorRT-LLM source tree at the pinned commit")
    parser.add_argument("--version", default="4c05a748", help="the revision key written as engine_version")
    args = parser.parse_args()
    if not (args.src / SERVE).is_file():
        parser.error(f"{args.src / SERVE}: no such file (the pinned TensorRT-LLM source; docs/engines.md)")
    sys.stdout.write(json.dumps(dump(args.src, args.version), indent=2, ensure_ascii=True) + "\n")


if __name__ == "__main__":
    main()
