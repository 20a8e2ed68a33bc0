"""`metralectl gateway enable|disable`: whether the agent runs the gateway (agent/gateway_child.py)."""

from __future__ import annotations

import json

import typer

from metralectl.cli.state import note


def enable(listen: str = typer.Option(None, "--listen", metavar="HOST:PORT",
                                      help="Where the agent's gateway listens (default 127.0.0.1:8090)."),
           allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow a non-loopback address without "
                                             "API keys (anyone who reaches it may use every model)."),
           as_json: bool = typer.Option(False, "--json", help="Print the setting as JSON.")) -> None:
    """Have the agent run the gateway (started within 2 s by a running agent, and whenever the agent starts)."""
    from metralectl.agent.gateway_child import save_setting
    from metralectl.gateway.listen import DEFAULT_LISTEN, parse_listen
    from metralectl.core import gateway_keys as keys
    from metralectl.seams.agent_files import read_state

    if listen is not None:
        host, port = parse_listen(listen, allow_remote, bool(keys.load()))  # refused now, not in the agent's log
        if not ipaddress_is_loopback(host) and not keys.load() and allow_remote:
            note("warning: the gateway will serve other machines with no API key: anyone who reaches it may use "
                 "every model")
    path = save_setting(True, listen)
    if as_json:
        print(json.dumps({"enabled": True, "listen": listen or DEFAULT_LISTEN, "setting": str(path),
                          "agent_running": read_state() is not None}))
    where = listen or DEFAULT_LISTEN
    if read_state() is None:
        note(f"enabled in {path}; no agent runs: `metralectl agent start` starts it, and the gateway on {where}")
    else:
        note(f"enabled in {path}: the running agent starts the gateway on {where} within 2 s (`metralectl ps` shows it)")


def disable(as_json: bool = typer.Option(False, "--json", help="Print the setting as JSON.")) -> None:
    """Stop the agent's gateway (within 2 s) and keep it stopped."""
    from metralectl.agent.gateway_child import load_setting, save_setting

    listen = load_setting().get("listen")
    path = save_setting(False, listen if isinstance(listen, str) else None)
    if as_json:
        print(json.dumps({"enabled": False, "setting": str(path)}))
    note(f"disabled in {path}: a running agent stops its gateway within 2 s")


def ipaddress_is_loopback(host: str) -> bool:
    import ipaddress

    return ipaddress.ip_address(host).is_loopback


def register(app: typer.Typer) -> None:
    app.command("enable")(enable)
    app.command("disable")(disable)
