"""The fabric preflight's verdicts from facts (doctor.fabric_checks): each wrong choice explained with its fix."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from metralectl.doctor import fabric_checks as fc
from metralectl.doctor.fabric_facts import FabricFacts, Probe, parse_report

GB10 = {"hardware_class": "gb10", "roce_candidates": ("enp1s0f0np0", "enp1s0f1np1"), "rated_mbps": 200000,
        "expected_mtu": 9000}


def link(name: str, *addrs: str, mtu: int = 9000, speed: int | None = 200000, rdma: tuple[str, ...] = (),
         state: str = "4: ACTIVE", **kw: Any) -> dict[str, Any]:
    return {"name": name, "mtu": mtu, "speed_mbps": speed, "duplex": "full" if speed else None, "operstate": "up",
            "ipv4": list(addrs), "rdma": [{"name": r, "port_state": state} for r in rdma], **kw}


def facts(local: list[dict[str, Any]], remote: list[dict[str, Any]] | None, *, route: str = "enP7s7",
          gateway: str | None = "192.168.1.1", prefix: int = 0, **kw: Any) -> FabricFacts:
    base: dict[str, Any] = {**GB10, **kw}
    return FabricFacts(peer="spark2", peer_host="192.168.1.11",
                       local=parse_report({"links": local, "default_ifaces": ["enP7s7"]}),
                       remote=None if remote is None else parse_report({"links": remote, "default_ifaces": ["enP7s7"]}),
                       remote_error=None if remote is not None else "no answer within 3 s",
                       route_iface=route, route_gateway=gateway, route_prefix=prefix, **base)


HERE = [link("enP7s7", "192.168.1.10/24", mtu=1500, speed=10000, ifindex=2),
        link("enp1s0f1np1", "10.0.0.1/30", rdma=("rocep1s0f1",), ifindex=5)]
THERE = [link("enP7s7", "192.168.1.11/24", mtu=1500, speed=10000, ifindex=2),
         link("enp1s0f1np1", "10.0.0.2/30", rdma=("rocep1s0f1",), ifindex=5)]


def test_the_direct_cable_is_preferred_and_the_default_route_called_out() -> None:
    f = facts(HERE, THERE)
    pair = fc.chosen(f)
    assert pair is not None and (pair.local.name, pair.remote_addr, pair.direct) == ("enp1s0f1np1", "10.0.0.2", True)
    verdict = fc.check_route(f)
    assert verdict.status == "warn"
    assert verdict.detail.startswith("spark2 (192.168.1.11) is reached through enP7s7 (the default route via "
                                     "192.168.1.1), but enp1s0f1np1 has the /30 of a direct cable to it")
    assert verdict.remedy is not None and verdict.remedy.startswith("set NCCL_SOCKET_IFNAME=enp1s0f1np1")
    on_cable = fc.check_route(replace(f, peer_host="10.0.0.2", route_iface="enp1s0f1np1", route_gateway=None,
                                      route_prefix=30))
    assert on_cable.status == "ok" and "the /30 of a direct cable" in on_cable.detail


def test_no_shared_network_is_a_problem_with_the_addresses_to_give() -> None:
    f = facts(HERE[:1] + [link("enp1s0f1np1")], [link("enp1s0f1np1", "10.0.9.2/30")] + THERE[:0],
              route="enP7s7")
    verdict = fc.check_route(f)
    assert verdict.status == "problem" and "reached only through enP7s7" in verdict.detail
    assert verdict.remedy is not None and "10.0.0.1/30" in verdict.remedy
    assert fc.check_mtu(f).status == "skipped"


def test_a_link_below_the_cards_rating_is_named_with_both_numbers() -> None:
    slow = [HERE[0], link("enp1s0f1np1", "10.0.0.1/30", speed=10000, rdma=("rocep1s0f1",))]
    verdict = fc.check_speed(facts(slow, THERE))
    assert verdict.status == "warn"
    assert verdict.detail.startswith("the link runs at 10000 Mb/s (here), the card is rated 200000 (gb10)")
    assert verdict.remedy is not None and "ethtool enp1s0f1np1" in verdict.remedy
    assert fc.check_speed(facts(HERE, THERE)).status == "ok"


def test_half_duplex_and_a_down_link_are_problems() -> None:
    half = [HERE[0], {**link("enp1s0f1np1", "10.0.0.1/30"), "duplex": "half"}]
    assert fc.check_speed(facts(half, THERE)).status == "problem"
    down = [HERE[0], {**link("enp1s0f1np1", "10.0.0.1/30"), "operstate": "down"}]
    verdict = fc.check_speed(facts(down, THERE))
    assert verdict.status == "problem" and "`sudo ip link set enp1s0f1np1 up`" in (verdict.remedy or "")


def test_mtu_mismatch_names_the_end_to_change_and_jumbo_frames_are_expected() -> None:
    low_peer = [THERE[0], link("enp1s0f1np1", "10.0.0.2/30", mtu=1500)]
    verdict = fc.check_mtu(facts(HERE, low_peer))
    assert verdict.status == "problem"
    assert "enp1s0f1np1 here 9000, enp1s0f1np1 on spark2 1500" in verdict.detail
    assert verdict.remedy == ("the same MTU on both ends: on spark2 `sudo ip link set enp1s0f1np1 mtu 9000` "
                              "(persistent: `mtu: 9000` in netplan)")
    both_low = [HERE[0], link("enp1s0f1np1", "10.0.0.1/30", mtu=1500)]
    jumbo = fc.check_mtu(facts(both_low, low_peer))
    assert jumbo.status == "warn" and "expects jumbo frames (9000)" in jumbo.detail
    assert "RoCE's path MTU is then 1024" in jumbo.detail
    assert fc.check_mtu(facts(HERE, THERE)).status == "ok"
    assert fc.check_mtu(facts(both_low, low_peer, expected_mtu=None)).status == "ok"
    assert [fc.roce_path_mtu(m) for m in (1500, 4200, 9000, 300)] == [1024, 4096, 4096, None]


def test_rdma_none_inactive_or_several() -> None:
    assert fc.check_rdma(facts(HERE, THERE)).status == "ok"
    none = [HERE[0], link("enp1s0f1np1", "10.0.0.1/30")]
    verdict = fc.check_rdma(facts(none, THERE))
    assert verdict.status == "warn" and "here enp1s0f1np1: none: NCCL will fall back to sockets" in verdict.detail
    assert "run --no-rdma" in (verdict.remedy or "") and "here" in (verdict.remedy or "")
    idle = [HERE[0], link("enp1s0f1np1", "10.0.0.1/30", rdma=("rocep1s0f1",), state="1: DOWN")]
    assert fc.check_rdma(facts(idle, THERE)).status == "problem"
    two = [HERE[0], link("enp1s0f1np1", "10.0.0.1/30", rdma=("mlx5_0", "mlx5_1"))]
    assert "not guessed" in fc.check_rdma(facts(two, THERE)).detail


def test_nccl_profile_against_the_link_and_ncclss_own_pick() -> None:
    verdict = fc.check_nccl(facts(HERE, THERE))
    assert verdict.status == "ok"
    assert "NCCL_SOCKET_IFNAME=enp1s0f1np1 (master address 10.0.0.1), NCCL_IB_HCA=rocep1s0f1 here, rocep1s0f1 on " \
           "spark2" in verdict.detail
    assert verdict.data["nccl_default"] == "enP7s7"
    shell = fc.check_nccl(facts(HERE, THERE, environ={"NCCL_SOCKET_IFNAME": "enP7s7"}))
    assert shell.status == "warn" and "this shell sets NCCL_SOCKET_IFNAME=enP7s7" in shell.detail
    # the cable on a port the class does not name: the profile would refuse; the fix names the port and address
    odd = [HERE[0], link("enp2s0", "10.0.0.1/30")]
    odd_there = [THERE[0], link("enp2s0", "10.0.0.2/30")]
    refused = fc.check_nccl(facts(odd, odd_there))
    assert refused.status == "problem" and "would refuse" in refused.detail
    assert "--roce-interface enp2s0 --master-addr 10.0.0.1" in (refused.remedy or "")
    # both RoCE ports addressed, the cable on the second: the profile takes the first
    both = HERE + [link("enp1s0f0np0", "10.5.0.1/24")]
    both_there = THERE + [link("enp1s0f0np0", "10.5.0.2/24")]
    other = fc.check_nccl(facts(both, both_there))
    assert other.status == "warn" and "would set NCCL_SOCKET_IFNAME=enp1s0f0np0" in other.detail
    assert fc.check_nccl(facts(HERE, THERE, roce_candidates=())).status == "skipped"


def test_throughput_verdicts() -> None:
    f = facts(HERE, THERE, probe_address="10.0.0.2:8899")
    assert fc.check_throughput(f).status == "skipped"
    fine = fc.check_throughput(replace(f, probes=(Probe("from the peer", 256 << 20, 0.8), Probe("to the peer", 64 << 20, 0.5))))
    assert fine.status == "ok" and "from the peer 2684 Mb/s" in fine.detail and "a floor" in fine.detail
    slow = fc.check_throughput(replace(f, probes=(Probe("from the peer", 1 << 20, 1.0),)))
    assert slow.status == "warn" and "under 1 Gb/s on a 200000 Mb/s link" in slow.detail
    failed = fc.check_throughput(replace(f, probes=(Probe("to the peer", error="connection refused"),)))
    assert failed.status == "warn" and "10.0.0.2:8899" in (failed.remedy or "")


def test_without_the_peers_report_only_this_end_is_judged() -> None:
    f = facts(HERE, None, route="enp1s0f1np1", gateway=None, prefix=30)
    f = replace(f, peer_host="10.0.0.2")
    peer = fc.check_peer(f)
    assert peer.status == "warn" and "did not answer" in peer.detail and "agent start --peers" in (peer.remedy or "")
    assert fc.check_route(f).status == "ok"
    assert "(spark2's end unknown)" in fc.check_mtu(f).detail


def test_the_example_in_doctor_md_is_what_the_checks_print() -> None:
    from pathlib import Path

    from metralectl.cli.doctor_cmd import render_text
    from metralectl.doctor.model import CheckResult

    rate = "200 Gb/sec (4X HDR)"
    here = [link("enP7s7", "192.168.1.10/24", mtu=1500, speed=10000, ifindex=2),
            {**link("enp1s0f1np1", "10.0.0.1/30", speed=10000, ifindex=5),
             "rdma": [{"name": "rocep1s0f1", "port_state": "4: ACTIVE", "rate": rate}]}]
    there = [link("enP7s7", "192.168.1.11/24", mtu=1500, speed=10000, ifindex=2),
             {**link("enp1s0f1np1", "10.0.0.2/30", mtu=1500, ifindex=5),
              "rdma": [{"name": "rocep1s0f1", "port_state": "4: ACTIVE", "rate": rate}]}]
    f = facts(here, there, probe_address="10.0.0.2:8899",
              probes=(Probe("from the peer", 256 << 20, 0.88), Probe("to the peer", 64 << 20, 0.28)))
    results = [CheckResult(cid, title, v.status, v.detail, v.remedy) for cid, title, judge in fc.FABRIC_CHECKS
               for v in [judge(f)]]
    printed = render_text(results, 0.0).splitlines()[:-1]  # without the summary line
    doc = (Path(__file__).resolve().parents[2] / "docs" / "doctor.md").read_text()
    block = doc.split("## Fabric: `--peer HOST`", 1)[1].split("```\n", 2)[1].splitlines()
    assert printed == block


def test_a_peer_paired_at_an_ipv6_address_is_judged_by_the_shared_network() -> None:
    f = replace(facts(HERE, THERE), peer_host="fe80::2%enP7s7", route_iface=None, route_gateway=None, route_prefix=None)
    verdict = fc.check_route(f)
    assert verdict.status == "ok" and "was not looked up" in verdict.detail and verdict.data["interface"] == "enp1s0f1np1"


def test_a_peer_paired_at_loopback_is_this_machine() -> None:
    verdict = fc.check_route(replace(facts(HERE, None), peer_host="127.0.0.1"))
    assert verdict.status == "problem" and "a loopback address: this machine" in verdict.detail
