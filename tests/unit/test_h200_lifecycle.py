"""benchmarks/h200's lifecycle summarizer and checker: the numbers are read from metralectl's own records, and
the check fails loudly on a failed request, a damaged swap that did not roll back, GPU memory that did not come
back within 5 s of stop, or a missing GPU on a device run.

The fixture is a real run: lifecycle_gpu.py driving metralectl (process runtime) and CI's CPU llama-server with
make_lifecycle_models.py's tiny preset (the CPU dry run of docs/h200.md), its results folder packed as the
device run packs it. The GPU cases put NVML samples into a copy of it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "benchmarks" / "h200"
FIXTURE = Path(__file__).resolve().parent / "data" / "h200_lifecycle_cpu.tar.gz"
sys.path.insert(0, str(H200))

import lifecycle_table  # noqa: E402
import summarize_lifecycle  # noqa: E402


@pytest.fixture
def run(tmp_path: Path) -> Path:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    [found] = tmp_path.glob("*/lifecycle.json")
    return found.parent


def _check(target: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(H200 / "check_lifecycle.py"), str(target), *extra],
                          capture_output=True, text=True, timeout=60)


def _edit(run: Path, change: Any) -> None:
    life = json.loads((run / "lifecycle.json").read_text())
    change(life)
    (run / "lifecycle.json").write_text(json.dumps(life))


def _step(life: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in life["steps"] if s["name"] == name)


def _failed(out: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in out.stdout.splitlines() if line.startswith("FAIL")]


def test_the_cpu_dry_run_passes_when_no_gpu_is_allowed_and_says_there_is_none(run: Path) -> None:
    out = _check(run, "--allow-no-gpu")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ok   no GPU here, and the run says so (a dry run): no GPU:" in out.stdout
    assert out.stdout.rstrip().endswith("expectations held")


def test_without_a_gpu_a_device_run_fails(run: Path) -> None:
    out = _check(run)
    assert out.returncode == 1
    assert _failed(out) == [next(line for line in out.stdout.splitlines() if "a GPU was read (NVML)" in line)]
    assert "FAILED: 1 of" in out.stderr


def test_one_failed_request_fails_the_run_even_with_every_exit_zero(run: Path) -> None:
    life = json.loads((run / "lifecycle.json").read_text())
    bench = _step(life, "bench-b-after-rollback")
    assert bench["rc"] == 0
    [records] = run.glob(f"metrale/runs/*/{bench['json']['run_id']}/requests.jsonl")
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    measured = next(r for r in rows if r["phase"] == "measure")
    measured.update(ok=False, error="stream ended without [DONE]")
    records.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = _check(run, "--allow-no-gpu")
    assert out.returncode == 1
    [line] = _failed(out)
    assert "bench-b-after-rollback: every request ok" in line and "1 failed" in line and "[DONE]" in line


def test_a_damaged_swap_that_did_not_roll_back_fails(run: Path) -> None:
    def swapped(life: dict[str, Any]) -> None:
        step = _step(life, "swap-damaged")
        step["rc"] = 0
        step["json"]["outcome"] = "swapped"
    _edit(run, swapped)
    out = _check(run, "--allow-no-gpu")
    assert out.returncode == 1
    failed = "\n".join(_failed(out))
    assert "swap-damaged exit 1: exit 0" in failed
    assert "swap to the damaged model rolls back to B (exit 1): outcome swapped, exit 0" in failed


def test_an_engine_left_running_after_stop_fails(run: Path) -> None:
    _edit(run, lambda life: life["leftovers"].update(engine_processes=[{"pid": 4242, "exe": "/x/llama-server"}],
                                                      port_listening=True))
    failed = "\n".join(_failed(_check(run, "--allow-no-gpu")))
    assert "no engine process left after stop" in failed and "4242" in failed
    assert "nothing listens on the served port after stop" in failed


def _on_a_gpu(run: Path, back_after_stop_s: float | None) -> None:
    """The run as a GPU would have recorded it: 500 MiB idle, each model's weights held while it serves, and the
    memory back at idle `back_after_stop_s` after stop returned (None: never)."""
    life = json.loads((run / "lifecycle.json").read_text())
    idle = 500.0
    held = {name: idle + 4000.0 for name in ("run-a", "swap-b", "swap-damaged")}
    life["gpu"].update(present=True, why_not=None, name="NVIDIA H200", total_mib=143771.0, idle_mib=idle)
    for step in life["steps"]:
        step["gpu"] = {"before_mib": idle if step["name"] == "run-a" else idle + 4000.0,
                       "after_mib": held.get(step["name"], idle + 4000.0), "max_mib": None, "processes_after": []}
    stop = _step(life, "stop")
    samples = [(life["started"], idle)]
    t = _step(life, "run-a")["t_end"]
    while t < stop["t_end"]:
        samples.append((t, idle + 4000.0))
        t += 0.05
    back = None if back_after_stop_s is None else stop["t_end"] + back_after_stop_s
    t = stop["t_end"]
    while t < stop["t_end"] + 8:
        samples.append((t, idle if back is not None and t >= back else idle + 4000.0))
        t += 0.05
    (run / "gpu-samples.csv").write_text("t,used_mib\n" + "".join(f"{a:.3f},{b}\n" for a, b in samples))
    for name in ("a", "b", "damaged"):  # the tiny models' files are KB: say they were as big as what was held
        life["models"][name]["bytes"] = 4000 * 2**20
    (run / "lifecycle.json").write_text(json.dumps(life))


def _back_after_stop(line: str) -> float:
    return float(re.search(r"/ ([\d.]+) s after it returned", line).group(1))  # type: ignore[union-attr]


def test_gpu_memory_back_at_idle_within_5_s_of_stop_passes(run: Path) -> None:
    _on_a_gpu(run, back_after_stop_s=1.0)
    out = _check(run)
    assert out.returncode == 0, out.stdout
    line = next(x for x in out.stdout.splitlines() if "GPU memory back at idle" in x)
    assert line.startswith("ok") and 1.0 <= _back_after_stop(line) < 1.1, line


@pytest.mark.parametrize("back", [7.0, None])
def test_gpu_memory_not_back_within_5_s_of_stop_fails(run: Path, back: float | None) -> None:
    _on_a_gpu(run, back_after_stop_s=back)
    out = _check(run)
    assert out.returncode == 1
    [line] = _failed(out)
    assert "GPU memory back at idle (+64 MiB) within 5 s of stop" in line
    assert (7.0 <= _back_after_stop(line) < 7.1) if back else "None s after it returned" in line


def test_weights_that_never_reached_the_gpu_fail(run: Path) -> None:
    _on_a_gpu(run, back_after_stop_s=0.5)
    _edit(run, lambda life: _step(life, "swap-b")["gpu"].update(after_mib=600.0))  # 100 MiB above idle
    failed = _failed(_check(run))
    assert len(failed) == 1 and "swap-b: lc-b's weights are on the GPU" in failed[0], failed


def test_every_boot_splits_into_start_load_ready_that_add_up(run: Path) -> None:
    s = summarize_lifecycle.summarize(run, allow_no_gpu=True)
    assert [b["step"] for b in s["boots"]] == ["run-a", "swap-b", "swap-damaged"]
    for swap in s["swaps"]:
        served = swap if swap["outcome"] == "swapped" else swap["restore_split"]
        total = swap["boot_s"] if swap["outcome"] == "swapped" else swap["restore_s"]
        parts = [served["phase_start_s"], served["phase_load_s"], served["phase_ready_s"]]
        assert None not in parts and abs(sum(parts) - total) < 0.002, swap
        # downtime runs from the old engine's stop to the new (or restored) one's ready; the drain is before it
        assert abs(swap["downtime_s"] - swap["stop_s"] - swap["boot_s"] - (swap["restore_s"] or 0)) < 0.05, swap
    assert s["swaps"][1]["failure_cause"] == "corrupt-weights"
    assert [(b["step"], b["ok"], b["failed"]) for b in s["benches"]] == [
        ("bench-a", 3, 0), ("bench-b", 3, 0), ("bench-b-after-rollback", 3, 0)]


def test_the_table_of_two_runs_shows_both_values_in_each_cell(run: Path, tmp_path: Path) -> None:
    one = summarize_lifecycle.summarize(run, allow_no_gpu=True, label="run 1")
    two = json.loads(json.dumps(one))
    two["label"] = "run 2"
    two["swaps"][0]["downtime_s"] = 9.876
    text = lifecycle_table.table([one, two])
    assert text.startswith("Cells: run 1 / run 2.")
    row = next(line for line in text.splitlines() if line.startswith("| lc-a → lc-b |"))
    assert f"{one['swaps'][0]['downtime_s']:.2f} / 9.88" in row
    assert "Expectations: " in text and "FAILED" not in text


def test_the_tiny_models_are_written_verified_and_the_damaged_one_is_cut(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    hub = tmp_path / "hub"
    cmd = [sys.executable, str(H200 / "make_lifecycle_models.py"), "--hf-cache", str(hub), "--preset", "tiny", "--json"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO,
                           env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert first.returncode == 0, first.stderr
    models = json.loads(first.stdout)
    for key in ("a", "b", "damaged"):
        snap = Path(models[key]["file"]).parent
        manifest = json.loads((snap / ".metralectl-verified.json").read_text())
        assert manifest["files"] == [{"path": Path(models[key]["file"]).name, "size": models[key]["bytes"],
                                      "sha256": models[key]["sha256"], "git_oid": None}]
    assert models["damaged"]["bytes"] == models["a"]["bytes"] // 2
    assert Path(models["damaged"]["file"]).read_bytes() == Path(models["a"]["file"]).read_bytes()[:models["damaged"]["bytes"]]
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO,
                           env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert all(json.loads(again.stdout)[k].get("reused") for k in ("a", "b", "damaged")), again.stdout


def test_the_lifecycle_scripts_are_shellcheck_clean() -> None:
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck not installed")
    scripts = [H200 / "run_lifecycle_gpu.sh", H200 / "build_llama_server_cuda.sh", H200 / "fetch_llamacpp_kit.sh",
               H200 / "kit_venv.sh", H200 / "run_gateway_overhead.sh"]
    out = subprocess.run(["shellcheck", "--severity=style", *map(str, scripts)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
