"""`metralectl bench campaign` over two agents on loopback (each a whole agent.service.Agent — capability
monitor, local API, peer listener, unit queue — in this process, so its machine facts can be injected; real
unit runs against real engine doubles), driven as an operator would: the CLI in a subprocess.

The thermal reading is the one fake (no GPU here): node b crosses the park line between units, hovers
between the lines (still parked: hysteresis) and cools below the resume line — the campaign parks it,
keeps node a working, and resumes it. Also: a node whose units keep failing is retired and its units
run elsewhere; Ctrl-C cancels every node's running unit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metralectl.seams import identity, signing
from metralectl.peers.store import known_keys
from tests.integration.peer_nodes import REPO, EngineDouble, PeerNode, Thermal, pair_and_grant
from tests.ports import own_port

pytestmark = pytest.mark.integration


class Fleet:
    def __init__(self, root: Path, thermal_b: Thermal, *, b_endpoint: str | None = None) -> None:
        self.here = Path(os.environ["METRALECTL_CONFIG_DIR"])
        self.me = identity.load_or_create(self.here)
        self.doubles = [EngineDouble(itl_ms=3.0), EngineDouble(itl_ms=3.0)]
        self.a = PeerNode(root, "a", endpoint=self.doubles[0].url)
        self.b = PeerNode(root, "b", endpoint=b_endpoint or self.doubles[1].url, thermal=thermal_b)
        for node in (self.a, self.b):
            pair_and_grant(self.here, self.me, "here", node)

    def cli(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "metralectl", "bench", "campaign", *args],
                              capture_output=True, text=True, cwd=REPO, timeout=timeout)

    def stop(self) -> None:
        for node in (self.a, self.b):
            node.stop()
        for d in self.doubles:
            d.stop()


def _events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.fixture()
def scripted() -> Thermal:
    """Node b: cool for planning and its first unit, then 85 °C (park), 75 °C twice (between the lines:
    still parked), then 65 °C (resume) and cool from then on."""
    readings = [50.0, 50.0, 85.0, 75.0, 75.0, 65.0]
    thermal = Thermal(50.0)

    def next_reading(t: Thermal) -> None:
        t.temp_c = readings[t.reads - 1] if t.reads - 1 < len(readings) else 45.0

    thermal.on_read = next_reading
    return thermal


@pytest.fixture()
def fleet(tmp_path: Path, scripted: Thermal) -> Iterator[Fleet]:
    f = Fleet(tmp_path, scripted)
    yield f
    f.stop()


# client_bound=warn: on a shared CI box the decode unit's client can fall behind its timing budget, which fails the
# run by default (a unit that failed, exit 1): these tests check scheduling, parking and signing, not timing accuracy
UNITS = ["decode repeats=3 max_tokens=16 warmup=1 client_bound=warn",
         "tool-call repeats=2", "tool-call repeats=2", "tool-call repeats=2", "tool-call repeats=2"]


def _why_not_ok(events: list[dict[str, Any]]) -> str:
    """What did not go well, first (the whole event stream is long and gets cut where CI prints it)."""
    final = next((e for e in events if e["event"] == "final"), {})
    bad = [(u["unit"]["id"], u["node"], u["state"], u.get("error"), u.get("reason")) for u in final.get("units") or []
           if u["state"] != "accepted"]
    said = [e for e in events if e["event"] in ("retired", "failed", "thermal")]
    return f"units not accepted: {bad}\nretired/failed/thermal: {said}\n"


def _unit_args(units: list[str]) -> list[str]:
    return [x for u in units for x in ("--unit", u)]


def test_campaign_parks_a_hot_node_and_resumes_it(fleet: Fleet) -> None:
    done = fleet.cli("--node", fleet.a.addr, "--node", fleet.b.addr, "--reference", fleet.a.addr,
                     "--thermal-poll", "0.3", "--json", *_unit_args(UNITS))
    events = _events(done.stdout)
    assert done.returncode == 0, _why_not_ok(events) + done.stderr + done.stdout
    kinds = [e["event"] for e in events]
    assert kinds.count("fleet") == 2 and all(e["admitted"] for e in events if e["event"] == "fleet")
    plan = next(e for e in events if e["event"] == "plan")
    assert plan["reference"] == fleet.a.addr and "decode" in plan["queues"][fleet.a.addr]

    thermal = [e for e in events if e["event"] == "thermal" and e["node"] == fleet.b.addr]
    assert [t["state"] for t in thermal] == ["parked", "resumed"], thermal
    assert thermal[0]["temp_c"] == 85.0 and thermal[1]["temp_c"] == 65.0
    parked_at, resumed_at = thermal[0]["at"], thermal[1]["at"]
    assert resumed_at - parked_at >= 0.3 * 3 * 0.9  # read at 85, 75, 75 (hysteresis), then 65
    starts = [e for e in events if e["event"] == "start"]
    assert not [s for s in starts if s["node"] == fleet.b.addr and parked_at < s["at"] < resumed_at]
    # node a kept working while b was parked: one of its units ran during the window (started before it ends,
    # finished after it began), unless a had finished all of its work before b was parked
    done_at = {(e["node"], e["key"]): e["at"] for e in events if e["event"] == "done"}
    on_a = [(s["at"], done_at.get((s["node"], s["key"]), float("inf"))) for s in starts if s["node"] == fleet.a.addr]
    assert any(start < resumed_at and end > parked_at for start, end in on_a) or \
        all(end <= parked_at for _, end in on_a), f"node a idled while b was parked: {on_a}, {parked_at}..{resumed_at}"
    decode_starts = [s for s in starts if s["unit"] == "decode"]
    assert [s["node"] for s in decode_starts] == [fleet.a.addr]  # the speed class stays on the reference

    final = events[-1]
    assert final["event"] == "final" and {u["state"] for u in final["units"]} == {"accepted"}
    assert {u["node"] for u in final["units"]} == {fleet.a.addr, fleet.b.addr}
    keys = known_keys(fleet.here)
    for u in final["units"]:
        assert u["key"].startswith("certify-") and u["unit"]["id"] in u["key"]
        verdict = signing.verify_file(Path(u["record_dir"]) / "run.json", keys, expect={"unit": u["key"]})
        signer = fleet.a.me.fingerprint if u["node"] == fleet.a.addr else fleet.b.me.fingerprint
        assert verdict.ok and verdict.signer == signer, verdict
    saved = json.loads((Path(final["units"][0]["record_dir"]).parents[1] / "campaign.json").read_text())
    assert [t["state"] for t in saved["thermal"]] == ["parked", "resumed"]


def test_a_node_failing_twice_is_retired_and_its_units_run_elsewhere(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{own_port()}"  # node b benchmarks an endpoint where nothing listens (held: ever)
    f = Fleet(tmp_path, Thermal(50.0), b_endpoint=dead)
    try:
        done = f.cli("--node", f.a.addr, "--node", f.b.addr, "--reference", f.a.addr, "--json",
                     *_unit_args(["tool-call repeats=2"] * 4))
    finally:
        f.stop()
    events = _events(done.stdout)
    retired = [e for e in events if e["event"] == "retired"]
    assert [r["node"] for r in retired] == [f.b.addr] and "2 times in a row" in retired[0]["reason"]
    failed_on_b = [e for e in events if e["event"] == "done" and e["node"] == f.b.addr]
    assert len(failed_on_b) == 2 and all(e["state"] == "pending" for e in failed_on_b)  # put back for node a
    final = events[-1]
    assert {u["state"] for u in final["units"]} == {"accepted"} and {u["node"] for u in final["units"]} == {f.a.addr}
    assert done.returncode == 0, done.stderr


def test_ctrl_c_cancels_every_nodes_job(fleet: Fleet) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "metralectl", "bench", "campaign", "--node", fleet.a.addr,
                             "--node", fleet.b.addr, "--reference", fleet.a.addr, "--json",
                             "--unit", "decode repeats=400 max_tokens=64", "--unit", "tool-call repeats=400"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not all(any(u.state == "running" for u in n.node.units.list_for(fleet.me.fingerprint))
                      for n in (fleet.a, fleet.b)):
            assert time.monotonic() < deadline and proc.poll() is None, "both nodes never ran a unit"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    for node in (fleet.a, fleet.b):
        units = node.node.units.list_for(fleet.me.fingerprint)
        assert units and all(u.state == "cancelled" for u in units), [(u.key, u.state) for u in units]
    cancels = [e for e in _events(out) if e["event"] == "cancel"]
    assert {c["node"] for c in cancels} == {fleet.a.addr, fleet.b.addr} and all(c["ok"] for c in cancels)


def test_dry_run_shows_the_plan_and_runs_nothing(fleet: Fleet) -> None:
    done = subprocess.run([sys.executable, "-m", "metralectl", "bench", "campaign", "--node", fleet.a.addr,
                           "--node", fleet.b.addr, "--dry-run", *_unit_args(UNITS)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "makespan" in done.stdout and "speed-class units BUNDLED" in done.stderr
    assert not fleet.a.node.units.list_for(fleet.me.fingerprint) and not fleet.b.node.units.list_for(fleet.me.fingerprint)


def test_this_box_is_a_node_too(tmp_path: Path) -> None:
    """`--local`: units run here exactly as on a peer (a `bench run` child signing with this box's key), and
    their records pass the same checks. (The CLI's own machine facts are real, and this machine has no GPU,
    so the handle is driven in-process with injected facts; the CLI's refusal is checked too.)"""
    from metralectl.seams import store
    from metralectl.campaign.runner import Campaign
    from metralectl.campaign.plan import PlannedUnit
    from metralectl.peers.admission import Facts, GpuFact
    from metralectl.peers.config import BenchConfig, save_bench_config
    from metralectl.peers.local_node import LocalNode
    from metralectl.peers.remote_units import NodeRef, RemoteNode
    from metralectl.telemetry.thermal import ThermalLines

    fleet = Fleet(tmp_path, Thermal(50.0))
    home = Path(os.environ["METRALE_HOME"])
    save_bench_config(BenchConfig(endpoint=fleet.doubles[1].url), fleet.here)  # not enabled: that is for peers
    facts = Facts(gpu=lambda: GpuFact("NVIDIA GB10", "gb10"), busy=lambda: None, memory=lambda: 10**11,
                  disk=lambda p: 10**12, thermal=Thermal(50.0))
    local = LocalNode(fleet.me, fleet.here, home, tmp_path / "campaign" / "local", known_keys(fleet.here), facts=facts)
    try:
        assert local.blocking() == []
        remote = RemoteNode(fleet.me, NodeRef.lookup(fleet.a.addr, fleet.here), known_keys(fleet.here))
        units = [PlannedUnit("decode", "decode", {"repeats": "3", "max_tokens": "16", "client_bound": "warn"}, expected_s=9, group="d")]
        units += [PlannedUnit(f"tool-{i}", "tool-call", {"repeats": "2"}, expected_s=5 - i, group=f"t{i}") for i in range(3)]
        lines = {"local": ThermalLines(80, 70), remote.name: ThermalLines(80, 70)}
        record = Campaign("loc", units, [local, remote], "local", lines, tmp_path / "campaign").run()
        assert {u["state"] for u in record["units"]} == {"accepted"}, [(u["unit"]["id"], u.get("reason"), u.get("error")) for u in record["units"]]
        decode = next(u for u in record["units"] if u["unit"]["id"] == "decode")
        assert decode["node"] == "local"
        verdict = signing.verify_file(Path(decode["record_dir"]) / "run.json", known_keys(fleet.here),
                                      expect={"unit": decode["key"]})
        assert verdict.ok and verdict.signer == fleet.me.fingerprint
        # a peer's unit queued or running on this box keeps local units off the GPU
        store.write_json(home / "units" / "peer-unit" / "unit.json",
                         {"spec": {"key": "peer-unit", "suite": "decode"}, "state": "running", "submitted": 1.0,
                          "requester": "X"})
        assert any("queued or running" in why for why in local.blocking())
    finally:
        local.close()
        fleet.stop()
    refused = subprocess.run([sys.executable, "-m", "metralectl", "bench", "campaign", "--local", "--unit", "decode"],
                             capture_output=True, text=True, cwd=REPO, timeout=60)
    assert refused.returncode == 1 and "local: refused" in refused.stderr and "no GPU it can name" in refused.stderr
