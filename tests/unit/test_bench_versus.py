"""`bench versus`, its pure parts: the noise rule, the rows and table a comparison shows, its plot, and its signed
record (the runs it names by id and digest are checked by `verify`). The real engines: tests/integration/
test_bench_versus_real.py."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from metralectl.bench import signed, versus
from metralectl.peers.store import known_keys
from metralectl.present.versus_view import render_versus, svg

REPO = Path(__file__).resolve().parents[2]


def test_the_chance_of_no_overlap_is_the_exact_rank_test_at_u_zero() -> None:
    assert versus.chance(3, 3) == pytest.approx(0.1)
    assert versus.chance(5, 5) == pytest.approx(2 / 252)
    # checked against enumeration: every split of 6 distinct values into 3 + 3, how many are apart
    from itertools import combinations

    splits = list(combinations(range(6), 3))
    apart = [s for s in splits if max(s) < min(set(range(6)) - set(s)) or min(s) > max(set(range(6)) - set(s))]
    assert len(apart) / len(splits) == pytest.approx(versus.chance(3, 3))


@pytest.mark.parametrize(("a", "b", "beyond"), [
    ([10.0, 11.0, 12.0], [13.0, 14.0, 15.0], True),   # apart
    ([13.0, 14.0, 15.0], [10.0, 11.0, 12.0], True),   # apart, the other way
    ([10.0, 11.0, 13.0], [12.0, 14.0, 15.0], False),  # overlapping ranges
    ([10.0, 11.0, 12.0], [12.0, 13.0, 14.0], False),  # touching: not apart
    ([10.0], [20.0], False),                          # one run each: no spread, no verdict
    ([10.0, 10.0, 10.0], [10.0, 10.0, 10.0], False),  # identical
])
def test_beyond_noise_means_the_ranges_do_not_overlap(a: list[float], b: list[float], beyond: bool) -> None:
    assert versus.beyond_noise(a, b) is beyond


def _run(tok: float, ttft: float, itl: float, energy: Any = "unavailable: no NVIDIA driver") -> dict[str, Any]:
    return {"run_id": f"r{tok}", "suite": "decode", "status": "completed",
            "stages": [{"name": "decode", "energy": energy,
                        "summary": {"stream_tok_s": {"p50": tok}, "ttft_ms": {"p50": ttft}, "itl_ms": {"p50": itl}}}]}


def _rows() -> list[dict[str, Any]]:
    a = [_run(30.0, 50.0, 30.0), _run(31.0, 55.0, 31.0), _run(32.0, 52.0, 29.0)]
    b = [_run(60.0, 51.0, 15.0), _run(62.0, 49.0, 16.0), _run(61.0, 53.0, 14.0)]
    return versus.rows(a, b, [500.0, 510.0, 512.0], ["unavailable: the engine's processes could not be read"] * 3)


def test_rows_give_spread_difference_and_verdict_per_metric() -> None:
    rows = {r["metric"]: r for r in _rows()}
    assert list(rows) == ["tok_s", "ttft_ms", "itl_ms", "j_per_token", "peak_mem_mib"]
    tok = rows["tok_s"]
    assert tok["a"] == {"n": 3, "median": 31.0, "min": 30.0, "max": 32.0, "stdev": 1.0}
    assert tok["b"]["median"] == 61.0 and tok["relative"] == pytest.approx((61 - 31) / 31, abs=1e-4)
    assert tok["beyond_noise"] and tok["better"] == "B" and tok["p_chance"] == 0.1
    assert rows["itl_ms"]["beyond_noise"] and rows["itl_ms"]["better"] == "B"  # lower is better
    assert not rows["ttft_ms"]["beyond_noise"] and rows["ttft_ms"]["better"] is None  # 49–53 overlaps 50–55
    assert rows["j_per_token"]["missing"] == "unavailable: no NVIDIA driver" and rows["j_per_token"]["delta"] is None
    assert rows["peak_mem_mib"]["missing"].startswith("unavailable: the engine's processes")


def _doc(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": versus.KIND, "run_id": "v1", "suite": "versus", "compared_suite": "decode", "repeats": 3,
            "status": "completed", "rule": "ranges apart", "rows": rows,
            "a": {"recipe": "proc-vllm", "engine": "vllm", "model": "tiny-vllm", "runs": []},
            "b": {"recipe": "proc-llama", "engine": "llama-cpp", "model": "tiny-llama", "runs": []}}


def test_the_table_shows_median_range_and_why_a_metric_is_missing() -> None:
    text = render_versus(_doc(_rows()))
    lines = {line.split("  ")[0]: line for line in text.splitlines()}
    assert "31.0 (30.0–32.0)" in lines["tok/s"] and "61.0 (60.0–62.0)" in lines["tok/s"]
    assert "+96.8%" in lines["tok/s"] and "beyond noise, B better (chance 10%)" in lines["tok/s"]
    assert "within noise" in lines["TTFT p50 (ms)"]
    assert "– unavailable: no NVIDIA driver" in lines["J/token"]
    assert text.startswith("A proc-vllm  engine vllm") and "\nB proc-llama  engine llama-cpp" in text


def test_the_plot_is_svg_with_a_panel_per_metric_measured_on_both_sides() -> None:
    root = ET.fromstring(svg(_doc(_rows())))
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert sum("—" in t for t in texts) == 3  # tok/s, TTFT, ITL: J/token and memory were not measured
    assert sum(1 for _ in root.iter("{http://www.w3.org/2000/svg}circle")) == 3 * 3 * 2  # every run a dot
    hostile = _doc(_rows())
    hostile["a"]["recipe"] = "<script>&"
    ET.fromstring(svg(hostile))  # a recipe name is text, never markup


def _signed_comparison(home: Path) -> Path:
    runs = []
    for side, run_id in (("a", "ra"), ("b", "rb")):
        directory = home / "runs" / "decode" / run_id
        directory.mkdir(parents=True)
        record = {**_run(30.0, 50.0, 30.0), "run_id": run_id, "requests_file": "requests.jsonl"}
        (directory / "run.json").write_text(json.dumps(record))
        (directory / "requests.jsonl").write_text("{}\n")
        assert signed.sign_run(directory, record) is None
        runs.append((side, versus.reference(record, directory)))
    doc = _doc(_rows())
    for side, ref in runs:
        doc[side]["runs"] = [ref]
    directory = home / "runs" / "versus" / "v1"
    directory.mkdir(parents=True)
    (directory / "run.json").write_text(json.dumps(doc))
    assert signed.sign_run(directory, doc) is None
    return directory


def test_a_comparison_verifies_only_with_the_runs_it_names_unchanged(tmp_path: Path) -> None:
    directory = _signed_comparison(tmp_path)
    verdict = signed.verify_record(directory, known_keys())
    assert verdict.ok, verdict.reason
    run_b = tmp_path / "runs" / "decode" / "rb" / "run.json"
    run_b.write_text(run_b.read_text().replace("30.0", "99.0"))
    verdict = signed.verify_record(directory, known_keys())
    assert not verdict.ok and "side B's record rb changed after the comparison was signed" in verdict.reason
    run_b.unlink()
    verdict = signed.verify_record(directory, known_keys())
    assert not verdict.ok and "side B's record rb is missing" in verdict.reason


def test_show_and_verify_read_a_comparison(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _signed_comparison(home)
    env = {**os.environ, "METRALE_HOME": str(home), "NO_COLOR": "1"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, env=env,
                              cwd=REPO, timeout=120)

    shown = cli("bench", "show", "v1")
    assert shown.returncode == 0, shown.stderr
    assert "beyond noise, B better" in shown.stdout and "A proc-vllm" in shown.stdout
    as_json = json.loads(cli("bench", "show", "v1", "--json").stdout)
    assert as_json["kind"] == versus.KIND and len(as_json["rows"]) == 5
    history = cli("bench", "history")
    assert history.returncode == 0 and "versus decode" in history.stdout and "proc-vllm vs proc-llama" in history.stdout
    ok = cli("bench", "verify", "v1")
    assert ok.returncode == 0 and "every benchmark record the comparison names" in ok.stdout, ok.stdout + ok.stderr
    (home / "runs" / "decode" / "ra" / "run.json").write_text("{}")
    bad = cli("verify", "v1")
    assert bad.returncode == 1 and "side A's record ra changed" in bad.stderr and "Traceback" not in bad.stderr


def test_stdev_is_the_sample_stdev() -> None:
    assert versus.spread([1.0, 2.0, 3.0, 4.0])["stdev"] == pytest.approx(round(math.sqrt(5 / 3), 4))
    assert versus.spread([1.0, 2.0, 3.0, 4.0])["median"] == 2.5


def test_peak_memory_sums_each_process_high_water_mark(tmp_path: Path) -> None:
    from metralectl.seams.machine import peak_rss_mib

    for pid, hwm in ((10, "VmHWM:\t  204800 kB"), (11, "VmHWM:\t   51200 kB")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "status").write_text(f"Name:\tengine\nVmRSS:\t 1 kB\n{hwm}\n")
    assert peak_rss_mib([10, 11, 12], proc=tmp_path) == 250.0  # 12: gone meanwhile, skipped
    assert peak_rss_mib([12], proc=tmp_path) is None
    assert peak_rss_mib([os.getpid()]) > 0  # the real /proc


@pytest.mark.parametrize(("args", "said"), [
    (["nope", "other"], "no recipe named 'nope'"),
    (["a", "a"], "a against itself: give two recipes"),
    (["a", "b", "--plot", "/nonexistent-dir/v.svg"], "--plot /nonexistent-dir/v.svg: no directory"),
    (["a", "b", "-p", "nope=1"], "nope"),
])
def test_bad_input_is_a_usage_error_before_anything_starts(tmp_path: Path, args: list[str], said: str) -> None:
    env = {**os.environ, "METRALECTL_CONFIG_DIR": str(tmp_path / "config"), "METRALE_HOME": str(tmp_path / "home"),
           "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    out = subprocess.run([sys.executable, "-m", "metralectl", "bench", "versus", *args], capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=120)
    assert out.returncode == 64 and said in out.stderr and not out.stdout, out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "home" / "runs").exists()
