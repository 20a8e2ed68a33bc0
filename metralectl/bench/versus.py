"""`bench versus`: two recipes' runs of one suite side by side, and whether each difference is beyond noise (pure).

The noise rule (docs/bench.md, "One model, two engines"): a difference is beyond run-to-run noise when the two
sides' ranges over their repeats (min–max) do not overlap. That is the exact two-sided rank test at U = 0: when
both sides draw from one distribution, all of one side's runs fall beyond all of the other's with probability
2 / C(nA + nB, nA) — 10 % at 3 + 3, 2.9 % at 4 + 4, 0.8 % at 5 + 5 — and each row carries that number (`p_chance`).
Equal ranges, a single repeat, or a metric missing on either side: never "beyond noise".

The comparison record (kind KIND, under $METRALE_HOME/runs/versus/<id>/run.json) names every benchmark record
it was made from by run id and the sha256 of its run.json; it is signed as a run record is (bench/signed.py),
and `verify` checks those digests too (`check_references`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

KIND = "metralectl-bench-versus"
SUITE_DIR = "versus"  # the comparisons' directory under runs/, beside the suites'

# (key, label, unit, higher is better, where in a stage's record)
METRICS: tuple[tuple[str, str, str, bool], ...] = (
    ("tok_s", "tok/s", "tok/s", True),
    ("ttft_ms", "TTFT p50", "ms", False),
    ("itl_ms", "ITL p50", "ms", False),
    ("j_per_token", "J/token", "J", False),
    ("peak_mem_mib", "peak memory", "MiB", False),
)


def chance(n_a: int, n_b: int) -> float:
    """The probability that two samples of one distribution, of n_a and n_b runs, do not overlap at all."""
    return 2.0 / math.comb(n_a + n_b, n_a)


def beyond_noise(a: Sequence[float], b: Sequence[float]) -> bool:
    """True when the ranges do not overlap (every run of one side beyond every run of the other)."""
    if len(a) < 2 or len(b) < 2:
        return False  # one run says nothing about run-to-run noise
    return max(a) < min(b) or max(b) < min(a)


def spread(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "median": None, "min": None, "max": None, "stdev": None}
    ordered = sorted(values)
    n = len(ordered)
    mid = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    mean = sum(ordered) / n
    stdev = math.sqrt(sum((v - mean) ** 2 for v in ordered) / (n - 1)) if n > 1 else None
    return {"n": n, "median": round(mid, 4), "min": round(ordered[0], 4), "max": round(ordered[-1], 4),
            "stdev": None if stdev is None else round(stdev, 4)}


def stage_values(record: Mapping[str, Any]) -> dict[str, dict[str, float | str | None]]:
    """Per stage of one run: each metric's value, or for J/token the reason it is missing."""
    out: dict[str, dict[str, float | str | None]] = {}
    for stage in record.get("stages") or []:
        summary = stage.get("summary") or {}
        energy = stage.get("energy")
        out[str(stage.get("name"))] = {
            "tok_s": (summary.get("stream_tok_s") or {}).get("p50"),
            "ttft_ms": (summary.get("ttft_ms") or {}).get("p50"),
            "itl_ms": (summary.get("itl_ms") or {}).get("p50"),
            "j_per_token": energy.get("j_per_output_token") if isinstance(energy, dict)
            else (str(energy) if energy else "unavailable: not measured"),
        }
    return out


def rows(a_runs: Sequence[Mapping[str, Any]], b_runs: Sequence[Mapping[str, Any]],
         a_mem: Sequence[float | str | None], b_mem: Sequence[float | str | None]) -> list[dict[str, Any]]:
    """One row per (stage, metric): each side's values and spread, the difference, and the noise verdict.
    `*_mem`: each run's peak memory in MiB, or why there is none."""
    a_vals = [stage_values(r) for r in a_runs]
    b_vals = [stage_values(r) for r in b_runs]
    stages = list(dict.fromkeys(name for v in [*a_vals, *b_vals] for name in v))
    out = []
    for stage in stages:
        for key, label, unit, higher in METRICS:
            if key == "peak_mem_mib":
                if stage != stages[0]:
                    continue  # one engine, one memory peak: not per stage
                sa, sb = list(a_mem), list(b_mem)
            else:
                sa = [v.get(stage, {}).get(key) for v in a_vals]
                sb = [v.get(stage, {}).get(key) for v in b_vals]
            out.append(_row(stage, key, label, unit, higher, sa, sb))
    return out


def _row(stage: str, key: str, label: str, unit: str, higher: bool, sa: list[Any], sb: list[Any]) -> dict[str, Any]:
    na = [float(v) for v in sa if isinstance(v, (int, float)) and not isinstance(v, bool)]
    nb = [float(v) for v in sb if isinstance(v, (int, float)) and not isinstance(v, bool)]
    why = next((str(v) for v in [*sa, *sb] if isinstance(v, str)), None)
    complete = len(na) == len(sa) and len(nb) == len(sb) and na and nb
    row: dict[str, Any] = {"stage": stage, "metric": key, "label": label, "unit": unit, "higher_is_better": higher,
                           "a": spread(na), "b": spread(nb), "a_values": na, "b_values": nb,
                           "missing": None if complete else (why or "not measured in every run")}
    if complete:
        ma, mb = row["a"]["median"], row["b"]["median"]
        row["delta"] = round(mb - ma, 4)
        row["relative"] = round((mb - ma) / abs(ma), 4) if ma else None
        row["beyond_noise"] = beyond_noise(na, nb)
        row["p_chance"] = round(chance(len(na), len(nb)), 4)
        row["better"] = None if not row["beyond_noise"] else ("B" if (mb > ma) == higher else "A")
    else:
        row.update({"delta": None, "relative": None, "beyond_noise": False, "p_chance": None, "better": None})
    return row


def digest(run_json: Path) -> str:
    from metralectl.filecap import RECORD_LIMIT, read_bytes

    return hashlib.sha256(read_bytes(run_json, RECORD_LIMIT, "run record")).hexdigest()


def reference(record: Mapping[str, Any], directory: Path) -> dict[str, Any]:
    """What the comparison keeps of one benchmark record: its id, suite, status and the digest of its run.json."""
    return {"run_id": record.get("run_id"), "suite": record.get("suite"), "status": record.get("status"),
            "sha256": digest(directory / "run.json")}


def check_references(record: Mapping[str, Any], runs_root: Path) -> str | None:
    """None when every benchmark record the comparison names is there with the digest it names; else why not."""
    for side in ("a", "b"):
        for ref in (record.get(side) or {}).get("runs") or []:
            run_id, suite = str(ref.get("run_id") or ""), str(ref.get("suite") or "")
            if not run_id or "/" in run_id or "/" in suite or run_id.startswith(".") or suite.startswith("."):
                return f"side {side.upper()} names a run {run_id!r} that is not a run id"
            path = runs_root / suite / run_id / "run.json"
            if not path.is_file():
                return f"side {side.upper()}'s record {run_id} is missing ({path})"
            if digest(path) != ref.get("sha256"):
                return f"side {side.upper()}'s record {run_id} changed after the comparison was signed"
    return None
