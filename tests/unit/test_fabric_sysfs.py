"""The fabric preflight's readers: a fake sysfs root (speed, duplex, MTU, virtual links, RDMA devices), the route
lookup over /proc/net/route text, and the peer's report read without trusting it."""

from __future__ import annotations

import os
from pathlib import Path

from metralectl.doctor.fabric_facts import MAX_LINKS, parse_report
from metralectl.seams import linkfacts
from metralectl.seams.netprobe import parse_routes


def _attrs(where: Path, **values: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    for name, value in values.items():
        (where / name).write_text(value + "\n")


def fake_sys(root: Path) -> Path:
    """enp1s0f1np1: a ConnectX port (a PCI device, an RDMA device behind it) at 10000 of its 200000 Mb/s;
    veth0: virtual (its sysfs entry under devices/virtual), reporting veth's nominal 10000;
    eno1: physical, no link (speed -1); lo is left out."""
    sys_root = root / "sys"
    devices = sys_root / "devices"
    pci = devices / "pci0000:00" / "0000:01:00.1"
    _attrs(pci / "net" / "enp1s0f1np1", mtu="9000", speed="10000", duplex="full", operstate="up", ifindex="5")
    (pci / "driver").parent.mkdir(parents=True, exist_ok=True)
    (devices / "drivers" / "mlx5_core").mkdir(parents=True)
    os.symlink(devices / "drivers" / "mlx5_core", pci / "driver")
    os.symlink(pci, pci / "net" / "enp1s0f1np1" / "device")
    _attrs(devices / "virtual" / "net" / "veth0", mtu="1500", speed="10000", duplex="full", operstate="up", ifindex="7")
    eno = devices / "pci0000:00" / "0000:02:00.0"
    _attrs(eno / "net" / "eno1", mtu="1500", speed="-1", duplex="unknown", operstate="down", ifindex="2")
    os.symlink(eno, eno / "net" / "eno1" / "device")
    _attrs(devices / "virtual" / "net" / "lo", mtu="65536")
    net = sys_root / "class" / "net"
    net.mkdir(parents=True)
    for name, target in (("enp1s0f1np1", pci / "net" / "enp1s0f1np1"), ("veth0", devices / "virtual" / "net" / "veth0"),
                         ("eno1", eno / "net" / "eno1"), ("lo", devices / "virtual" / "net" / "lo")):
        os.symlink(os.path.relpath(target, net), net / name)
    ib = sys_root / "class" / "infiniband" / "rocep1s0f1"
    _attrs(ib / "ports" / "1", state="4: ACTIVE", rate="10 Gb/sec (1X QDR)", link_layer="Ethernet")
    os.symlink(pci, ib / "device")
    return sys_root


def test_speed_duplex_mtu_and_the_rdma_device_come_from_sysfs(tmp_path: Path) -> None:
    links = linkfacts.read_links(fake_sys(tmp_path))
    assert sorted(links) == ["eno1", "enp1s0f1np1", "veth0"]  # no loopback
    port = links["enp1s0f1np1"]
    assert (port.mtu, port.speed_mbps, port.duplex, port.operstate, port.virtual, port.driver, port.ifindex) == (
        9000, 10000, "full", "up", False, "mlx5_core", 5)
    assert [d.name for d in port.rdma] == ["rocep1s0f1"]
    assert port.rdma[0].port_state == "4: ACTIVE" and port.rdma[0].link_layer == "Ethernet"


def test_a_virtual_link_has_no_speed_and_no_link_is_unknown_too(tmp_path: Path) -> None:
    links = linkfacts.read_links(fake_sys(tmp_path))
    veth = links["veth0"]
    assert veth.virtual and veth.speed_mbps is None and veth.duplex is None and veth.reported_speed == 10000
    eno = links["eno1"]
    assert not eno.virtual and eno.speed_mbps is None and eno.duplex is None and eno.rdma == ()


def test_a_missing_sysfs_is_no_links_not_an_error(tmp_path: Path) -> None:
    assert linkfacts.read_links(tmp_path / "nothing") == {}
    assert linkfacts.rdma_devices(tmp_path / "nothing") == {}


def _route_line(iface: str, dest: str, gw: str, mask: str, flags: int = 0x1, metric: int = 0) -> str:
    def le(a: str) -> str:
        return "".join(f"{int(p):02X}" for p in reversed(a.split(".")))
    return f"{iface}\t{le(dest)}\t{le(gw)}\t{flags:04X}\t0\t0\t{metric}\t{le(mask)}\t0\t0\t0"


ROUTES = "\n".join([
    "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT",
    _route_line("mgmt0", "0.0.0.0", "192.168.77.254", "0.0.0.0", 0x3),
    _route_line("mgmt0", "192.168.77.0", "0.0.0.0", "255.255.255.0"),
    _route_line("enp1s0f1np1", "10.99.0.0", "0.0.0.0", "255.255.255.252"),
])


def test_route_lookup_takes_the_longest_prefix_and_names_a_gateway() -> None:
    routes = parse_routes(ROUTES)
    direct = linkfacts.route_to(routes, "10.99.0.2")
    assert direct is not None and (direct.interface, direct.gateway, direct.prefix) == ("enp1s0f1np1", None, 30)
    far = linkfacts.route_to(routes, "198.51.100.2")
    assert far is not None and (far.interface, far.gateway, far.is_default) == ("mgmt0", "192.168.77.254", True)
    assert linkfacts.route_to(parse_routes(ROUTES.split("\n")[0]), "10.99.0.2") is None
    assert linkfacts.route_to(routes, "spark2.local") is None


def test_the_kernels_source_address_for_loopback() -> None:
    assert linkfacts.source_address("127.0.0.1") == "127.0.0.1"


def test_a_peers_report_is_trusted_in_nothing() -> None:
    hostile = {
        "links": [
            {"name": "enp1s0f1np1", "mtu": 9000, "speed_mbps": 200000, "duplex": "full", "operstate": "up\x1b[2J",
             "ipv4": ["10.99.0.2/30", "not-an-ip", "10.0.0.9/99"], "rdma": [{"name": "rocep1s0f1",
                                                                               "rate": "\x1b]52;c;AAAA\x07 200 Gb"}]},
            {"name": "../../etc", "mtu": 1500},
            {"name": "a b", "mtu": 1500},
            {"name": "eth0", "mtu": True, "speed_mbps": -5, "duplex": "sideways", "virtual": "yes"},
            {"name": "enp1s0f1np1", "mtu": 1500},  # a second entry for one name
            "not a dict",
        ],
        "default_ifaces": ["eth0", 7, "x y"],
    }
    report = parse_report(hostile)
    assert sorted(report.links) == ["enp1s0f1np1", "eth0"] and report.dropped == 4
    port = report.links["enp1s0f1np1"]
    assert port.mtu == 9000 and port.operstate == "up\\x1b[2J"
    assert [str(a) for a in port.ipv4] == ["10.99.0.2/30", "10.0.0.9"]
    assert port.rdma[0].rate is not None and "\x1b" not in port.rdma[0].rate and "\x07" not in port.rdma[0].rate
    eth = report.links["eth0"]
    assert (eth.mtu, eth.speed_mbps, eth.duplex, eth.virtual) == (None, None, None, False)
    assert report.default_ifaces == ("eth0",)
    many = parse_report({"links": [{"name": f"e{i}"} for i in range(1000)]})
    assert len(many.links) == MAX_LINKS
    assert parse_report(["not", "a", "report"]).links == {}


def test_a_hosts_ipv4_address_by_name_or_as_given() -> None:
    assert linkfacts.ipv4_of("10.0.0.2") == "10.0.0.2"
    assert linkfacts.ipv4_of("localhost") == "127.0.0.1"
    assert linkfacts.ipv4_of("fe80::1") is None
    assert linkfacts.ipv4_of("no-such-host.invalid", timeout_s=2.0) is None


def test_between_two_default_routes_the_lower_metric_wins() -> None:
    routes = parse_routes("\n".join([ROUTES.split("\n")[0],
                                      _route_line("wlan0", "0.0.0.0", "10.1.0.1", "0.0.0.0", 0x3, metric=600),
                                      _route_line("mgmt0", "0.0.0.0", "192.168.77.254", "0.0.0.0", 0x3, metric=100)]))
    far = linkfacts.route_to(routes, "198.51.100.2")
    assert far is not None and far.interface == "mgmt0"
