"""`doctor --peer` (the fabric preflight for EP=2) between two network namespaces joined by veth pairs.

fabric_net.py builds them: a routed path through a "switch" (the default route, on which the peer's paired
address lies) and a direct cable's /30 on the GB10 class's RoCE port name, MTUs settable per end. The peer's own
agent (`metralectl agent --peers`) runs inside its namespace; doctor runs inside the head's. Everything is real: the route lookup, sysfs,
the signed peer requests, the probe's bytes over the veth. No Docker is involved.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration import fabric_net as fn

pytestmark = pytest.mark.skipif(fn.usable() is not None, reason=str(fn.usable()))


@pytest.fixture()
def fabric(tmp_path: Path) -> Iterator[Callable[..., fn.FabricNet]]:
    fn.clean_leftovers()
    made: list[fn.FabricNet] = []

    def make(**kw: Any) -> fn.FabricNet:
        net = fn.FabricNet(tmp_path / f"net{len(made)}", **kw)
        made.append(net)
        return net
    try:
        yield make
    finally:  # even when the test failed: the listener and both namespaces (with their interfaces) go
        for net in made:
            net.close()


def _checks(out: Any) -> dict[str, dict[str, Any]]:
    doc = json.loads(out.stdout)
    return {c["id"]: c for c in doc["checks"]}


def test_direct_cable_is_preferred_over_the_default_route_and_the_probe_runs_over_it(fabric) -> None:
    net = fabric()
    net.start_peer()
    out = net.doctor("--peer", "spark2", "--json")
    assert out.returncode == 0, out.stderr + out.stdout
    checks = _checks(out)
    assert [c for c in checks if c.startswith("fabric.")] == [
        "fabric.peer", "fabric.route", "fabric.mtu", "fabric.speed", "fabric.rdma", "fabric.nccl", "fabric.throughput"]
    assert set(checks) == {c for c in checks if c.startswith("fabric.")}  # --peer alone: the fabric checks only
    assert checks["fabric.peer"]["status"] == "ok"
    route = checks["fabric.route"]
    assert route["status"] == "warn"
    assert "reached through mgmt0 (the default route via 192.168.77.2)" in route["detail"]
    assert f"{fn.CABLE} has the /30 of a direct cable" in route["detail"]
    assert f"NCCL_SOCKET_IFNAME={fn.CABLE}" in route["remedy"] and fn.PEER_CABLE in route["remedy"]
    assert route["data"]["interface"] == fn.CABLE and route["data"]["route_iface"] == "mgmt0"
    assert route["data"]["local_addr"] == f"{fn.HEAD_CABLE}/30" and route["data"]["peer_addr"] == fn.PEER_CABLE
    # 1500 on both ends: equal, but not the jumbo frames the gb10 class expects
    assert checks["fabric.mtu"]["status"] == "warn" and "1500 on both ends" in checks["fabric.mtu"]["detail"]
    assert "RoCE's path MTU is then 1024" in checks["fabric.mtu"]["detail"]
    # a veth's speed is nominal: unknown, not 10000
    speed = checks["fabric.speed"]
    assert speed["status"] == "skipped" and "unknown (a virtual interface" in speed["detail"]
    assert speed["data"]["speed_mbps"] is None
    assert "none: NCCL will fall back to sockets" in checks["fabric.rdma"]["detail"]
    nccl = checks["fabric.nccl"]
    assert nccl["status"] == "ok", nccl
    assert f"NCCL_SOCKET_IFNAME={fn.CABLE} (master address {fn.HEAD_CABLE})" in nccl["detail"]
    assert nccl["data"]["nccl_default"] == "mgmt0"  # left to itself NCCL would take the management link
    probe = checks["fabric.throughput"]
    assert probe["status"] == "ok", probe
    assert probe["data"]["address"] == f"{fn.PEER_CABLE}:{fn.PORT}"
    assert all(p["bytes"] > 0 and p["mbps"] > 0 and p["error"] is None for p in probe["data"]["probes"])
    text = net.doctor("--peer", fn.PAIRED)  # by address; the text report
    assert text.returncode == 0 and "[warn] Interface that reaches the peer:" in text.stdout


def test_mtu_mismatch_is_a_problem_with_the_fix_for_the_lower_end(fabric) -> None:
    net = fabric(head_mtu=9000, peer_mtu=1500)
    net.start_peer()
    out = net.doctor("--peer", "spark2", "--json")
    assert out.returncode == 1, out.stderr
    mtu = _checks(out)["fabric.mtu"]
    assert mtu["status"] == "problem"
    assert f"{fn.CABLE} here 9000, {fn.CABLE} on spark2 1500" in mtu["detail"]
    assert f"on spark2 `sudo ip link set {fn.CABLE} mtu 9000`" in mtu["remedy"]
    assert "here `sudo" not in mtu["remedy"]


def test_peer_agent_down_judges_this_end_and_says_what_is_missing(fabric) -> None:
    net = fabric()  # no listener in the peer's namespace
    out = net.doctor("--peer", "spark2", "--json")
    checks = _checks(out)
    assert checks["fabric.peer"]["status"] == "warn" and "did not answer" in checks["fabric.peer"]["detail"]
    # without the peer's addresses, only the paired (routed) address is known: no direct link to it
    assert checks["fabric.route"]["status"] == "problem"
    assert "reached only through mgmt0 (the default route via 192.168.77.2)" in checks["fabric.route"]["detail"]
    assert checks["fabric.throughput"]["status"] == "skipped"
    assert out.returncode == 1


def test_an_unpaired_host_is_a_usage_error(fabric) -> None:
    net = fabric()
    out = net.doctor("--peer", "nobody")
    assert out.returncode == 64 and "is not a paired peer" in out.stderr


@pytest.mark.skipif(fn.shutil.which("iptables") is None, reason="iptables is not installed")
def test_a_probe_that_cannot_cross_the_cable_is_reported_within_the_deadline(fabric) -> None:
    net = fabric()
    net.start_peer()
    net.block_probe_on_the_cable()  # the report still comes over the routed path; the probe's bytes cannot
    out = net.doctor("--peer", "spark2", "--json")
    checks = _checks(out)
    assert checks["fabric.peer"]["status"] == "ok"
    probe = checks["fabric.throughput"]
    assert probe["status"] == "warn", probe
    assert probe["data"]["address"] == f"{fn.PEER_CABLE}:{fn.PORT}"
    assert [p["direction"] for p in probe["data"]["probes"]] == ["from the peer"]  # no upload after a failed download
    assert f"listening on {fn.PEER_CABLE}:{fn.PORT}" in probe["remedy"]
    assert json.loads(out.stdout)["elapsed_s"] < 12
