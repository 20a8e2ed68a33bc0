"""The one reader of benchmark run records (bench.records), as the agent's /api/history uses it: the same
statuses `bench history` and the dashboard show, not the raw file."""

from __future__ import annotations

import subprocess
import sys

from metralectl.agent.ops import bench_history
from metralectl.bench import records


def test_the_agent_history_reads_records_as_bench_history_does() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    died = records.start("decode", "20261201-000000-dead00", {"started_at": "2026-12-01T00:00:00+00:00"})
    records.save(died, {**(records.load(died) or {}), "pid": child.pid})
    old = records.start("sweep", "20261201-010000-old000", {"started_at": "2026-12-01T01:00:00+00:00"})
    records.save(old, {**(records.load(old) or {}), "status": "completed",
                       "stages": [{"name": "s", "summary": {"requests": 3, "ok": 0}}]})
    (old / "run.json.sig").write_text("{}")
    (records.runs_root() / "sweep" / "stray.json").write_text('{"status": "completed"}')  # not a run record
    answer = bench_history()
    rows = [(r["benchmark"], r["file"], r["signed"], r["summary"]["status"]) for r in answer["runs"]]
    assert rows == [("sweep", "sweep/20261201-010000-old000/run.json", True, "errors"),
                    ("decode", "decode/20261201-000000-dead00/run.json", False, "interrupted")]
    assert all(not k.startswith("_") for r in answer["runs"] for k in r["summary"])
    assert bench_history(limit=1)["runs"][0]["benchmark"] == "sweep"
