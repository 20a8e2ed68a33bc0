"""`id`, `verify RECORD`, `agent` (+ `agent url`): this box's identity, signed records, the background agent.

`verify` is cli/verify_cmd.py's, the same command as `bench verify`; `agent start | stop | status | logs`
are cli/agent_life.py's.

cryptography, httpx and the agent's modules are imported inside the commands (`--help` stays light).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer

from metralectl.cli.state import note, style
from metralectl.errors import ExitCode

agent_app = typer.Typer(help="The background agent: local API + control-plane page + peer listener. "
                             "`agent start` runs it in the background; plain `agent` in this terminal.",
                        invoke_without_command=True, no_args_is_help=False, add_completion=False,
                        rich_markup_mode=None)


def id_(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    fix_permissions: bool = typer.Option(False, "--fix-permissions", help="chmod the private key to 0600 (and its dir to 0700)."),
) -> None:
    """This box's identity: its Ed25519 fingerprint (created on first use)."""
    from metralectl.seams import identity
    from metralectl import paths
    if fix_permissions and os.path.lexists(identity.key_path()):
        changed = identity.repair_permissions()
        note(f"repaired: {changed}" if changed else "permissions were already right")
    existed = identity.key_path().exists()
    ident = identity.load_or_create()
    if not existed:
        note(f"created a new identity in {paths.display(ident.path.parent)} (private key mode 0600)")
    if as_json:
        print(json.dumps(ident.to_json(), indent=2))
        return
    print(ident.fingerprint)
    note(f"key: {paths.display(ident.path)}  (ed25519; peers compare this fingerprint when pairing)")


@agent_app.callback()
def agent(
    ctx: typer.Context,
    port: int = typer.Option(8897, "--port", min=0, max=65535, help="The local API and page (loopback only; 0: any free port)."),
    peer_port: int = typer.Option(8899, "--peer-port", min=0, max=65535, help="The peer listener's port."),
    peer_bind: str = typer.Option("0.0.0.0", "--peer-bind", help="Where the peer listener listens (:: for IPv6 too)."),
    peers: bool = typer.Option(None, "--peers/--no-peer", help="Peer listener on/off (default: on once a peer is paired or "
                               "`peer bench-config --enable` is set, also while the agent runs)."),
    interval: float = typer.Option(3.0, "--interval", min=0.5, help="Seconds between capability re-checks."),
    no_regroup: bool = typer.Option(False, "--no-regroup", help="Do not re-exec through `sg docker` to pick up a new docker group."),
) -> None:
    """Run the agent in the foreground (the installer's service unit runs this); Ctrl-C stops it.
    A second agent for the same configuration is refused, naming the first (exit 75)."""
    if ctx.invoked_subcommand is not None:
        import click

        given = [f"--{name.replace('_', '-')}" for name in ctx.params
                 if ctx.get_parameter_source(name) not in (click.core.ParameterSource.DEFAULT, None)]
        if given:  # `agent --port 0 start` would start on the default port: say where options go
            from metralectl.errors import UsageError

            raise UsageError(f"{', '.join(given)} before `{ctx.invoked_subcommand}` belongs to `metralectl agent` "
                             "itself", f"put it after the command: metralectl agent {ctx.invoked_subcommand} "
                             f"{' '.join(given)} …")
        return
    from metralectl.agent.service import Agent, AgentOptions, configure_logging, run_agent

    configure_logging(sys.stderr)

    def ready(agent: Agent) -> None:
        api = agent.api
        peer = agent.peer_server
        note(f"metralectl agent {agent.identity.fingerprint}")
        note(f"  page + local API: http://127.0.0.1:{api.port}/  (`metralectl agent url` adds the token)")
        if peer:
            note(f"  peer listener:    {peer_bind}:{peer.port}")
        elif peers is False:
            note("  peer listener:    off (--no-peer)")
        else:
            note("  peer listener:    off until a peer is paired or bench is enabled (`--peers`: on now)")

    run_agent(AgentOptions(api_port=port, peer_port=peer_port, peer_host=peer_bind, peer=peers,
                           interval_s=interval, regroup=not no_regroup), on_ready=ready)


@agent_app.command("url")
def url(port: int = typer.Option(None, "--port", help="The agent's port (default: the running agent's, else 8897)."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON: the address and whether an agent is recorded.")) -> None:
    """Print the control-plane page's address with the API token (open it in a browser on this machine)."""
    from metralectl.agent.service import page_url, read_state

    recorded = read_state() is not None
    if not recorded:
        note(style("note: no running agent recorded; start one with `metralectl agent start`", "33", sys.stderr))
    address = page_url(port=port)
    if as_json:
        print(json.dumps({"url": address, "agent_recorded": recorded}))
        return
    print(address)


def register(app: typer.Typer) -> None:
    app.command("id")(id_)
    from metralectl.cli.verify_cmd import verify

    app.command("verify")(verify)
    from metralectl.cli import agent_life

    agent_life.register(agent_app)
    app.add_typer(agent_app, name="agent")
