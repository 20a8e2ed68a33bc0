#!/usr/bin/env python3
"""On a machine with an NVIDIA GPU (the lent H200; no Docker there): two peer nodes on loopback with the
REAL machine facts (NVML GPU name and class, temperature, clock reasons, memory, disk), each benchmarking
an engine double, driven by a campaign whose thermal lines sit just above the idle temperature, while a
torch matmul heats the GPU after the first unit. Shows, on a real sensor: the admission answer, the
thermal reading over the peer protocol against NVML's own, a park and a resume, and energy per token in
the fetched (verified) records. Writes $OUT/device_campaign.json.

    python3 benchmarks/device_campaign.py          (needs pynvml, torch, cryptography, platformdirs)

Exits 1, saying why, when what it shows did not happen: a unit not accepted or without its verified record,
or the heater (the load the thermal lines are meant to see) not running to its end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
root = Path(tempfile.mkdtemp(prefix="devcamp-"))
os.environ.update({"METRALECTL_CONFIG_DIR": str(root / "here"), "METRALE_HOME": str(root / "here-home"),
                   "METRALECTL_CACHE_DIR": str(root / "cache"), "HF_HOME": str(root / "hf"), "NO_COLOR": "1",
                   "METRALECTL_LOCK_DIR": str(root)})

from metralectl.seams import identity  # noqa: E402
from metralectl.campaign.runner import Campaign, CampaignOptions  # noqa: E402
from metralectl.campaign.plan import PlannedUnit  # noqa: E402
from metralectl.peers import ops  # noqa: E402
from metralectl.peers.admission import Facts, probe_thermal  # noqa: E402
from metralectl.peers.config import BenchConfig, save_bench_config  # noqa: E402
from metralectl.peers.listener import Node, PeerServer  # noqa: E402
from metralectl.peers.remote_units import NodeRef, RemoteNode  # noqa: E402
from metralectl.peers.store import PeerStore, known_keys  # noqa: E402
from metralectl.telemetry.thermal import ThermalLines  # noqa: E402
from tests.integration.peer_nodes import EngineDouble  # noqa: E402

HEATER = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + float(__import__("sys").argv[1])
while time.time() < end:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
"""


def not_run(record: dict, heater: list[subprocess.Popen]) -> list[str]:
    """Why this run shows nothing (empty: every unit ran and was verified, the heater heated)."""
    why = [f"unit {u['unit']['id']} on {u['node']}: {u['state']}" + (f" ({u.get('error')})" if u.get("error") else "")
           for u in record["units"] if u["state"] != "accepted"]
    why += [f"unit {u['unit']['id']}: no fetched record" for u in record["units"]
            if u["state"] == "accepted" and not u.get("record_dir")]
    if not heater:
        why.append("the heater never started (no unit finished)")
    elif heater[0].returncode != 0:
        why.append(f"the heater (a torch matmul on cuda) exited {heater[0].returncode}: the GPU was never loaded")
    return why


def main() -> int:
    out = Path(os.environ.get("OUT", "/tmp/devcamp-out"))
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {}
    here = Path(os.environ["METRALECTL_CONFIG_DIR"])
    me = identity.load_or_create(here)
    doubles = [EngineDouble(itl_ms=5.0), EngineDouble(itl_ms=5.0)]
    nodes = []
    for k, d in enumerate(doubles):
        base = root / f"n{k}"
        node_id = identity.load_or_create(base)
        node = Node(base, node_id, Facts(), name=f"n{k}", home=root / f"n{k}-home")  # every fact real
        server = PeerServer(node, "127.0.0.1", 0)
        server.start(f"peer-n{k}")
        save_bench_config(BenchConfig(enabled=True, endpoint=d.url, memory_floor_gb=1, disk_floor_gb=1), base)
        addr = f"127.0.0.1:{server.port}"
        ops.pair(addr, me, base=here, confirm=lambda r, w: True, name="here")
        PeerStore(base).grant(me.fingerprint)
        nodes.append((addr, node, server))
    answers = ops.ask_nodes([a for a, _, _ in nodes], me)
    report["admission"] = [a.to_json() for a in answers]
    print("admission:", [(a.address, a.admitted, a.admission.gpu if a.admission else None,
                          a.admission.hardware_class if a.admission else None, a.reasons) for a in answers], flush=True)

    handles = [RemoteNode(me, NodeRef.lookup(a, here), known_keys(here), name=a) for a, _, _ in nodes]
    t0 = time.perf_counter()
    over_protocol = handles[0].thermal()
    direct = probe_thermal()
    report["thermal_reading"] = {"over_peer_protocol": over_protocol, "nvml_direct": direct,
                                 "round_trip_s": round(time.perf_counter() - t0, 3)}
    print("thermal over protocol:", over_protocol, "direct:", direct, flush=True)
    idle = float(direct["temp_c"]) if direct.get("temp_c") is not None else 40.0  # no GPU: never parked
    lines = ThermalLines(park_c=idle + 6, resume_c=idle + 3)  # just above idle, so a matmul crosses them
    report["lines"] = {"park_c": lines.park_c, "resume_c": lines.resume_c, "idle_c": idle}

    heater: list[subprocess.Popen] = []
    samples: list[tuple[float, float | None]] = []

    def on_event(kind: str, data: dict) -> None:
        if kind in ("thermal", "start", "done", "retired", "summary"):
            print(kind, {k: v for k, v in data.items() if k not in ("headline", "event")}, flush=True)
        if kind == "done" and not heater:  # the first unit is done: heat the GPU for 30 s
            heater.append(subprocess.Popen([sys.executable, "-c", HEATER, "30"]))
        if kind == "thermal":
            samples.append((time.time(), data.get("temp_c")))

    units = [PlannedUnit("decode", "decode", {"repeats": "30", "max_tokens": "64"}, expected_s=30, group="decode")]
    units += [PlannedUnit(f"tool-{i}", "tool-call", {"repeats": "25"}, expected_s=20 - i, group=f"tool-{i}")
              for i in range(12)]
    campaign = Campaign("dev", units, handles, handles[0].name, {h.name: lines for h in handles},
                        root / "campaign", options=CampaignOptions(thermal_poll_s=1.0, thermal_max_wait_s=150),
                        on_event=on_event)
    started = time.time()
    record = campaign.run()
    for h in heater:
        try:
            h.wait(60)
        except subprocess.TimeoutExpired:
            h.kill()
            h.wait()
    report["campaign_s"] = round(time.time() - started, 1)
    report["thermal_events"] = record["thermal"]
    report["units"] = []
    for u in record["units"]:
        entry = {"id": u["unit"]["id"], "node": u["node"], "state": u["state"], "verdict": u["verdict"]}
        if u.get("record_dir"):
            rec = json.loads((Path(u["record_dir"]) / "run.json").read_text())
            entry["energy"] = [s.get("energy") for s in rec.get("stages", [])]
            entry["telemetry"] = rec.get("telemetry")
        report["units"].append(entry)
    for u in report["units"]:
        e = (u.get("energy") or [{}])[0] or {}
        print(u["id"], u["node"], u["state"], u["verdict"], "J/token", e.get("j_per_output_token"), "avg W",
              e.get("average_w"), flush=True)
    report["not_run"] = not_run(record, heater)
    (out / "device_campaign.json").write_text(json.dumps(report, indent=2, default=str))
    for _, _, server in nodes:
        server.stop()
    for d in doubles:
        d.stop()
    for why in report["not_run"]:
        print(f"NOT MEASURED: {why}", file=sys.stderr)
    return 1 if report["not_run"] else 0


if __name__ == "__main__":
    sys.exit(main())
