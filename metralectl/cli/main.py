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
from metralectl.cli import state
app = typer.Typer(
    name="metralectl",
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
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks and internal detail on errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Launch validated recipes, check the machine, watch the GPU, benchmark the endpoint."""
    state.DEBUG = debug or bool(os.environ.get("METRALECTL_DEBUG"))
    if ctx.invoked_subcommand is None:
        if sys.stdin.isatty() and sys.stdout.isatty():  # a person at a terminal: the dashboard (lazily)
            from metralectl.cli.tui_cmd import launch

            return launch()
        click.echo(ctx.get_help())


def _register() -> None:
    # Command modules are light at import: each imports its heavy libraries inside its commands.
    from metralectl.cli import (agent_cmds, bench_cmds, catalog_cmds, doctor_cmd, peer_cmds, recipes_cmds,
                                serve_cmds, staging_cmds, top_cmd, tui_cmd)

    for module in (catalog_cmds, doctor_cmd, serve_cmds, staging_cmds, top_cmd, tui_cmd):
        module.register(app)
    app.add_typer(recipes_cmds.app, name="recipes")
    for module in (bench_cmds, agent_cmds, peer_cmds):
        module.register(app)


_register()


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: MetralError -> one line + hint on stderr and its exit code; Ctrl-C -> 130."""
    from metralectl.errors import MetralError

    args = sys.argv[1:] if argv is None else argv
    command = typer.main.get_command(app)
    try:
        code = command.main(args=args, prog_name="metralectl", standalone_mode=False)
    except MetralError as exc:
        state.report_error(exc)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        if exc.exit_code == 130 and isinstance(exc.__cause__, KeyboardInterrupt):  # Typer's form of Ctrl-C
            print("metralectl: interrupted", file=sys.stderr)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        print("metralectl: interrupted", file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:
        print("metralectl: interrupted", file=sys.stderr)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        # `metralectl list | head`: the reader left; not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except Exception:
        if state.DEBUG:
            raise
        import traceback

        last = traceback.format_exc().strip().splitlines()[-1]
        print(f"metralectl: internal error: {last}", file=sys.stderr)
        print("    hint: run again with --debug for the traceback, and report it", file=sys.stderr)
        sys.exit(70)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
