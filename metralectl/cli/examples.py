"""Examples for `--help` (and the man page, scripts/man-page.py): a few real command lines per main command,
each with what it does.

tests/unit/test_cli_help_examples.py parses every line with the command's own Click parser and runs
the ones that need no Docker, GPU or network.
"""

from __future__ import annotations

from typing import Any

# command path -> (command line, what it does); each line fits 80 columns in the help's indentation
EXAMPLES: dict[str, tuple[tuple[str, str], ...]] = {
    "": (
        ("metralectl list", "every recipe, fit judged on this box"),
        ("metralectl doctor", "what this machine lacks, with remedies"),
        ("metralectl run demo-cpu", "serve a small model on the CPU"),
        ("metralectl tui", "the dashboard"),
        ("metralectl COMMAND --help", "a command's options and examples"),
    ),
    "list": (
        ("metralectl list", "every recipe, judged on this box"),
        ("metralectl list --hardware gb10 --only", "a GB10's recipes"),
        ("metralectl list --tag agents --json", "as JSON, for a script"),
    ),
    "show": (
        ("metralectl show qwen3.5-35b-a3b", "provenance, memory, docker run"),
        ("metralectl show qwen3.5-35b-a3b --set max-seq-len=16384", "with a change"),
        ("metralectl show demo-cpu --json", "every field, as JSON"),
    ),
    "pull": (
        ("metralectl pull qwen3.5-35b-a3b", "image and weights"),
        ("metralectl pull demo-cpu --weights-only", "only the GGUF file"),
        ("metralectl pull qwen3.5-27b gemma-4-31b --json", "two; JSON summary"),
    ),
    "run": (
        ("metralectl run qwen3.5-35b-a3b", "start, wait until ready"),
        ("metralectl run demo-cpu --set resources.port=8081", "another port"),
        ("metralectl run qwen3.5-35b-a3b --print", "the docker run only"),
        ("metralectl run qwen3-next-80b-a3b --replace", "stop the served first"),
    ),
    "ps": (
        ("metralectl ps", "recipe, state, health, uptime, endpoint"),
        ("metralectl ps --json", "the same, for a script"),
        ("metralectl ps --repair", "finish an interrupted swap"),
    ),
    "logs": (
        ("metralectl logs", "the served engine's last 200 lines"),
        ("metralectl logs -f -n 50", "follow, from the last 50 lines"),
        ("metralectl logs demo-cpu --last-failed", "the log of a failed start"),
    ),
    "stop": (
        ("metralectl stop", "the served model, gracefully"),
        ("metralectl stop --timeout 60", "60 s between SIGTERM and SIGKILL"),
        ("metralectl stop --all", "every metralectl container"),
    ),
    "swap": (
        ("metralectl swap qwen3-next-80b-a3b", "else the old one again"),
        ("metralectl swap demo-cpu --drain-timeout 10", "wait 10 s for requests"),
    ),
    "bench run": (
        ("metralectl bench run decode", "the headline tok/s, recorded"),
        ("metralectl bench run decode -p repeats=3 -p max_tokens=32", "shorter"),
        ("metralectl bench run sweep -p concurrencies=1,4,16 --json", "as JSON"),
        ("metralectl bench run decode --gate 'decode_tok_s_p50>=100'", "exit 2 below"),
        ("metralectl bench run decode --url http://127.0.0.1:8000", "another server"),
    ),
    "bench versus": (
        ("metralectl bench versus vllm-8b llamacpp-8b", "decode, 3 runs each"),
        ("metralectl bench versus A B --repeats 5 --plot v.svg", "stricter, plotted"),
        ("metralectl bench versus A B decode --json", "for a script"),
    ),
    "doctor": (
        ("metralectl doctor", "every setup problem, with its remedy"),
        ("metralectl doctor --recipe demo-cpu", "only what this recipe needs"),
        ("metralectl doctor --json", "the checks as one JSON document"),
        ("metralectl doctor --peer spark2", "the link to a paired node (EP=2)"),
    ),
    "top": (
        ("metralectl top", "GPU and engine, live"),
        ("metralectl top --once --json", "one snapshot, for a script"),
        ("metralectl top --record top.jsonl", "one JSON line per interval"),
    ),
    "chat": (
        ("metralectl chat \"Say hello in French\"", "one answer, streamed"),
        ("metralectl chat demo-cpu", "a conversation, on a terminal"),
        ("metralectl chat --url http://127.0.0.1:8000 \"2+2?\" --json", "as JSON"),
    ),
    "gateway": (
        ("metralectl gateway", "on 127.0.0.1:8090"),
        ("metralectl gateway --listen 127.0.0.1:9000 --json", "JSON status lines"),
    ),
}

COLUMN = 52  # the comments' column at most; a longer command line has its comment two spaces after it
LINE = 76  # the longest example line: 80 columns in the help's four-space indentation (a test holds it)


def lines(path: str) -> list[str]:
    """The examples as printed: `COMMAND  # what it does`, the block's comments in one column."""
    block = EXAMPLES.get(path, ())
    column = max([len(c) + 2 for c, _ in block if len(c) + 2 <= COLUMN], default=COLUMN)
    return [f"{command:<{column}}# {what}" if len(command) + 2 <= column else f"{command}  # {what}"
            for command, what in block]


def epilog(path: str, rest: str = "") -> str:
    """Click's epilog: the examples as a block Click does not rewrap (`\\b`), then `rest` (a paragraph)."""
    block = "\n".join(["\b", "Examples:", *(f"  {line}" for line in lines(path))]) if path in EXAMPLES else ""
    return "\n\n".join(p for p in (block, rest) if p)


def attach(command: Any, path: str) -> None:
    """Give `command` (at `path`, e.g. "bench") and its sub-commands with examples their epilog (the root keeps
    its own paragraph after them); once, however often the tree is built."""
    import click

    if path in EXAMPLES and isinstance(command, click.Command) and "\nExamples:\n" not in (command.epilog or ""):
        command.epilog = epilog(path, command.epilog or "")
    for name, sub in getattr(command, "commands", {}).items():
        attach(sub, f"{path} {name}")
