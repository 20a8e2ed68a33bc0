"""Campaign planning (pure) and the campaign's run-time rules against fake nodes: longest-first with the
speed class on the reference, retiring, retries elsewhere, halting on a FAIL, thermal parking with
hysteresis, Ctrl-C cancelling every node's unit; and the plan file's refusals with their positions."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from metralectl.campaign import file as campaign_file
from metralectl.campaign.runner import Campaign, CampaignOptions, exit_code
from metralectl.campaign.plan import NodeFacts, PlannedUnit, choose_reference, estimate_s, pick, simulate
from metralectl.errors import ExitCode, MetralError
from metralectl.peers.remote_units import RecordRejected, UnitRefused
from metralectl.telemetry.thermal import ThermalLines


def U(id: str, suite: str = "tool-call", s: float = 10.0, group: str | None = None) -> PlannedUnit:
    return PlannedUnit(id, suite, {}, expected_s=s, group=group or id)


# -- planning ---------------------------------------------------------------------------------------
def test_pick_longest_first_and_the_reference_takes_the_speed_class_first() -> None:
    pending = [U("t1", s=30), U("t2", s=50), U("d", "decode", s=20), U("sw", "concurrency-sweep", s=40)]
    assert pick(pending, "ref", "ref", set()).id == "sw"  # speed units first on the reference, longest of them
    assert pick(pending, "other", "ref", set()).id == "t2"  # others never take speed units
    assert pick([U("d", "decode")], "other", "ref", set()) is None
    assert pick([U("t2", s=50)], "other", "ref", set(), {"t2": {"other"}}) is None  # failed there once: never again
    shards = [U("a-s0of2", s=10, group="a"), U("a-s1of2", s=10, group="a"), U("b", s=10)]
    assert pick(shards, "n", "ref", {"a"}).id == "b"  # among equals, a group it has not got yet


def test_simulate_is_list_scheduling_with_the_speed_bundle() -> None:
    units = [U("d", "decode", 30), U("sw", "concurrency-sweep", 60), U("t1", s=40), U("t2", s=35), U("t3", s=20)]
    plan = simulate(units, [NodeFacts("ref"), NodeFacts("b")], "ref")
    assert plan.queues["ref"][:2] == ["sw", "d"] and set(plan.queues["b"]) >= {"t1", "t2"}
    assert plan.makespan_s == max(plan.finish_s.values()) and not plan.unassigned
    assert sorted(plan.queues["ref"] + plan.queues["b"]) == sorted(u.id for u in units)
    assert plan.finish_s["ref"] == 90 + (20 if "t3" in plan.queues["ref"] else 0)


def test_choose_reference() -> None:
    nodes = [NodeFacts("a", 50, 60), NodeFacts("b", 80, 70), NodeFacts("c", 80, 55)]
    assert choose_reference(nodes, None)[0] == "c"  # most free memory, then the coolest
    assert choose_reference(nodes, "a") == ("a", "named with --reference")
    with pytest.raises(MetralError, match="not among the admitted"):
        choose_reference(nodes, "z")
    with pytest.raises(MetralError, match="no node is admitted"):
        choose_reference([], None)


def test_estimates_follow_the_parameters() -> None:
    from metralectl.bench.params import parse_params
    from metralectl.bench.suites import get_suite

    def est(suite: str, *pairs: str) -> float:
        s = get_suite(suite)
        return estimate_s(suite, parse_params(suite, s.schema, list(pairs)))

    assert est("decode", "repeats=100") > est("decode", "repeats=10")
    assert est("concurrency-sweep", "shard=0/2") < est("concurrency-sweep")


# -- run time, against fake nodes -------------------------------------------------------------------
class FakeNode:
    def __init__(self, name: str, *, fail: int = 0, verdict: str = "none", temps: list[float | None] | None = None,
                 block: bool = False, reject: bool = False, busy: int = 0) -> None:
        self.name, self.fingerprint = name, f"FP-{name}"
        self.fail, self.verdict, self.temps, self.block, self.reject = fail, verdict, list(temps or []), block, reject
        self.busy = busy
        self.ran: list[str] = []
        self.cancelled: list[str] = []
        self.release = threading.Event()
        self.reads = 0

    def submit(self, spec: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        if self.busy > 0:
            self.busy -= 1
            raise UnitRefused("not admitted now: busy: a launch, swap or stop holds the lifecycle lock", status=503)
        self.ran.append(spec["key"])
        return {"key": spec["key"]}, True

    def follow(self, key: str, on_event: Any, on_loss: Any) -> dict[str, Any]:
        if self.block:
            self.release.wait(10)
            return {"seq": 3, "kind": "end", "data": {"state": "cancelled"}, "message": "unit cancelled"}
        if self.fail > 0:
            self.fail -= 1
            return {"seq": 3, "kind": "end", "data": {"state": "failed"}, "message": "unit failed: boom"}
        return {"seq": 3, "kind": "end", "data": {"state": "completed"}}

    def fetch(self, key: str, dest: Path, suite: str) -> dict[str, Any]:
        if self.reject:
            raise RecordRejected("the record is not accepted: signed by someone else")
        return {"verdict": self.verdict, "summary": {"headline": {"x": 1}}, "status": "completed"}

    def cancel(self, key: str) -> None:
        self.cancelled.append(key)
        self.release.set()

    def thermal(self) -> dict[str, Any]:
        self.reads += 1
        temp = self.temps.pop(0) if self.temps else 40.0
        return {"temp_c": temp, "clock_reasons": [], "reason": None if temp is not None else "no sensor"}


def _campaign(tmp_path: Path, units: list[PlannedUnit], nodes: list[FakeNode], reference: str | None = None,
              **opts: Any) -> tuple[Campaign, list[tuple[str, dict[str, Any]]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    lines = {n.name: ThermalLines(80, 70) for n in nodes}
    c = Campaign("r1", units, list(nodes), reference or nodes[0].name, lines, tmp_path / "c",  # type: ignore[arg-type]
                 options=CampaignOptions(thermal_poll_s=0.01, **opts), on_event=lambda k, d: events.append((k, d)))
    return c, events


def test_a_node_failing_twice_is_retired_and_its_units_go_elsewhere(tmp_path: Path) -> None:
    a, b = FakeNode("a"), FakeNode("b", fail=99)
    c, events = _campaign(tmp_path, [U(f"t{i}", s=10 - i) for i in range(5)], [a, b])
    record = c.run()
    assert c.retired and list(c.retired) == ["b"] and len(b.ran) == 2
    assert all(u["state"] == "accepted" and u["node"] == "a" for u in record["units"])
    retried = [u for u in record["units"] if len(u["attempts"]) == 2]
    assert len(retried) == 2 and all(u["attempts"][0]["node"] == "b" for u in retried)
    assert exit_code(record) == 0 and ("retired", ) == tuple(k for k, _ in events if k == "retired")


def test_a_unit_is_tried_on_at_most_two_nodes(tmp_path: Path) -> None:
    nodes = [FakeNode("a", fail=1), FakeNode("b", fail=1), FakeNode("c")]
    c, _ = _campaign(tmp_path, [U("t")], nodes, attempts=2)
    record = c.run()
    unit = record["units"][0]
    assert unit["state"] == "failed" and len(unit["attempts"]) == 2 and "boom" in unit["error"]
    assert exit_code(record) == 1


def test_a_rejected_record_counts_as_a_failure_of_that_node(tmp_path: Path) -> None:
    a, b = FakeNode("a"), FakeNode("b", reject=True)
    c, _ = _campaign(tmp_path, [U("t1", s=5), U("t2", s=4)], [b, a], reference="b")
    record = c.run()
    assert all(u["state"] == "accepted" and u["node"] == "a" for u in record["units"])
    assert any("signed by someone else" in (att["error"] or "") for u in record["units"] for att in u["attempts"])


def test_a_busy_node_is_asked_again_later_not_counted_as_failing(tmp_path: Path) -> None:
    busy = FakeNode("solo", busy=3)
    c, events = _campaign(tmp_path, [U("t1")], [busy], busy_backoff_s=0.01)
    record = c.run()
    assert record["units"][0]["state"] == "accepted" and not c.retired and c.failures["solo"] == 0
    assert [d["times"] for k, d in events if k == "busy"] == [1, 2, 3]
    forever = FakeNode("never", busy=10**6)
    c2, events2 = _campaign(tmp_path / "2", [U("t1")], [forever], busy_backoff_s=0.0, busy_limit=4)
    record2 = c2.run()
    assert "not admitted 4 times" in c2.retired["never"] and record2["units"][0]["state"] == "not-run"


def test_a_fail_verdict_halts_new_units_unless_keep_going(tmp_path: Path) -> None:
    units = [U("t1", s=30), U("t2", s=20), U("t3", s=10)]
    c, events = _campaign(tmp_path, units, [FakeNode("a", verdict="fail")])
    record = c.run()
    states = [u["state"] for u in record["units"]]
    assert states == ["accepted", "not-run", "not-run"] and exit_code(record) == 2
    assert "halt" in [k for k, _ in events] and "failed its gate" in record["units"][1]["error"]
    c2, _ = _campaign(tmp_path / "2", units, [FakeNode("a", verdict="fail")], keep_going=True)
    assert [u["state"] for u in c2.run()["units"]] == ["accepted"] * 3


def test_thermal_park_with_hysteresis_then_resume(tmp_path: Path) -> None:
    hot = FakeNode("hot", temps=[85.0, 75.0, 74.0, 65.0])
    c, events = _campaign(tmp_path, [U("t1")], [hot])
    c.run()
    thermal = [d for k, d in events if k == "thermal"]
    assert [(t["state"], t["temp_c"]) for t in thermal] == [("parked", 85.0), ("resumed", 65.0)]
    assert hot.reads == 4 and hot.ran  # 75 and 74 are between the lines: still parked


def test_a_node_without_a_temperature_is_never_parked_and_it_is_said_once(tmp_path: Path) -> None:
    blind = FakeNode("blind", temps=[None, None, None])
    c, events = _campaign(tmp_path, [U("t1"), U("t2"), U("t3")], [blind])
    c.run()
    unknown = [d for k, d in events if k == "thermal"]
    assert len(unknown) == 1 and unknown[0]["state"] == "unknown" and len(blind.ran) == 3


def test_ignore_thermals_warns_and_keeps_going(tmp_path: Path) -> None:
    hot = FakeNode("hot", temps=[90.0])
    c, events = _campaign(tmp_path, [U("t1")], [hot], ignore_thermals=True)
    c.run()
    assert [d["state"] for k, d in events if k == "thermal"] == ["ignored"] and hot.ran


def test_a_long_park_resumes_with_a_warning(tmp_path: Path) -> None:
    hot = FakeNode("hot", temps=[90.0] * 1000)
    c, events = _campaign(tmp_path, [U("t1")], [hot], thermal_max_wait_s=0.05)
    c.run()
    last = [d for k, d in events if k == "thermal"][-1]
    assert last["state"] == "resumed" and "WARNING" in last["reason"] and hot.ran


def test_abort_cancels_every_nodes_running_unit(tmp_path: Path) -> None:
    a, b = FakeNode("a", block=True), FakeNode("b", block=True)
    c, events = _campaign(tmp_path, [U("t1", s=20), U("t2", s=10), U("t3", s=5)], [a, b])
    done: list[dict[str, Any]] = []
    runner = threading.Thread(target=lambda: done.append(c.run()))
    runner.start()
    deadline = time.monotonic() + 5
    while len(c.running) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    c.abort()
    runner.join(5)
    assert a.cancelled and b.cancelled and done
    record = done[0]
    assert record["aborted"] and exit_code(record) == 130
    assert {u["state"] for u in record["units"]} == {"cancelled"}
    assert [k for k, _ in events].count("cancel") == 2


# -- the plan file ----------------------------------------------------------------------------------
def test_plan_file_problems_name_the_line_and_key(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("nodes: [a]\nunits:\n  - suite: decod\n  - suite: decode\n    params: {repeats: 0}\n"
                    "  - suite: tool-call\n    shards: 2\n    colour: red\n")
    with pytest.raises(campaign_file.CampaignInvalid) as caught:
        campaign_file.load(plan, [], [], None, None)
    rendered = [p.render() for p in caught.value.problems]
    assert any("plan.yaml:3" in r and "units[0].suite" in r and "decode" in r for r in rendered), rendered
    assert any("plan.yaml:8" in r and "colour" in r for r in rendered), rendered
    assert any("cannot be sharded" in r for r in rendered), rendered
    assert caught.value.exit_code == ExitCode.DATA


def test_plan_file_and_cli_units(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: nightly\nnodes: [10.0.0.2]\nreference: 10.0.0.2\nunits:\n"
                    "  - suite: concurrency-sweep\n    id: sweep\n    params: {concurrencies: [1, 2, 4]}\n    shards: 2\n"
                    "  - suite: decode\n    expected_s: 12\n")
    spec = campaign_file.load(plan, ["tool-call repeats=3", "tool-call repeats=3"], ["dgx3.local"], None, None)
    assert spec.nodes == ("10.0.0.2", "dgx3.local") and spec.reference == "10.0.0.2"
    ids = [u.id for u in spec.units]
    assert ids == ["sweep-s0of2", "sweep-s1of2", "decode", "tool-call", "tool-call-2"]
    assert spec.units[0].params == {"concurrencies": "1,2,4", "shard": "0/2"} and spec.units[2].expected_s == 12
    with pytest.raises(campaign_file.CampaignInvalid, match="unknown parameter"):
        campaign_file.load(None, ["decode nope=1"], [], None, None)
    with pytest.raises(MetralError, match="KEY=VALUE"):
        campaign_file.load(None, ["decode repeats"], [], None, None)
