"""The `metralectl` console script: the one command-line definition, and the one error boundary.

The root is a plain Click group whose commands load lazily from the table in cli/commands.py: the root's
`--help` lists them from the table, and a command's module (Typer with it, for the modules that declare
their commands with Typer) is imported only when that command runs or its help is asked for. So
`--help` costs Click and this module, `list` Click and its own body. Command modules import nothing heavy
at module level (docker, textual, httpx, huggingface_hub and pynvml are imported inside the functions that
need them).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from metralectl import __version__
from metralectl.cli import examples, state
from metralectl.cli.commands import COMMANDS
from metralectl.errors import ExitCode

COMPLETE_VAR = "_METRALECTL_COMPLETE"  # what Click derives from the program's name; the scripts set it
EPILOG = f"Exit codes: {', '.join(f'{c.value} {c.name.lower()}' for c in ExitCode)} (docs/exit-codes.md)."


class LazyGroup(click.Group):
    """The root group. Its commands come from cli/commands.py, each module imported on first use.

    Click's own usage errors (unknown option or command, missing or malformed argument) end with
    ExitCode.USAGE, not Click's 2, which the table gives to a gate that said no; sub-commands and sub-groups
    are parsed inside this group's invoke, so their errors pass here too."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self.commands.update(_load(COMMANDS[cmd_name].module))
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Click's listing, from the table's summaries: no command module is imported for `--help`."""
        shown = [(name, entry.summary) for name, entry in COMMANDS.items() if not entry.hidden]
        limit = formatter.width - 6 - max(len(name) for name, _ in shown)
        rows = [(name, click.Command(name, help=summary).get_short_help_str(limit)) for name, summary in shown]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        if parent is None:  # every sub-context inherits it
            extra.setdefault("terminal_width", help_width())
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            exc.exit_code = ExitCode.USAGE  # type: ignore[misc]  # click reads it per instance
            raise

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        """One suggestion for a mistyped command, among the commands --help lists (not the hidden aliases)."""
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            if args and exc.message.startswith("No such command"):
                from difflib import get_close_matches

                close = get_close_matches(args[0], [n for n, e in COMMANDS.items() if not e.hidden])
                if hasattr(exc, "possibilities"):  # Click 8.4+ words the suggestion itself
                    exc.possibilities = close or None
                elif close:  # an older Click: Typer's wording
                    guess = ", ".join(map(repr, close))
                    exc.message = f"No such command {args[0]!r}. Did you mean {guess}?"  # type: ignore[misc]
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            exc.exit_code = ExitCode.USAGE  # type: ignore[misc]
            raise
        except KeyboardInterrupt as exc:  # Ctrl-C in a command: said once, by _run
            raise click.Abort() from exc

    def _main_shell_completion(self, ctx_args: Any, prog_name: str, complete_var: str | None = None) -> None:
        """A TAB in a shell that sourced `metralectl completion SHELL`: Typer's answer formats, the ones its
        scripts read (Click's own differ), and RECIPE arguments completing to recipe names."""
        instruction = os.environ.get(COMPLETE_VAR)
        if not instruction:
            return
        from typer.completion import completion_init, shell_complete

        _COMPLETING.append(True)
        completion_init()
        sys.exit(shell_complete(self, ctx_args, prog_name, COMPLETE_VAR, instruction))


def help_width() -> int:
    """The width Click's help formatter takes when none is given (shutil.get_terminal_size's columns, at most 80,
    less 2, at least 50), found without the `shutil` import Click makes for it: shutil brings zlib, bz2 and lzma,
    ~3 ms of every `--help`."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
        columns = columns or 80
    return max(min(columns, 80) - 2, 50)


_COMPLETING: list[bool] = []  # set on a TAB: loaded commands get recipe-name completion


def _load(module_name: str) -> dict[str, click.Command]:
    """A command module's commands, built: a plain Click module's named commands, or what a Typer module's
    register(app) declares, built by Typer as the root Typer app built them before it was plain Click."""
    module = importlib.import_module(module_name)
    built = {name: getattr(module, e.command) for name, e in COMMANDS.items() if e.module == module_name and e.command}
    if not built:
        import typer
        import typer.main

        app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)
        module.register(app)
        built = dict(typer.main.get_group(app).commands)
    for name, command in built.items():
        _prepare(command, name)
    return built


def _prepare(command: click.Command, path: str) -> None:
    """What the tree needs of a command built by Typer: each main command's examples in its help
    (cli/examples.py), one suggestion for a mistyped sub-command, and on a TAB recipe names for RECIPE."""
    examples.attach(command, path)
    _one_suggestion(command)
    if _COMPLETING:
        from metralectl.cli.habit_cmds import complete_recipes

        complete_recipes(command)


def _one_suggestion(command: click.Command) -> None:
    """Click 8.4+ ends "No such command" with its own "Did you mean ...?", and Typer's groups add theirs to
    the same message ("Did you mean 'list'? Did you mean 'list'?"): where Click suggests, Typer's groups stay
    quiet; with an older Click, Typer's is their only one."""
    if not hasattr(click.exceptions, "NoSuchCommand"):
        return
    groups = [command]
    while groups:
        group = groups.pop()
        if isinstance(group, click.Group):
            if hasattr(group, "suggest_commands"):  # a TyperGroup
                group.suggest_commands = False
            groups.extend(group.commands.values())


def _version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        print(f"metralectl {__version__}")
        ctx.exit()


@click.group(cls=LazyGroup, name="metralectl", epilog=examples.epilog("", EPILOG), invoke_without_command=True,
             help="The operator's cockpit for DGX Spark (GB10), Hopper and B200 boxes running the Metrale engine.",
             context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks and internal detail on errors (also: METRALECTL_DEBUG=1).")
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version, help="Print the version.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Launch validated recipes, check the machine, watch the GPU, benchmark the endpoint."""
    state.DEBUG = debug or state.debug_from_env()
    if ctx.invoked_subcommand is None:
        if sys.stdin.isatty() and sys.stdout.isatty():  # a person at a terminal: the dashboard (lazily)
            from metralectl.cli.tui_cmd import launch

            launch()
            return
        click.echo(ctx.get_help())


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: every exit status is an ExitCode. MetralError -> one line + hint on stderr and its
    code; a usage error -> USAGE; Ctrl-C -> INTERRUPTED; anything unexpected -> SOFTWARE (the last three
    and MetralError in state.guarded)."""
    args = sys.argv[1:] if argv is None else list(argv)
    state.DEBUG = state.debug_from_env()  # before the root's callback runs: an error parsing the command line
    state.guarded(lambda: _run(args))


def build_command() -> click.Group:
    """The whole tree, every command loaded (the man page and the tests walk it; the CLI never needs it)."""
    ctx = click.Context(cli, info_name="metralectl")
    for name in cli.list_commands(ctx):
        cli.get_command(ctx, name)
    return cli


def _run(args: list[str]) -> int:
    """Click's own ways of ending, as exit codes."""
    try:
        code = cli.main(args=args, prog_name="metralectl", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        print("metralectl: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except click.ClickException as exc:
        exc.show()  # click's own errors are about the command line (unknown option, bad value, no such file)
        return ExitCode.USAGE
    return ExitCode.of(code) if isinstance(code, int) else ExitCode.OK


if __name__ == "__main__":
    main()
