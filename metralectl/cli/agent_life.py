"""`metralectl agent start | stop | status | logs`: the agent as a background process (app/agent_start.py,
app/agent_control.py, app/agent_logs.py).

stdout carries the answer (the URL, the state, the log's lines; `--json` a document), stderr what
happened on the way. Exit codes: status 0 running, 1 not running, 69 running but not answering; start 0
(started, or already running), 75 when its port is held by another program, 69 when it did not answer
in time, 130 on Ctrl-C (the half-started agent is stopped again).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import typer

from metralectl.cli.state import note, style


def _since(started: float | None) -> str:
    if started is None:
        return "?"
    ago = max(0, int(time.time() - started))
    human = f"{ago} s" if ago < 120 else f"{ago // 60} min" if ago < 7200 else f"{ago // 3600} h {ago % 3600 // 60} min"
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))} ({human} ago)"


HOW = {"detached": "`metralectl agent start`", "systemd": "systemd (metralectl-agent.service)",
       "foreground": "a terminal (`metralectl agent`)", "embedded": "a program embedding it",
       "unknown": "an older metralectl (not recorded)"}


def _forwarded(port: int | None, peer_port: int | None, peer_bind: str | None, peers: bool | None,
               interval: float | None, no_regroup: bool) -> list[str]:
    out: list[str] = []
    if port is not None:
        out += ["--port", str(port)]
    if peer_port is not None:
        out += ["--peer-port", str(peer_port)]
    if peer_bind is not None:
        out += ["--peer-bind", peer_bind]
    if peers is not None:
        out.append("--peers" if peers else "--no-peer")
    if interval is not None:
        out += ["--interval", repr(interval)]
    if no_regroup:
        out.append("--no-regroup")
    return out


def start(
    port: int = typer.Option(None, "--port", min=0, max=65535, help="The local API and page (default 8897; 0: any free port)."),
    peer_port: int = typer.Option(None, "--peer-port", min=0, max=65535, help="The peer listener's port (default 8899)."),
    peer_bind: str = typer.Option(None, "--peer-bind", help="Where the peer listener listens (default 0.0.0.0)."),
    peers: bool = typer.Option(None, "--peers/--no-peer", help="Peer listener on/off (default: on once a peer is paired or bench is enabled)."),
    interval: float = typer.Option(None, "--interval", min=0.5, help="Seconds between capability re-checks."),
    no_regroup: bool = typer.Option(False, "--no-regroup", help="Do not re-exec through `sg docker`."),
    detach: bool = typer.Option(False, "--detach", help="Start it detached even where a systemd user unit exists."),
    timeout: float = typer.Option(30.0, "--timeout", min=1, help="Seconds to wait for it to answer."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: the agent, and whether it was already running."),
) -> None:
    """Start the agent in the background (through systemd's user unit when it is installed and answers)
    and wait until it answers; print its address. Already running: says so (pid, address), exit 0.

    \b
    Examples:
      metralectl agent start
      metralectl agent start --port 0 --peers
    """
    from metralectl.app import agent_start
    from metralectl.safetext import clean
    from metralectl.seams.process import sigterm_as_interrupt

    options = _forwarded(port, peer_port, peer_bind, peers, interval, no_regroup)
    with sigterm_as_interrupt():
        try:
            started = agent_start.start(options, systemd=not detach, timeout_s=timeout, note=note)
        except agent_start.StartFailed as failed:
            for line in failed.lines:
                note(f"  | {clean(line, 500)}")
            raise
    agent = started.agent
    if as_json:
        print(json.dumps({**agent.to_json(), "already_running": started.already}))
        return
    if started.already:
        note(f"already running: pid {agent.pid}, started by {HOW.get(agent.how, agent.how)}, since {_since(agent.started)}")
    else:
        note(f"agent started (pid {agent.pid}, {started.via}); the page with its token: `metralectl agent url`")
    print(agent.url)


def stop(
    timeout: float = typer.Option(75.0, "--timeout", min=1, help="Seconds to wait after SIGTERM before SIGKILL."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: what was stopped and how."),
) -> None:
    """Stop the agent (SIGTERM, then SIGKILL after --timeout; or `systemctl --user stop`) and check it is gone.
    Not running: says so, exit 0; a stale pidfile is removed (its pid, now another process, is left alone).

    \b
    Examples:
      metralectl agent stop
    """
    from metralectl.app import agent_control
    from metralectl.seams.process import sigterm_as_interrupt

    with sigterm_as_interrupt():
        stopped = agent_control.stop(timeout_s=timeout, note=note)
    if stopped.stale is not None:
        note(f"removed a stale pidfile: {stopped.stale.why} (left alone)")
    agent = stopped.agent
    if as_json:
        print(json.dumps({"stopped": agent.to_json() if agent else None, "how": stopped.how or None,
                          "seconds": round(stopped.seconds, 3),
                          "stale_pidfile": stopped.stale.to_json() if stopped.stale else None}))
        return
    if agent is None:
        print("not running")
        return
    print(f"stopped: pid {agent.pid} ({stopped.how}, {stopped.seconds:.1f} s)")


def status(as_json: bool = typer.Option(False, "--json", help="Print JSON (state: running, not-answering, not-running).")) -> None:
    """Whether the agent runs: pid, address, since when, how it was started, its log.
    Exit 0 running, 1 not running (a stale pidfile too), 69 running but not answering.

    \b
    Examples:
      metralectl agent status
      metralectl agent status --json
    """
    from metralectl.app import agent_control
    from metralectl.safetext import clean

    answer = agent_control.status()
    if as_json:
        print(json.dumps(answer.to_json()))
        raise typer.Exit(answer.exit_code)
    agent = answer.agent
    if answer.stale is not None:
        note(style(f"stale pidfile: {answer.stale.why}", "33", sys.stderr))
    if agent is None:
        print("not running")
        note("start it: metralectl agent start")
        raise typer.Exit(answer.exit_code)
    rows: list[tuple[str, Any]] = [
        ("state", "running" if answer.state == "running" else f"not answering: {clean(answer.why or '?', 300)}"),
        ("pid", agent.pid), ("url", agent.url or "-"), ("since", _since(agent.started)),
        ("started by", HOW.get(agent.how, agent.how)),
        ("peers", f"{agent.peer_host}:{agent.peer_port}" if agent.peer_port else "off (no peer paired, bench not enabled; `--peers` turns it on)"),
        ("log", agent.log or ("journalctl --user -u metralectl-agent" if agent.how == "systemd" else
                              "its terminal" if agent.how == "foreground" else "-")),
    ]
    for key, value in rows:
        print(f"{key:<11} {value}")
    if answer.state != "running":
        note("hint: metralectl agent logs; restart it: metralectl agent stop && metralectl agent start")
    raise typer.Exit(answer.exit_code)


def logs(
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines (Ctrl-C ends)."),
    tail: int = typer.Option(100, "--tail", "-n", min=0, help="Lines from the end to show first (0: all)."),
) -> None:
    """The agent's log (its file, or systemd's journal for the unit), escaped: control characters are shown,
    not obeyed.

    \b
    Examples:
      metralectl agent logs -n 20
      metralectl agent logs -f
    """
    from metralectl.app import agent_logs
    from metralectl.safetext import clean

    where = agent_logs.source()
    note(f"agent log: {where.describe()}")
    if where.path is None:
        lines = agent_logs.journal_lines(where, tail, follow)
    elif follow:
        lines = agent_logs.follow_file(where.path, tail)
    else:
        lines = iter(agent_logs.last_lines(where.path, tail))
    for line in lines:
        print(clean(line), flush=follow)


def register(app: typer.Typer) -> None:
    for name, fn in (("start", start), ("stop", stop), ("status", status), ("logs", logs)):
        app.command(name)(fn)

