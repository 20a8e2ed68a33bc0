"""The RoCE interface detection: /proc parsing (real kernel output) and the choice between nodes. Pure."""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

import pytest

from metralectl.seams import netprobe
from metralectl.seams import roce
from metralectl.seams.netprobe import IfAddr, NodeNet
from metralectl.seams.roce import NodeView, RoceRefused, choose_roce

DATA = Path(__file__).parent / "data"
ROCE = ("enp1s0f0np0", "enp1s0f1np1")
# Captured from a network namespace shaped like a GB10 head: RoCE port enp1s0f0np0 10.0.0.1/24, the
# second port without an address, the management NIC enP7s7 with the default route, a docker0 bridge;
# a listener on 10.0.0.1:29500 (tcp) and one on [::]:8888 (tcp6).
HEAD_PROBE = (DATA / "probe-gb10-head.txt").read_text()


def _le(address: str) -> str:
    return ipaddress.IPv4Address(address).packed[::-1].hex().upper()


def fake_proc(interfaces: dict[str, str], default: str | None = None) -> tuple[str, str]:
    """/proc/net/route and /proc/net/fib_trie text for {iface: "a.b.c.d/len"} (the kernel's layout)."""
    route = ["Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"]
    leaves = ["Main:", "  +-- 0.0.0.0/0 3 0 5"]
    if default:
        gw = str(next(ipaddress.IPv4Interface(interfaces[default]).network.hosts()))
        route.append(f"{default}\t00000000\t{_le(gw)}\t0003\t0\t0\t0\t00000000\t0\t0\t0")
    for iface, cidr in interfaces.items():
        net = ipaddress.IPv4Interface(cidr)
        route.append(f"{iface}\t{_le(str(net.network.network_address))}\t00000000\t0001\t0\t0\t0\t"
                     f"{_le(str(net.network.netmask))}\t0\t0\t0")
        leaves += [f"     +-- {net.network} 2 0 2", f"        |-- {net.network.network_address}",
                   f"           /{net.network.prefixlen} link UNICAST", f"        |-- {net.ip}", "           /32 host LOCAL"]
    leaves += ["     +-- 127.0.0.0/8 2 0 2", "        |-- 127.0.0.1", "           /32 host LOCAL"]
    return "\n".join(route) + "\n", "\n".join(leaves) + "\n"


def net(interfaces: dict[str, str], default: str | None = None) -> NodeNet:
    return netprobe.node_net(*fake_proc(interfaces, default))


# --- parsing real kernel output ----------------------------------------------------------------------------
def test_real_probe_output_names_interfaces_addresses_management_and_listeners() -> None:
    report = netprobe.parse_probe(HEAD_PROBE)
    assert report.net.interfaces == {"enp1s0f0np0": (IfAddr("10.0.0.1", 24),), "enP7s7": (IfAddr("192.168.1.10", 24),),
                                     "docker0": (IfAddr("172.17.0.1", 16),)}
    assert report.net.default_ifaces == ("enP7s7",)
    assert ("10.0.0.1", 29500) in report.net.listeners and ("::", 8888) in report.net.listeners
    assert report.hub is not None and report.hub.verified == ("a" * 40,) and report.hub.unverified == ("b" * 40,)
    assert report.hub.ref_main == "a" * 40


def test_this_machines_own_proc_parses() -> None:
    """The parser on whatever kernel runs the tests (no container): every address lands on an interface."""
    out = subprocess.run(["sh", "-c", netprobe.probe_script("models--x--y")], check=False, capture_output=True, text=True, timeout=10)
    report = netprobe.parse_probe(out.stdout)
    assert "?" not in report.net.interfaces
    assert report.hub is not None and not report.hub.hub_present  # no /metralectl-hub outside the probe


def test_port_holders_respect_wildcards_and_specific_binds() -> None:
    report = netprobe.parse_probe(HEAD_PROBE)
    assert report.net.port_holders("10.0.0.1", 29500) == ["10.0.0.1:29500"]
    assert report.net.port_holders("0.0.0.0", 29500) == ["10.0.0.1:29500"]
    assert report.net.port_holders("127.0.0.1", 29500) == []  # another address, same port: no conflict
    assert report.net.port_holders("127.0.0.1", 8888) == ["[::]:8888"]  # a wildcard holds every address
    assert report.net.port_holders("127.0.0.1", 8889) == []


def test_unreadable_probe_output_is_refused_with_what_it_printed() -> None:
    with pytest.raises(netprobe.ProbeUnreadable, match="sh: cat: not found"):
        netprobe.parse_probe("sh: cat: not found\n")


def test_an_address_without_a_connected_route_is_kept_under_unknown() -> None:
    route, _ = fake_proc({"enP7s7": "192.168.1.10/24"})
    fib = "Local:\n  |-- 192.168.1.10\n     /32 host LOCAL\n  |-- 10.9.9.9\n     /32 host LOCAL\n"
    assert netprobe.node_net(route, fib).interfaces == {"enP7s7": (IfAddr("192.168.1.10", 24),),
                                                        "?": (IfAddr("10.9.9.9", None),)}


# --- the choice ----------------------------------------------------------------------------------------
def test_both_nodes_on_the_first_port() -> None:
    head = net({"enp1s0f0np0": "10.0.0.1/24", "enP7s7": "192.168.1.10/24"}, default="enP7s7")
    worker = net({"enp1s0f0np0": "10.0.0.2/24", "enP7s7": "192.168.1.11/24"}, default="enP7s7")
    choice = choose_roce(ROCE, [NodeView("head", head), NodeView("worker", worker)])
    assert choice.interface == "enp1s0f0np0" and choice.master_addr == "10.0.0.1" and choice.notes == ()


def test_the_port_both_nodes_have_wins_and_a_tie_goes_to_the_classs_first() -> None:
    head = net({"enp1s0f0np0": "10.0.0.1/24", "enp1s0f1np1": "10.0.1.1/24"})
    worker = net({"enp1s0f1np1": "10.0.1.2/24"})
    assert choose_roce(ROCE, [NodeView("head", head), NodeView("worker", worker)]).interface == "enp1s0f1np1"
    both = net({"enp1s0f0np0": "10.0.0.2/24", "enp1s0f1np1": "10.0.1.2/24"})
    choice = choose_roce(ROCE, [NodeView("head", head), NodeView("worker", both)])
    assert choice.interface == "enp1s0f0np0" and "both have IPv4" in choice.notes[0]


def test_nodes_that_disagree_are_refused() -> None:
    head = net({"enp1s0f0np0": "10.0.0.1/24"})
    worker = net({"enp1s0f1np1": "10.0.1.2/24"})
    with pytest.raises(RoceRefused, match="disagree.*head has enp1s0f0np0; worker has enp1s0f1np1") as err:
        choose_roce(ROCE, [NodeView("head", head), NodeView("worker", worker)])
    assert "--roce-interface" in (err.value.hint or "")


def test_only_the_management_interface_is_refused() -> None:
    head = net({"enp1s0f0np0": "10.0.0.1/24", "enP7s7": "192.168.1.10/24"}, default="enP7s7")
    worker = net({"enP7s7": "192.168.1.11/24"}, default="enP7s7")
    with pytest.raises(RoceRefused, match=r"worker: no IPv4 address on enp1s0f0np0 or enp1s0f1np1; only the "
                                          r"management interface \(enP7s7 192.168.1.11/24\)") as err:
        choose_roce(ROCE, [NodeView("head", head), NodeView("worker", worker)])
    assert "10× slower" in err.value.message and "sudo ip addr add" in (err.value.hint or "")


def test_other_non_roce_interfaces_and_none_at_all_are_refused_and_said_apart() -> None:
    head = net({"enp1s0f0np0": "10.0.0.1/24"})
    docker_only = net({"docker0": "172.17.0.1/16", "enP7s7": "192.168.1.11/24"}, default="enP7s7")
    with pytest.raises(RoceRefused, match="none of them a RoCE port"):
        choose_roce(ROCE, [NodeView("head", head), NodeView("worker", docker_only)])
    with pytest.raises(RoceRefused, match="no IPv4 address besides loopback"):
        choose_roce(ROCE, [NodeView("head", head), NodeView("worker", NodeNet())])


def test_the_same_address_on_both_nodes_is_one_machine() -> None:
    same = net({"enp1s0f0np0": "10.0.0.1/24"})
    with pytest.raises(RoceRefused, match="same machine"):
        choose_roce(ROCE, [NodeView("head", same), NodeView("worker", same)])


def test_different_networks_on_the_port_are_noted() -> None:
    head = net({"enp1s0f0np0": "10.0.0.1/24"})
    worker = net({"enp1s0f0np0": "10.0.5.2/24"})
    choice = choose_roce(ROCE, [NodeView("head", head), NodeView("worker", worker)])
    assert any("not in worker's enp1s0f0np0 network 10.0.5.0/24" in n for n in choice.notes)


def test_a_class_without_roce_interfaces_is_refused() -> None:
    with pytest.raises(RoceRefused, match="no RoCE interfaces"):
        choose_roce((), [NodeView("head", NodeNet())])


def test_describe_marks_the_choice_the_candidates_and_management() -> None:
    report = netprobe.parse_probe(HEAD_PROBE)
    line = roce.describe(report.net, ROCE, "enp1s0f0np0")
    assert line.startswith("enp1s0f0np0 10.0.0.1/24 (RoCE, chosen)")
    assert "enP7s7 192.168.1.10/24 (management: default route)" in line and "no IPv4 on enp1s0f1np1" in line


def test_operator_given_values_are_checked_not_refused() -> None:
    head = NodeView("head", net({"enp1s0f0np0": "10.0.0.1/24"}))
    worker = NodeView("worker", net({"enp1s0f1np1": "10.0.1.2/24"}))
    notes = roce.check_given("enp1s0f0np0", "10.0.0.9", [head, worker])
    assert any("--master-addr 10.0.0.9 is not head's address" in n for n in notes)
    assert any("worker has no IPv4 address on enp1s0f0np0" in n for n in notes)
    assert roce.check_given("enp1s0f0np0", "10.0.0.1", [head]) == []


def test_hub_summary() -> None:
    report = netprobe.parse_probe(HEAD_PROBE)
    assert netprobe.hub_summary(report.hub) == "verified " + "a" * 12
    absent = netprobe.parse_probe(HEAD_PROBE.split("@@metralectl-probe hf")[0] +
                                  "@@metralectl-probe hf\nhub present\nrepo absent\n@@metralectl-probe end\n")
    assert netprobe.hub_summary(absent.hub) == "checkpoint absent"
