"""The control-plane page's job log (metralectl/agent/static/joblog.js), run by node on the events the
agent really sends (lifecycle events through events.to_json, as jobs.event_json records them): every row
names its human step and a human label, never an internal event name; a failure or a warning is shown in
the step it happened in; progress of one transfer is one row, updated."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from metralectl.core.images import LayerProgress
from metralectl.lifecycle import events as ev
from metralectl.seams.hf.steps import PullEvent
from tests.unit.test_peer_text import STATIC, _node

INTERNAL = {"Step", "Transfer", "ContainerStarted", "Phase", "LogLine", "Ready", "Failed", "Warning", "Warning_"}


def rows(events: list[Any]) -> list[dict[str, Any]]:
    script = ("const {jobLogRows} = require(process.argv[1]);"
              "const input = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
              "process.stdout.write(JSON.stringify(jobLogRows(input)));")
    payload = json.dumps([{"seq": i + 1, "t": 0.0, **ev.to_json(e)} for i, e in enumerate(events)])
    out = subprocess.run([_node(), "-e", script, str(STATIC / "joblog.js")], input=payload, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout))


def shown(row: dict[str, Any]) -> tuple[str, str, str]:
    return row["step"], row["label"], row["detail"]


def test_a_run_reads_as_its_steps() -> None:
    weights = [PullEvent("org/model", "download", done=d, total=100, files_done=0, files_total=2) for d in (10, 50, 90)]
    got = rows([
        ev.Step("image", "metrale/engine:1"),
        ev.Transfer("image", LayerProgress("metrale/engine:1", "abc", "Downloading", 5, 10)),
        ev.Step("weights", "org/model"),
        *[ev.Transfer("weights", w) for w in weights],
        ev.Transfer("weights", PullEvent("org/model", "done", 100, 100, files_done=2, files_total=2)),
        ev.Step("port", "127.0.0.1:8888"),
        ev.Step("starting", "metralectl-x"),
        ev.ContainerStarted("metralectl-x", "c0ffee", "r1"),
        ev.Phase("loading", "  loading 1234 tensors  ", 1.4),
        ev.Step("health", "GET /health: 503"),
        ev.Ready("http://127.0.0.1:8888", "m", 2.5),
    ])
    assert [shown(r) for r in got] == [
        ("check image", "checking", "metrale/engine:1"),
        ("pull image", "Downloading", "metrale/engine:1 layer abc 50 %"),
        ("check weights", "checking", "org/model"),
        ("pull weights", "downloading", "org/model 90 % · 0/2 files"),  # three progress events, one row
        ("pull weights", "verified", "org/model 100 % · 2/2 files"),
        ("check port", "checking", "127.0.0.1:8888"),
        ("start container", "creating", "metralectl-x"),
        ("start container", "started", "metralectl-x (run r1)"),
        ("wait ready", "engine loading", "loading 1234 tensors  [1.4 s]"),
        ("wait ready", "health", "GET /health: 503"),
        ("wait ready", "ready", "http://127.0.0.1:8888 (m) in 2.5 s"),
    ]
    assert not {w for r in got for w in (r["step"], r["label"])} & INTERNAL


def test_failures_and_warnings_are_shown_in_their_step() -> None:
    hostile = "<img src=x onerror=alert(1)>"
    got = rows([
        ev.Step("draining", "1 request(s) in flight"),
        ev.Warning_(f"slow drain {hostile}"),
        ev.Step("stopping", "metralectl-a"),
        ev.Failed("exited", f"the engine said {hostile}", "look at the logs"),
        ev.Step("something-new", "from a newer agent"),
    ])
    assert [shown(r) for r in got] == [
        ("drain requests", "waiting", "1 request(s) in flight"),
        ("drain requests", "warning", f"slow drain {hostile}"),  # values: the page writes them as text
        ("stop container", "stopping", "metralectl-a"),
        ("stop container", "failed (exited)", f"the engine said {hostile} — fix: look at the logs"),
        ("something-new", "", "from a newer agent"),  # an unknown step is shown by its own name
    ]
    assert got[3].get("failed") is True and got[1].get("warn") is True
