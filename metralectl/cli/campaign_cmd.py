"""`bench campaign` (units over the admitted nodes) and `bench nodes` (who is admitted, and why not).

Progress on stderr; the final table (or, with --json, one JSON object per event) on stdout.
Exit codes: 0 every unit's record accepted and no gate failed; 1 a unit failed or did not run (or
nothing was admitted); 2 a gate said no; 130 interrupted (every node's running unit was cancelled).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import typer

from metralectl.cli.state import note, style
from metralectl.wording import count


def campaign(
    plan_file: Path = typer.Argument(None, metavar="[PLAN.yaml]", help="The campaign plan (docs/bench.md#campaigns)."),
    node: list[str] = typer.Option(None, "--node", "-n", metavar="ADDR", help="A node's peer address (repeatable)."),
    unit: list[str] = typer.Option(None, "--unit", "-u", metavar='"SUITE K=V ..."', help="A unit (repeatable)."),
    reference: str = typer.Option(None, "--reference", metavar="ADDR", help="The node that hosts every speed-class unit."),
    recipe: str = typer.Option(None, "--recipe", help="The recipe every node must be serving."),
    hardware_class: str = typer.Option(None, "--hardware-class", help="The class certified (default: the reference's)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Admission and the plan only; nothing runs."),
    keep_going: bool = typer.Option(False, "--keep-going", help="Go on after a unit fails its gate."),
    ignore_thermals: bool = typer.Option(False, "--dangerous-ignore-thermals", help="Never park a hot node (warn only)."),
    thermal_poll: float = typer.Option(60.0, "--thermal-poll", min=0.05, help="Seconds between readings of a parked node."),
    thermal_max_wait: float = typer.Option(1800.0, "--thermal-max-wait", min=0, help="Longest park before resuming with a warning."),
    local: bool = typer.Option(False, "--local", help="This box is a node too (its units run here, as a peer's would)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per event on stdout."),
    timeout: float = typer.Option(5.0, "--timeout", help="Seconds to wait for each node's answers."),
) -> None:
    """Run benchmark units over admitted peer nodes (and, with --local, this box): longest first, speed
    class on one reference node, hot nodes parked, every record verified before it counts."""
    from metralectl.seams import identity
    from metralectl import paths
    from metralectl.campaign import file as campaign_file
    from metralectl.campaign.runner import Campaign, CampaignOptions, exit_code
    from metralectl.campaign.plan import choose_reference, simulate

    spec = campaign_file.load(plan_file, list(unit or []), list(node or []), reference, recipe)
    if not spec.nodes and not local:
        from metralectl.errors import UsageError

        raise UsageError("which nodes? give --node ADDR (or `nodes:` in the plan), and/or --local",
                         "each must be paired (`metralectl peer pair ADDR`) and have granted this box bench")
    out = _Out(as_json)
    run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]
    directory = paths.metrale_home() / "campaigns" / run_id
    me = identity.load_or_create()
    fleet = _Fleet(me, out, hardware_class, spec.reference)
    try:
        fleet.ask(list(spec.nodes), timeout, local_workdir=directory / "local" if local and not dry_run else None,
                  local_probe=local)
        if not fleet.admitted:
            from metralectl.errors import MetralError

            raise MetralError("no node is admitted: nothing to run the campaign on",
                              "`metralectl bench nodes ADDR...` says why")
        ref_name, why = choose_reference(fleet.facts, spec.reference)
        units = list(spec.units)
        plan = simulate(units, fleet.facts, ref_name, why)
        out.event("plan", **plan.to_json(), units=[u.to_json() for u in units])
        if any(u.speed for u in units) and len(fleet.admitted) > 1:
            note(style(f"WARNING speed-class units BUNDLED on {ref_name} ({why})", "33", sys.stderr))
        if dry_run:
            out.final({"dry_run": True, "plan": plan.to_json(), "refused": fleet.refused})
            return
        options = CampaignOptions(keep_going=keep_going, ignore_thermals=ignore_thermals, thermal_poll_s=thermal_poll,
                                  thermal_max_wait_s=thermal_max_wait)
        run = Campaign(run_id, units, [h for h, _ in fleet.admitted], ref_name,
                       {h.name: fleet.lines.get(cls or "") for h, cls in fleet.admitted}, directory, options=options,
                       on_event=lambda kind, data: out.event(kind, **data))
        note(f"campaign {run_id}: {count(len(units), 'unit')} on {count(len(fleet.admitted), 'node')}; "
             f"record: {paths.display(directory)}")
        record = run.run()
    finally:
        fleet.close()
    out.final(record)
    code = exit_code(record)
    if code:
        raise typer.Exit(code)


class _Fleet:
    """Admission: which nodes take part, as handles, with what planning needs to know of them."""

    def __init__(self, me: Any, out: _Out, hardware_class: str | None, reference: str | None) -> None:
        self.me, self.out, self.hardware_class, self.reference = me, out, hardware_class, reference
        self.lines = _thermal_lines()
        self.admitted: list[tuple[Any, str | None]] = []
        self.facts: list[Any] = []
        self.refused: list[tuple[str, str | None]] = []
        self._local: Any = None

    def ask(self, addresses: list[str], timeout: float, *, local_workdir: Path | None, local_probe: bool) -> None:
        from metralectl.peers.ops import NodeAnswer, ask_nodes

        answers = ask_nodes(addresses, self.me, timeout=timeout) if addresses else []
        if local_probe:
            from metralectl import paths
            from metralectl.peers.listener import Node

            here = Node(paths.config_dir(), self.me, name="local").admission(None)
            blocking = [c.detail for c in here.reasons if c.id not in ("bench.enabled", "grant")]
            answers.append(NodeAnswer("local", not blocking, here.fingerprint, here,
                                      error="; ".join(blocking) if blocking else None))
        ok = [a for a in answers if a.admitted and a.admission is not None]
        classes = {a.address: a.admission.hardware_class for a in ok if a.admission is not None}
        certified = self.hardware_class or classes.get(self.reference or "") or next(iter(classes.values()), None)
        for a in answers:
            adm = a.admission
            why = None if a in ok else ("; ".join(a.reasons) or "refused")
            if why is None and adm is not None and adm.hardware_class != certified:
                why = f"hardware class {adm.hardware_class}; the campaign certifies {certified}"
            elif why is None and adm is not None and adm.hardware_class not in self.lines:
                why = f"hardware class {adm.hardware_class} declares no thermal park/resume lines: it cannot be campaigned"
            if why is not None or adm is None:
                self.refused.append((a.address, why))
                self.out.event("fleet", node=a.address, admitted=False, reason=why, hint=a.hint)
                continue
            handle = self._handle(a.address, local_workdir)
            temp = _temp(handle)
            self.admitted.append((handle, adm.hardware_class))
            from metralectl.campaign.plan import NodeFacts

            self.facts.append(NodeFacts(a.address, adm.facts.get("memory_available_gb"), temp))
            self.out.event("fleet", node=a.address, admitted=True, fingerprint=adm.fingerprint, gpu=adm.gpu,
                           hardware_class=adm.hardware_class, temp_c=temp,
                           free_memory_gb=adm.facts.get("memory_available_gb"))

    def _handle(self, address: str, local_workdir: Path | None) -> Any:
        # Any: a campaign.runner.NodeHandle, or (a dry run) a stand-in that answers only .name and .thermal()
        from metralectl.peers.store import known_keys

        if address != "local":
            from metralectl.peers.remote_units import NodeRef, RemoteNode

            return RemoteNode(self.me, NodeRef.lookup(address), known_keys(), name=address)
        from metralectl import paths
        from metralectl.peers.admission import probe_thermal
        from metralectl.peers.local_node import LocalNode

        if local_workdir is None:  # a dry run: only its thermal reading is asked for
            return type("Probe", (), {"name": "local", "thermal": staticmethod(probe_thermal)})()
        self._local = LocalNode(self.me, paths.config_dir(), paths.metrale_home(), local_workdir, known_keys())
        return self._local

    def close(self) -> None:
        if self._local is not None:
            self._local.close()


def _thermal_lines() -> dict[str, Any]:
    from metralectl.core.catalog import load_catalog
    from metralectl.telemetry.view import thermal_lines_from

    return thermal_lines_from(load_catalog().hardware)


def _temp(handle: Any) -> float | None:
    from metralectl.errors import MetralError

    try:
        value = handle.thermal().get("temp_c")
    except MetralError:
        return None
    return float(value) if isinstance(value, (int, float)) else None


class _Out:
    """Events: JSON lines on stdout with --json; otherwise a line each on stderr and a table at the end."""

    def __init__(self, as_json: bool) -> None:
        import threading

        self.as_json = as_json
        self._lock = threading.Lock()  # node workers emit from their threads: one whole line at a time

    def event(self, kind: str, **data: Any) -> None:
        if self.as_json:
            line = json.dumps({"event": kind, **data}, sort_keys=True, default=str) + "\n"
            with self._lock:
                sys.stdout.write(line)
                sys.stdout.flush()
            return
        from metralectl.safetext import clean

        text = clean(_describe(kind, data) or "", 600)  # peers' reasons and hints come from other machines
        if text:
            color = {"thermal": "33", "retired": "31", "halt": "31", "link-lost": "33", "busy": "33"}.get(kind, "2")
            with self._lock:
                note(style(text, color, sys.stderr))

    def final(self, record: dict[str, Any]) -> None:
        if self.as_json:
            print(json.dumps({"event": "final", **record}, sort_keys=True, default=str), flush=True)
            return
        if record.get("dry_run"):
            plan = record["plan"]
            for name, queue in plan["queues"].items():
                print(f"{name}: {', '.join(queue) or '(idle)'}  (finishes at ~{plan['finish_s'][name]:.0f} s)")
            print(f"makespan ~{plan['makespan_s']:.0f} s; reference {plan['reference']} ({plan['reference_why']})")
            for unit_id in plan["unassigned"]:
                print(f"unassigned: {unit_id} (no admitted node may run it)")
            return
        from metralectl.present.table import render_table
        from metralectl.safetext import clean

        rows = []
        for u in record["units"]:
            headline = u.get("headline") or {}
            first = next(iter(sorted(headline.items())), None)
            rows.append([u["unit"]["id"], u.get("node") or "-", u["state"], u.get("verdict") or "-",
                         f"{first[0]}={first[1]}" if first else clean(str(u.get("error") or "-"), 200)])
        print(render_table(["UNIT", "NODE", "STATE", "VERDICT", "HEADLINE / WHY"], rows))


def _describe(kind: str, d: dict[str, Any]) -> str | None:
    if kind == "fleet":
        if d["admitted"]:
            return f"▸ {d['node']}: admitted ({d.get('hardware_class')}, {d.get('gpu')}, signer {d.get('fingerprint')})"
        return f"▸ {d['node']}: refused: {d.get('reason')}" + (f"\n    → {d['hint']}" if d.get("hint") else "")
    if kind == "plan":
        return f"▸ plan: makespan ~{d['makespan_s']:.0f} s; speed class on {d['reference']} ({d['reference_why']})"
    if kind == "start":
        return f"▸ {d['node']}: {d['unit']} (expected {d['expected_s']:.0f} s) as {d['key']}"
    if kind == "line":
        event = d["event"]
        if event.get("kind") in ("stage", "stage-done", "warning", "waiting"):
            return f"  {d['node']} {d['unit']}: {event.get('message')}"
        return None
    if kind == "link-lost":
        return f"! {d['node']} {d['unit']}: event stream lost ({d['why']}); re-attaching (#{d['losses']})"
    if kind == "done":
        tail = f" ({d['error']})" if d.get("error") else (f", verdict {d['verdict']}" if d.get("verdict") else "")
        return f"✔ {d['node']}: {d['unit']} {d['state']} in {d['seconds']:.1f} s{tail}"
    if kind == "thermal":
        temp = f"{d['temp_c']:.0f} °C" if isinstance(d.get("temp_c"), (int, float)) else "?"
        return f"! thermal {d['node']}: {d['state']} ({temp}): {d.get('reason')}"
    if kind == "busy":
        return f"! {d['node']}: not taking {d['unit']} now ({d['why']}); asking again later (#{d['times']})"
    if kind == "retired":
        return f"✘ {d['node']} retired for this campaign: {d['reason']}"
    if kind == "halt":
        return f"✘ stopping new units: {d['reason']} (--keep-going goes on)"
    if kind == "cancel":
        return f"▸ cancel {d['key']} on {d['node']}: " + ("done" if d.get("ok") else f"FAILED: {d.get('error')}")
    if kind == "summary":
        return f"▸ summary: {d['states']}" + (f"; gates failed: {', '.join(d['failed_gates'])}" if d["failed_gates"] else "")
    return None


def register(bench_app: typer.Typer) -> None:
    from metralectl.cli.peer_cmds import nodes

    bench_app.command("campaign")(campaign)
    bench_app.command("nodes")(nodes)
