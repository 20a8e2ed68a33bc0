"""Every top-level command: its name, the module that defines it, and the first paragraph of its help.

cli/main.py's root group reads this table: `list_commands` is its keys (in the order `--help` lists them),
`get_command` imports the command's module on first use, and the root's `--help` lists each command's
summary from here, so `metralectl --help` imports no command module (the pattern of large Click apps, pip's
`commands_dict` among them). tests/unit/test_cli_table.py holds every summary and `hidden` to the command's
own help, and every command a module registers to a row here.

A row's module either defines its commands with Typer and registers them (`register(app)`: the module's
commands are built when the first of them is asked for) or, where the start itself is timed (`list`, `ps`,
`tui`: benchmarks/cold_start.py and benchmarks/tui.py), names a plain Click command (`command=`).
"""

from __future__ import annotations

from typing import NamedTuple


class Entry(NamedTuple):
    module: str
    summary: str  # the help's first paragraph, as the command's own help says it
    hidden: bool = False  # an alias: answered, not listed
    command: str | None = None  # a plain Click command's attribute in `module`; None: `module.register(app)`


_LIST = "metralectl.cli.catalog_list"
_CATALOG = "metralectl.cli.catalog_cmds"
_SERVE = "metralectl.cli.serve_cmds"
_STAGING = "metralectl.cli.staging_cmds"
_DISK = "metralectl.cli.disk_cmds"
_AGENT = "metralectl.cli.agent_cmds"
_PEER = "metralectl.cli.peer_cmds"
_HABIT = "metralectl.cli.habit_cmds"
_INFO = "metralectl.cli.info_cmd"

COMMANDS: dict[str, Entry] = {
    "list": Entry(_LIST, "List the recipes: engine, model, quant, hardware, MTP, validated tok/s, memory, fit, "
                         "cached weights (alias: ls).", command="list_command"),
    "ls": Entry(_LIST, "Same as `list`.", hidden=True, command="ls_command"),
    "show": Entry(_CATALOG, "Show a recipe: settings, provenance, memory estimate, and the command it renders."),
    "doctor": Entry("metralectl.cli.doctor_cmd", "Check this machine for everything that stops a model from being "
                                                 "served, with the fix for each."),
    "run": Entry(_SERVE, "Serve a recipe and wait until it is really ready (--print: show the `docker run` instead)."),
    "ps": Entry("metralectl.cli.ps_report", "What metralectl is serving: recipe, state, health, uptime, endpoint, "
                                            "image revision.", command="ps_command"),
    "logs": Entry(_SERVE, "The engine's log (stdout). With -f, follows and returns when the container exits. With no "
                          "container (a start that failed and was cleaned up), the log metralectl kept of that start."),
    "stop": Entry(_SERVE, "Stop gracefully (kill after --timeout), verify the container is gone and memory came back."),
    "swap": Entry(_SERVE, "Replace the served model; if the new one does not become ready, restore the previous one."),
    "chat": Entry("metralectl.cli.chat_cmd", "Ask the served model: one streamed answer to PROMPT, or a conversation "
                                             "on a terminal."),
    "pull": Entry(_STAGING, "Stage recipes: pull the engine image and download + verify the checkpoint into the HF "
                            "cache."),
    "images": Entry(_STAGING, "The engine images metralectl knows: which are local, their revision, platform, and the "
                              "recipes using them."),
    "rm": Entry(_DISK, "Remove recipes' weights from the HF cache (a GGUF recipe: only its quant) and/or catalog "
                       "images."),
    "prune": Entry(_DISK, "Remove weights metralectl pulled that no recipe names, dead downloads, and catalog images "
                          "no recipe runs."),
    "top": Entry("metralectl.cli.top_cmd", "Live view of the GPUs, the served engines and the gateways: util, "
                                           "power, energy rate, thermal, memory, tok/s, TTFT."),
    "tui": Entry("metralectl.cli.tui_cmd", "Open the dashboard: Serving, Library, Benchmarks and Doctor views "
                                           "(keyboard first; ctrl+p for commands).", command="tui"),
    "id": Entry(_AGENT, "This box's identity: its Ed25519 fingerprint (created on first use)."),
    "verify": Entry(_AGENT, "Check a signed benchmark record and its per-request timings against this box's key and "
                            "its paired peers' keys (exit 1 if anything does not verify)."),
    "nodes": Entry(_PEER, "For each node: admitted for benchmarks, or refused and why (exit 1 if any is refused)."),
    "version": Entry(_HABIT, "Print the version (same as --version)."),
    "search": Entry(_HABIT, "Find recipes by words: the table of `list`, only the recipes every word matches."),
    "completion": Entry(_HABIT, "Print the shell completion script for SHELL. Load it with, for bash: `source "
                                "<(metralectl completion bash)`; zsh: `source <(metralectl completion zsh)` (after "
                                "compinit); fish: `metralectl completion fish | source`. install/install.sh installs "
                                "it for your login shell."),
    "info": Entry(_INFO, "Show where metralectl keeps config, state, logs, bench records, caches and the HF cache "
                         "(alias: paths)."),
    "paths": Entry(_INFO, "Same as `info`.", hidden=True),
    "recipes": Entry("metralectl.cli.recipes_cmds", "Check and inspect recipe files."),
    "bench": Entry("metralectl.cli.bench_cmds", "Benchmark the served endpoint; keep and compare the results."),
    "gateway": Entry("metralectl.cli.gateway_cmd", "Serve one OpenAI-compatible endpoint that routes each request by "
                                                   "its `model` to the engine serving it."),
    "agent": Entry(_AGENT, "The background agent: local API + control-plane page + peer listener. `agent start` runs "
                           "it in the background; plain `agent` in this terminal."),
    "peer": Entry(_PEER, "Other metralectl nodes this box trusts by key (pairing, grants)."),
    "export": Entry("metralectl.cli.export_cmds", "Write a recipe as Kubernetes manifests or a Compose file (the same "
                                                  "container `run` starts)."),
}
