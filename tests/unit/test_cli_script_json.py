"""Script-facing output: `ps` memory per model (measured, estimated or unknown, never invented), `ps --json`'s
last swap as fields, `stop --json` with nothing to stop, `bench ... --json` as `--format json`."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest

from metralectl.app.serving import Stopped
from metralectl.cli import ps_report
from metralectl.cli.serve_cmds import _print_stopped
from metralectl.lifecycle import ps_memory
from metralectl.lifecycle.status import Serving, StatusReport, collect
from metralectl.lifecycle.stop import StopResult
from metralectl.lifecycle.swap_journal import swaps_path
from metralectl.seams import store
from metralectl.seams.gpu import NvmlProbe
from tests.fakes.runtime import FakeRuntime
from tests.unit import fake_pynvml as fk
from tests.unit.recipe_helpers import REPO

ROW = Serving(recipe="qwen3.5-35b-a3b", name="metralectl-a", owner="me", state="running", health="ok", uptime="5m",
              uptime_s=300.0, endpoint="http://127.0.0.1:8888", run_id="r1", image="img", image_revision="abc")
PIDS = {"metralectl-a": {4242, 4243}, "metralectl-b": {5000}, "metralectl-c": {6000}}


def probe(*procs: tuple[int, int | None]) -> Any:
    return lambda: NvmlProbe(nvml=fk.make_fake([fk.gb10(compute_procs=list(procs))]))


def test_memory_is_what_the_containers_processes_hold_through_nvml() -> None:
    found = ps_memory.measured_bytes(PIDS, lambda name: PIDS[name],
                                     probe((4242, 30 * fk.GiB), (4243, 2 * fk.GiB), (999, 50 * fk.GiB), (6000, None)))
    # b has no process on the GPU, c one whose memory the driver would not give: neither is measured
    assert found == {"metralectl-a": 32 * fk.GiB}


def test_an_engine_over_two_gpus_is_its_sum_for_ps_and_its_busiest_gpu_for_the_budget() -> None:
    h200 = lambda i, procs: fk.FakeDevice(uuid=f"GPU-{i}", bus_id=f"00000000:1{i}:00.0", compute_procs=procs)  # noqa: E731
    devices = [h200(0, [(4242, 70 * fk.GiB), (5000, 20 * fk.GiB)]), h200(1, [(4243, 60 * fk.GiB)])]
    two = lambda: NvmlProbe(nvml=fk.make_fake(devices))  # noqa: E731
    assert ps_memory.measured_bytes(PIDS, lambda name: PIDS[name], two) == {"metralectl-a": 130 * fk.GiB,
                                                                          "metralectl-b": 20 * fk.GiB}
    assert ps_memory.measured_bytes(PIDS, lambda name: PIDS[name], two, busiest_gpu=True) == {
        "metralectl-a": 70 * fk.GiB, "metralectl-b": 20 * fk.GiB}


def test_no_nvml_measures_nothing() -> None:
    none = lambda: NvmlProbe(nvml=fk.make_fake([], init_error=fk.LibraryNotFound))  # noqa: E731
    assert ps_memory.measured_bytes(PIDS, lambda name: PIDS[name], none) == {}


def test_each_model_is_measured_else_estimated_else_unknown() -> None:
    rows = [ROW, replace(ROW, name="metralectl-b", recipe="gemma"), replace(ROW, name="metralectl-c", recipe="odd"),
            replace(ROW, rank=1, node="tcp://10.0.0.2:2376")]  # another node's rank, named as a local container
    memory = ps_memory.per_model(rows, {"metralectl-a": 41_234_000_000}, {"qwen3.5-35b-a3b": 40.0, "gemma": 18.5,
                                                                          "odd": None})
    assert memory == [(41.2, "nvml"), (18.5, "estimate"), (None, None), (40.0, "estimate")]
    assert [ps_memory.label(*m) for m in memory] == ["41.2", "18.5 est.", "?", "40.0 est."]


def _report(**kw: Any) -> StatusReport:
    return StatusReport([ROW, replace(ROW, name="metralectl-b", recipe="gemma")], **kw)


MEMORY: list[tuple[float | None, str | None]] = [(41.2, "nvml"), (18.5, "estimate")]


def test_ps_table_has_a_memory_column_and_says_what_an_estimate_is(capsys: pytest.CaptureFixture[str]) -> None:
    ps_report.show(_report(), as_json=False, memory=MEMORY)
    out, err = capsys.readouterr()
    header, first, second = out.splitlines()
    assert header.split()[:8] == ["RECIPE", "ENGINE", "CONTAINER", "OWNER", "STATE", "HEALTH", "UPTIME", "MEM"]
    assert " 41.2 " in first and "18.5 est." in second
    assert "`est.` is the recipe's estimate" in err


def test_ps_says_which_engine_runs_as_a_host_process(capsys: pytest.CaptureFixture[str]) -> None:
    from metralectl.lifecycle.local_runtime import PROCESS_IMAGE_PREFIX

    report = StatusReport([ROW, replace(ROW, name="metralectl-b", recipe="gemma", image_revision=None,
                                        image=f"{PROCESS_IMAGE_PREFIX}llama-server")])
    ps_report.show(report, as_json=False, memory=MEMORY)
    _, first, second = capsys.readouterr().out.splitlines()
    assert first.rstrip().endswith(" abc") and second.rstrip().endswith(" process")
    ps_report.show(report, as_json=True, memory=MEMORY)
    assert [s["runtime"] for s in json.loads(capsys.readouterr().out)["serving"]] == ["docker", "process"]


def test_ps_json_gives_memory_and_its_source(capsys: pytest.CaptureFixture[str]) -> None:
    ps_report.show(_report(), as_json=True, memory=[(41.2, "nvml"), (None, None)])
    serving = json.loads(capsys.readouterr().out)["serving"]
    assert [(s["memory_gb"], s["memory_source"]) for s in serving] == [(41.2, "nvml"), (None, None)]


def test_last_swap_is_a_structure_in_json_and_the_same_sentence_in_text(capsys: pytest.CaptureFixture[str]) -> None:
    store.append_jsonl(swaps_path(), {"from_recipe": "old", "to_recipe": "new", "outcome": "rolled-back",
                                      "downtime_s": 41.04, "phases": {"drain": 0.5, "stop": 2.0, "boot": 38.54},
                                      "message": "new did not become ready", "url": "u", "model": None,
                                      "at": 1764600000.0})
    report = collect(FakeRuntime())
    assert report.last_swap == "old → new: rolled-back, downtime 41.0 s (boot 38.5 s, drain 0.5 s, stop 2.0 s)"  # the journal keeps keys sorted
    ps_report.show(report, as_json=True, memory=[])
    assert json.loads(capsys.readouterr().out)["last_swap"] == {
        "from": "old", "to": "new", "outcome": "rolled-back", "downtime_s": 41.04,
        "phases": {"drain": 0.5, "stop": 2.0, "boot": 38.54}, "at": 1764600000.0,
        "message": "new did not become ready"}
    ps_report.show(report, as_json=False, memory=[])
    assert capsys.readouterr().err.splitlines()[-1] == f"last swap: {report.last_swap}"


def test_no_swap_recorded_is_null() -> None:
    assert collect(FakeRuntime()).to_json()["last_swap"] is None


def test_stop_json_is_a_list_whether_or_not_anything_stopped(capsys: pytest.CaptureFixture[str]) -> None:
    _print_stopped(Stopped(), as_json=True)
    out, err = capsys.readouterr()
    assert json.loads(out) == [] and "nothing to stop" in err
    _print_stopped(Stopped(containers=(StopResult("metralectl-a", "x", 0, False, True, 1.5, "returned"),)), True)
    stopped = json.loads(capsys.readouterr().out)
    assert isinstance(stopped, list) and stopped[0]["name"] == "metralectl-a"
    _print_stopped(Stopped(), as_json=False)
    assert capsys.readouterr().out == ""  # the text view: nothing on stdout, the note on stderr


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120)


@pytest.mark.parametrize("argv", [["bench", "list"], ["bench", "list", "decode"], ["bench", "history"]])
def test_bench_json_is_format_json(argv: list[str]) -> None:
    spelled = cli(*argv, "--format", "json")
    short = cli(*argv, "--json")
    assert spelled.returncode == short.returncode == 0, short.stderr
    assert short.stdout == spelled.stdout and json.loads(short.stdout) is not None
    assert cli(*argv).stdout != spelled.stdout  # the default is still text


def test_ps_says_which_gpus_each_engine_was_placed_on(capsys: pytest.CaptureFixture[str]) -> None:
    report = StatusReport([replace(ROW, gpu_ids=(1, 3)), replace(ROW, name="metralectl-b", recipe="gemma")])
    ps_report.show(report, as_json=False, memory=MEMORY)
    header, first, second = capsys.readouterr().out.splitlines()
    names = header.split()
    assert names[names.index("GPUS") + 1] == "ENDPOINT", header
    assert " 1,3 " in first and " - " in second
    ps_report.show(report, as_json=True, memory=MEMORY)
    assert [s["gpu_ids"] for s in json.loads(capsys.readouterr().out)["serving"]] == [[1, 3], None]
    ps_report.show(_report(), as_json=False, memory=MEMORY)  # nothing placed (a box of one GPU): no column
    assert "GPUS" not in capsys.readouterr().out


def test_ps_reads_a_gpu_ids_label_strictly() -> None:
    from metralectl.core.labels import LABEL_GPU_IDS
    from metralectl.lifecycle.status import _placed

    assert _placed({LABEL_GPU_IDS: "0,5"}) == (0, 5)
    for hostile in ("1;rm -rf /", "\x1b[31m1", "1,1", "-1", "1,", "", "9" * 300):
        assert _placed({LABEL_GPU_IDS: hostile}) is None, hostile
    assert _placed({}) is None
