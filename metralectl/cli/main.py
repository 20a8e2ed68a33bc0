"""The `metralectl` entry point: the Typer app, and the one error boundary.

Command modules are small and import nothing heavy at module level (docker, textual, httpx,
huggingface_hub and pynvml are imported inside the functions that need them), so `--help` and
`list` start fast.
"""

from __future__ import annotations

import os
import sys

import click
import typer

from metralectl import __version__
from metralectl.cli import help_cache, state
from metralectl.errors import ExitCode


class _Group(typer.core.TyperGroup):
    """The root group: click's own usage errors (unknown option or command, missing or malformed
    argument) end with ExitCode.USAGE, not click's 2, which the table gives to a gate that said no.
    Sub-commands and sub-groups are parsed inside this group's invoke, so their errors pass here too."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: object) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)  # type: ignore[arg-type]
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

                shown = [name for name, command in self.commands.items() if not command.hidden]
                close = get_close_matches(args[0], shown)
                if hasattr(exc, "possibilities"):  # Click 8.4+ words the suggestion itself
                    exc.possibilities = close or None  # type: ignore[misc]
                elif close:  # an older Click: Typer's wording, which the root's own group no longer adds
                    guess = ", ".join(map(repr, close))
                    exc.message = f"No such command {args[0]!r}. Did you mean {guess}?"  # type: ignore[misc]
            raise

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            exc.exit_code = ExitCode.USAGE  # type: ignore[misc]  # click reads it per instance
            raise


EPILOG = f"Exit codes: {', '.join(f'{c.value} {c.name.lower()}' for c in ExitCode)} (docs/exit-codes.md)."

app = typer.Typer(
    name="metralectl",
    cls=_Group,
    epilog=EPILOG,
    help="The operator's cockpit for DGX Spark (GB10), Hopper and B200 boxes running the Metrale engine.",
    no_args_is_help=False,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"metralectl {__version__}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks and internal detail on errors "
                                                      "(also: METRALECTL_DEBUG=1)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Launch validated recipes, check the machine, watch the GPU, benchmark the endpoint."""
    state.DEBUG = debug or state.debug_from_env()
    if ctx.invoked_subcommand is None:
        if sys.stdin.isatty() and sys.stdout.isatty():  # a person at a terminal: the dashboard (lazily)
            from metralectl.cli.tui_cmd import launch

            return launch()
        click.echo(ctx.get_help())


def _register() -> None:
    # Command modules are light at import: each imports its heavy libraries inside its commands.
    from metralectl.cli import (agent_cmds, bench_cmds, catalog_cmds, chat_cmd, disk_cmds, doctor_cmd, peer_cmds,
                                recipes_cmds, serve_cmds, staging_cmds, top_cmd, tui_cmd)
    from metralectl.cli import habit_cmds, info_cmd

    for module in (catalog_cmds, doctor_cmd, serve_cmds, chat_cmd, staging_cmds, disk_cmds, top_cmd, tui_cmd):
        module.register(app)
    app.add_typer(recipes_cmds.app, name="recipes")
    for module in (bench_cmds, agent_cmds, peer_cmds):
        module.register(app)
    for module in (habit_cmds, info_cmd):
        module.register(app)


_register()


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: every exit status is an ExitCode. MetralError -> one line + hint on stderr and its
    code; a usage error -> USAGE; Ctrl-C -> INTERRUPTED; anything unexpected -> SOFTWARE (the last three
    and MetralError in state.guarded, the boundary cli/entry.py's fast answers share)."""
    args = sys.argv[1:] if argv is None else argv
    state.guarded(lambda: _run(args))


def build_command() -> click.Command:
    """The Click command tree, with each main command's examples in its help (cli/examples.py)."""
    from metralectl.cli import examples

    root = typer.main.get_command(app)
    examples.attach(root)
    return root


def _run(args: list[str]) -> int:
    """Click's own ways of ending, as exit codes."""
    command = build_command()
    _one_suggestion(command)
    if os.environ.get("_METRALECTL_COMPLETE"):  # a TAB in a shell that sourced `metralectl completion SHELL`
        from typer.completion import completion_init

        completion_init()  # Typer's answer formats, the ones its scripts read (Click's own differ)
        from metralectl.cli.habit_cmds import complete_recipes

        complete_recipes(command)
    if args in help_cache.HELP_FORMS:
        _remember_help(command)
    try:
        code = command.main(args=args, prog_name="metralectl", standalone_mode=False)
    except click.exceptions.Exit as exc:
        if exc.exit_code == ExitCode.INTERRUPTED and isinstance(exc.__cause__, KeyboardInterrupt):  # Typer's ^C
            print("metralectl: interrupted", file=sys.stderr)
        return exc.exit_code
    except click.exceptions.Abort:
        print("metralectl: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except click.ClickException as exc:
        exc.show()  # click's own errors are about the command line (unknown option, bad value, no such file)
        return ExitCode.USAGE
    return ExitCode.of(code) if isinstance(code, int) else ExitCode.OK


def _one_suggestion(command: click.Command) -> None:
    """Click 8.4+ ends "No such command" with its own "Did you mean ...?", and Typer's groups add theirs
    to the same message ("Did you mean 'list'? Did you mean 'list'?"): the root writes its own message
    (_Group.resolve_command); where Click suggests, Typer's sub-groups stay quiet; with an older Click,
    Typer's is their only one."""
    if isinstance(command, typer.core.TyperGroup):
        command.suggest_commands = False
    if not hasattr(click.exceptions, "NoSuchCommand"):
        return
    groups = [command]
    while groups:
        group = groups.pop()
        if isinstance(group, typer.core.TyperGroup):
            group.suggest_commands = False
        if isinstance(group, click.Group):
            groups.extend(group.commands.values())


def _remember_help(command: click.Command) -> None:
    """Keep the top-level help for cli/entry.py: exactly what Click's --help prints (text + newline)."""
    try:
        context = command.make_context("metralectl", [], resilient_parsing=True)
        help_cache.write(context.get_help() + "\n")
    except Exception:  # noqa: BLE001 - the cache is only a shortcut; --help below answers regardless
        pass


if __name__ == "__main__":
    main()
