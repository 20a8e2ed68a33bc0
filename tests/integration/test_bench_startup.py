"""`metralectl bench startup` against llama.cpp's real `llama-server` run as a host process (the box, binary and
tiny model of test_llamacpp_process.py): two cold starts, each with every phase (preflight, pull, create, load,
warm-up) present, in order and adding up to the time to first token, the lifecycle's own events behind them in
their order, the engine's log phases inside `load`; the record signed and verified, its first requests counted;
nothing left running; and `bench report` makes the startup plot from it. Something served already: refused (75),
nothing started or stopped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from metralectl.errors import ExitCode

from tests.integration.test_llamacpp_process import TINY, ProcBox, box, hf_home, llama_server  # noqa: F401

pytestmark = [pytest.mark.integration]


def test_startup_times_every_phase_of_a_real_cold_start(box: ProcBox, tmp_path: Path) -> None:  # noqa: F811
    port = box.own_port()
    name = box.recipe("tiny", TINY, port)
    out = box.cli("bench", "startup", name, "--repeats", "2", "--json", timeout=300)
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    assert record["suite"] == "startup" and record["status"] == "completed" and len(record["stages"]) == 2
    for stage in record["stages"]:
        s = stage["summary"]
        assert s["missing"] == [] and s["ordered"] and stage["ok"], s
        phases = s["phases"]
        assert set(phases) == {"preflight", "pull", "create", "load", "warm-up"}
        assert record["phases"] == ["preflight", "pull", "create", "load", "warm-up"]  # their order (JSON sorts keys)
        assert all(v >= 0 for v in phases.values()) and phases["load"] > 0 and phases["warm-up"] > 0
        assert sum(phases.values()) == pytest.approx(s["time_to_first_token_s"], abs=0.002)
        assert s["time_to_ready_s"] < s["time_to_first_token_s"]
        kinds = [(kind, what) for _, kind, what in s["events"]]
        order = [kinds.index(k) for k in (("Step", "program"), ("Step", "weights"), ("Step", "port"))]
        started = next(i for i, (kind, _) in enumerate(kinds) if kind == "ContainerStarted")
        ready = next(i for i, (kind, _) in enumerate(kinds) if kind == "Ready")
        assert order == sorted(order) and order[-1] < started < ready
        # llama-server's own log phases, inside load: always its ready line; its loading line too unless the whole
        # load fell between two reads of its log (seen on a stalled CI box)
        assert "ready" in s["engine_phases"] and set(s["engine_phases"]) <= {"loading", "kv-sizing", "loaded", "ready"}
        at = [t for t, _, _ in s["events"]]
        assert at == sorted(at)
        assert s["requests"] == 1 and s["ok"] == 1
    assert not box.engines() and not box.listening(port)  # each start stopped
    verify = box.cli("bench", "verify", record["run_id"])
    assert verify.returncode == 0 and "timings" in verify.stdout, verify.stderr
    run_dir = box.home / "metrale" / "runs" / "startup" / record["run_id"]
    lines = [json.loads(x) for x in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert [x["stage"] for x in lines] == ["start 1", "start 2"] and all(x["ok"] for x in lines)
    page = tmp_path / "startup.html"
    report = box.cli("bench", "report", record["run_id"], "--html", str(page))
    assert report.returncode == 0, report.stderr
    assert 'id="fig-startup"' in page.read_text()


def test_startup_refuses_when_something_serves(box: ProcBox) -> None:  # noqa: F811
    port = box.own_port()
    name = box.recipe("tiny", TINY, port)
    box.cli("run", name, check=True, timeout=180)
    out = box.cli("bench", "startup", name, "--repeats", "1")
    assert out.returncode == ExitCode.BUSY and "is served now" in out.stderr
    assert box.engines()  # what served still serves
    assert not (box.home / "metrale" / "runs" / "startup").exists()
