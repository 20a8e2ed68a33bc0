"""An attacker's pass over a peer's link report (`doctor --peer HOST`, doctor/fabric_facts.parse_report): every
list of the report replaced by another JSON type (a dict, a string, a number), MTU and speeds as strings, names with
escapes, a report of a million links. The reader leaves out what it cannot use and counts it; it never raises (a
raise there failed every fabric check with a TypeError instead of judging this end)."""

from __future__ import annotations

import pytest

from metralectl.doctor.fabric_facts import MAX_LINKS, parse_report

GOOD = {"name": "enp1s0f1np1", "mtu": 9000, "ipv4": ["10.99.0.2/30"], "rdma": [{"name": "rocep1s0f1"}]}


@pytest.mark.parametrize("other", [{"a": 1}, "eth0", 7, True, None, 1.5], ids=repr)
def test_a_list_of_the_report_as_another_json_type_is_left_out(other: object) -> None:
    for key in ("rdma", "ipv4"):
        report = parse_report({"links": [{**GOOD, key: other}]})
        port = report.links["enp1s0f1np1"]
        assert (port.rdma if key == "rdma" else port.ipv4) == ()
    assert parse_report({"links": other, "default_ifaces": other}).links == {}
    assert parse_report({"links": [GOOD], "default_ifaces": other}).default_ifaces == ()


def test_numbers_as_strings_and_names_with_escapes_are_left_out_or_escaped() -> None:
    report = parse_report({"links": [
        {**GOOD, "mtu": "9000", "speed_mbps": "200000", "ifindex": "3", "driver": "mlx5\x1b]0;x\x07" + "d" * 500,
         "rdma": [{"name": "roce\x1b[2J"}, {"name": "rocep1s0f1", "rate": "\u202e200 Gb"}]},
        {"name": "eth0\n", "mtu": 1500}, {"name": "\u202eeth1", "mtu": 1500}]})
    port = report.links["enp1s0f1np1"]
    assert (port.mtu, port.speed_mbps, port.ifindex) == (None, None, None)
    assert port.driver is not None and "\x1b" not in port.driver and len(port.driver) <= 40
    assert [r.name for r in port.rdma] == ["rocep1s0f1"] and "\u202e" not in (port.rdma[0].rate or "")
    assert list(report.links) == ["enp1s0f1np1"] and report.dropped == 2


def test_a_report_of_a_hundred_thousand_links_is_read_to_the_cap() -> None:
    addresses = ["10.0.0.1/8"] * 1000
    report = parse_report({"links": [{"name": f"e{i}", "ipv4": addresses} for i in range(100_000)]})
    assert len(report.links) == MAX_LINKS and all(len(e.ipv4) == 16 for e in report.links.values())
