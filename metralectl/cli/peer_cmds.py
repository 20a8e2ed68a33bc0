"""`peer pair|list|revoke|grant-bench|bench-config` and `nodes ADDR…` (bench admission of other nodes).

`nodes` is the `bench nodes` of SPEC §6, top-level until the bench sub-app takes it over.

Whatever another machine said (its self-declared name and version, a hello's name, an admission answer,
a unit's fields) goes through `shown()` (safetext.clean, capped) before it reaches the terminal: its
control characters would otherwise let it print a fake fingerprint line, clear the screen or hide text.
The fingerprint, which we computed from the key, is printed first.
"""

from __future__ import annotations

import json
import socket
import sys
from typing import TYPE_CHECKING, Any

import typer

from metralectl.cli.state import note, style
from metralectl.errors import ExitCode
from metralectl.safetext import NAME_LIMIT, clean

if TYPE_CHECKING:
    from metralectl.seams.identity import Identity

peer_app = typer.Typer(help="Other metralectl nodes this box trusts by key (pairing, grants).",
                       no_args_is_help=True, add_completion=False, rich_markup_mode=None)


def shown(text: object, limit: int = NAME_LIMIT) -> str:
    """Text another machine chose, safe to print: control characters escaped, at most `limit` characters."""
    return clean("" if text is None else str(text), limit)


def _me() -> Identity:
    from metralectl.seams import identity
    return identity.load_or_create()


@peer_app.command("pair")
def pair(
    address: str = typer.Argument(..., metavar="ADDR", help="ip[:port], [v6]:port, host.local or dns.name (port: 8899)."),
    expect: str = typer.Option(None, "--expect", metavar="FINGERPRINT", help="Pair only if the node shows this fingerprint."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Trust the key shown without asking (trust on first use)."),
    peer_port: int = typer.Option(8899, "--peer-port", help="This box's peer port, announced in the hello."),
    timeout: float = typer.Option(5.0, "--timeout", help="Seconds to wait for the node."),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
) -> None:
    """Trust a node's key on first use (after seeing its fingerprint); a changed key is refused loudly."""
    from metralectl.errors import MetralError
    from metralectl.seams.identity import parse_fingerprint
    from metralectl.peers.ops import pair as do_pair

    wanted = parse_fingerprint(expect) if expect else None

    def confirm(remote: Any, where: str) -> bool:
        note(f"fingerprint: {remote.fingerprint}")  # first: computed from the proven key, not said by the node
        note(f"  at {where}, which calls itself {shown(remote.name) or '?'} (metralectl {shown(remote.version, 32) or '?'})")
        if wanted is not None:
            if remote.fingerprint != wanted:
                raise MetralError(f"{where} shows {remote.fingerprint}, not the expected {wanted}: not paired",
                                  "check the fingerprint with `metralectl id` on that machine")
            return True
        if yes:
            return True
        if not sys.stdin.isatty():
            raise MetralError("not paired: confirm the fingerprint interactively, or pass --expect FINGERPRINT",
                              "run `metralectl id` on that machine and compare")
        note("  compare it with `metralectl id` on that machine.")
        return bool(typer.confirm("Trust this key?", default=False, err=True))

    result = do_pair(address, _me(), confirm=confirm, name=socket.gethostname(), peer_port=peer_port, timeout=timeout)
    if as_json:
        print(json.dumps(result.__dict__, indent=2))
        return
    print(f"{result.outcome}: {result.address} {result.fingerprint} ({shown(result.name) or '?'})")
    note(f"hello: {shown(result.hello, 300)}")
    note(f"next, on {result.address}: `metralectl peer grant-bench {_me().fingerprint}` lets this box run benchmarks there")


@peer_app.command("list")
def list_(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Known peers (and hellos waiting for a grant)."""
    from metralectl.peers.store import PeerStore

    book = PeerStore().load()
    if as_json:
        print(json.dumps({"peers": [p.to_json() for p in book.peers],
                          "pending": [p.__dict__ for p in book.pending]}, indent=2))
        return
    from metralectl.present.table import render_table

    if book.peers:
        print(render_table(["FINGERPRINT", "NAME", "ADDRESS", "GRANTS", "FIRST SEEN", "VIA"],
                           [[p.fingerprint, shown(p.name) or "-", shown(p.address) or "-", ",".join(p.grants) or "-",
                             shown(p.first_seen, 32), shown(p.via, 16)] for p in book.peers]))
    else:
        note("no known peers (`metralectl peer pair ADDR`)")
    for p in book.pending:
        note(f"pending hello: {p.fingerprint}, which calls itself {shown(p.name) or '?'} (from {shown(p.from_addr)}, "
             f"{shown(p.seen, 32)}); `metralectl peer grant-bench {p.fingerprint}` trusts it")


@peer_app.command("revoke")
def revoke(fingerprint: str = typer.Argument(..., metavar="FINGERPRINT"),
           as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Forget a peer: its requests and its signed records are no longer accepted."""
    from metralectl.seams.identity import parse_fingerprint
    from metralectl.peers.store import PeerStore

    peer = PeerStore().revoke(parse_fingerprint(fingerprint))
    if as_json:
        print(json.dumps({"revoked": peer.fingerprint, "name": peer.name, "address": peer.address}))
        return
    print(f"revoked {peer.fingerprint} ({shown(peer.name) or '?'} at {shown(peer.address) or '?'})")


@peer_app.command("grant-bench")
def grant_bench(fingerprint: str = typer.Argument(..., metavar="FINGERPRINT", help="The peer's fingerprint (its `metralectl id`)."),
                as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Let that peer run benchmarks on this box (bench.yaml must have bench enabled)."""
    from metralectl.seams.identity import parse_fingerprint
    from metralectl.peers.config import load_bench_config
    from metralectl.peers.store import PeerStore

    peer, how = PeerStore().grant(parse_fingerprint(fingerprint), "bench")
    enabled = load_bench_config().enabled
    if as_json:
        print(json.dumps({"fingerprint": peer.fingerprint, "name": peer.name, "granted": "bench", "result": how,
                          "bench_enabled": enabled}))  # fmt: skip
    else:
        print(f"{how}: {peer.fingerprint} ({shown(peer.name) or '?'})")
    if not enabled:
        note(style("note: bench is not enabled on this node: `metralectl peer bench-config --enable`", "33", sys.stderr))


@peer_app.command("bench-config")
def bench_config(
    enable: bool = typer.Option(None, "--enable/--disable", help="Take benchmark units from granted peers."),
    hardware_class: str = typer.Option(None, "--hardware-class", help="What this node benchmarks as (default: detected)."),
    memory_floor: float = typer.Option(None, "--memory-floor", min=0, help="GB of available memory below which units are refused."),
    disk_floor: float = typer.Option(None, "--disk-floor", min=0, help="GB of free disk below which units are refused."),
    disk_path: str = typer.Option(None, "--disk-path", help="Where free disk is measured (default: the HF cache)."),
    endpoint: str = typer.Option(None, "--endpoint", help="What units benchmark (default: what metralectl serves here; '' resets)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (the same keys as bench.yaml)."),
) -> None:
    """Show this node's bench.yaml; with options, change it."""
    from dataclasses import replace
    from pathlib import Path

    import yaml

    from metralectl import paths
    from metralectl.peers.config import bench_path, load_bench_config, save_bench_config

    config = load_bench_config()
    changes: dict[str, Any] = {}
    if enable is not None:
        changes["enabled"] = enable
    if hardware_class is not None:
        changes["hardware_class"] = hardware_class or None
    if memory_floor is not None:
        changes["memory_floor_gb"] = memory_floor
    if disk_floor is not None:
        changes["disk_floor_gb"] = disk_floor
    if disk_path is not None:
        changes["disk_path"] = Path(disk_path).expanduser() if disk_path else None
    if endpoint is not None:
        if endpoint and not endpoint.startswith(("http://", "https://")):
            from metralectl.errors import UsageError

            raise UsageError(f"--endpoint {endpoint!r}: expected an http(s):// URL", "e.g. --endpoint http://127.0.0.1:8888")
        changes["endpoint"] = endpoint.rstrip("/") or None
    if changes:
        config = replace(config, **changes, exists=True)
        note(f"wrote {paths.display(save_bench_config(config))}")
    elif not config.exists:
        note(f"no {paths.display(bench_path())} yet: these are the defaults")
    if as_json:
        print(json.dumps(config.to_yaml_dict(), indent=2, default=str))
        return
    print(yaml.safe_dump(config.to_yaml_dict(), sort_keys=False), end="")


@peer_app.command("units")
def units(limit: int = typer.Option(20, "--limit", min=1, help="Most recent N."),
          cancel: str = typer.Option(None, "--cancel", metavar="KEY",
                                     help="Stop this unit (queued or running) through the agent."),
          as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Benchmark units peers ran (or are running) on this box, newest first."""
    import time

    from metralectl import paths
    from metralectl.peers.units import read_units

    if cancel is not None:
        _cancel_unit(cancel, as_json)
        return
    found = read_units(paths.metrale_home())[:limit]
    if as_json:
        print(json.dumps(found, indent=2))
        return
    if not found:
        note("no peer has run a benchmark unit here")
        return
    from metralectl.present.table import render_table

    rows = [[shown(u["key"], 128), shown(u["spec"].get("suite", "?")), shown(str(u.get("requester", "?"))[:9]),
             shown(u.get("state", "?"), 16), shown(u.get("verdict") or "-", 32),
             time.strftime("%Y-%m-%d %H:%M", time.localtime(float(u.get("submitted") or 0))),
             shown(u.get("run_id") or "-", 128)] for u in found]
    print(render_table(["KEY", "SUITE", "FROM", "STATE", "VERDICT", "SUBMITTED", "RUN"], rows))
    live = [u["key"] for u in found if u.get("state") in ("queued", "running")]
    if live:
        note(f"stop one (it holds this box's lifecycle lock while it runs): metralectl peer units --cancel {live[0]}")


def _cancel_unit(key: str, as_json: bool) -> None:
    """Units run inside the agent (it owns the queue): the cancel goes to it, never to files on disk."""
    from metralectl import paths
    from metralectl.app.agent_client import running_agent
    from metralectl.errors import MetralError, NotFound
    from metralectl.peers.units import read_units

    agent = running_agent()
    if agent is None:
        known = {u["key"]: u for u in read_units(paths.metrale_home())}
        if key not in known:
            raise NotFound(f"no unit {key} on this box", "`metralectl peer units` lists them")
        raise MetralError(f"unit {key} is {known[key].get('state')}, and no agent runs here to stop anything",
                          "units only run inside the agent: with it stopped, nothing runs")
    unit = agent.cancel_unit(key)
    if as_json:
        print(json.dumps(unit, indent=2))
        return
    state = unit.get("state")
    if state in ("completed", "failed", "cancelled") and not unit.get("cancel_requested"):
        note(f"unit {key} had already ended ({state})")
    elif state == "cancelled":
        note(f"unit {key} cancelled")
    else:
        note(f"unit {key}: stopping (its benchmark is interrupted and writes its record as interrupted)")


def nodes(
    addresses: list[str] = typer.Argument(None, metavar="[ADDR]...", help="ip[:port], [v6]:port, host.local, dns.name; none: this box."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    timeout: float = typer.Option(5.0, "--timeout", help="Seconds to wait for each node."),
) -> None:
    """For each node: admitted for benchmarks, or refused and why (exit 1 if any is refused)."""
    from metralectl.peers.ops import NodeAnswer, ask_nodes

    if addresses:
        answers = ask_nodes(addresses, _me(), timeout=timeout)
    else:
        from metralectl import paths
        from metralectl.peers.listener import Node

        admission = Node(paths.config_dir(), _me()).admission(None)
        answers = [NodeAnswer("this box", admission.admitted, admission.fingerprint, admission)]
    if as_json:
        print(json.dumps([a.to_json() for a in answers], indent=2))
    else:
        for a in answers:
            _render(a)
    if not all(a.admitted for a in answers):
        raise typer.Exit(ExitCode.FAILED)


def _render(answer: Any) -> None:
    """One node's answer; everything but the address we typed and the fingerprint we paired is the node's text."""
    out = sys.stdout
    adm = answer.admission
    if answer.admitted and adm is not None:
        print(f"{answer.address}  {style('admitted', '32', out)}  {shown(adm.hardware_class)}  {shown(adm.gpu)}  "
              f"signer {shown(adm.fingerprint)}")
        return
    print(f"{answer.address}  {style('refused', '31', out)}" + (f"  signer {answer.fingerprint}" if answer.fingerprint else ""))
    if answer.error:
        print(f"    {shown(answer.error, 500)}")
        if answer.hint:
            print(f"      → {shown(answer.hint, 500)}")
        return
    for check in adm.reasons if adm else []:
        print(f"    {shown(check.id, 32)}: {shown(check.detail, 300)}")
        if check.remedy:
            print(f"      → {shown(check.remedy, 300)}")


def register(app: typer.Typer) -> None:
    app.add_typer(peer_app, name="peer")
    app.command("nodes")(nodes)
