"""Check what run_tfserve_bench.sh collected: every measured request succeeded, in both tools.

    python3 benchmarks/h200/check_results.py RESULTS_DIR [--expect-osl N]

An exit status of 0 from a benchmark command is not evidence: metralectl recorded "0/2 ok" with
exit 0 against transformers serve. So this reads the per-request records themselves:
  metralectl: RESULTS_DIR/metrale/runs/SUITE/RUN/requests.jsonl (the measured phase; warm-up and drain left out)
  AIPerf:     RESULTS_DIR/aiperf/*/profile_export_aiperf.json (request_count, error_summary)
prints one line per run (and a JSON summary to RESULTS_DIR/check.json), and exits 1 when a run has
no measured request or any failed one. Standard library only: it runs with the device's python3.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any


def _p50(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def check_metralectl(run_dir: Path) -> dict[str, Any]:
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines() if line.strip()]
    measured = [r for r in rows if r.get("phase") == "measure"]  # warm-up and drain filler are unmeasured
    ok = [r for r in measured if r.get("ok")]
    errors = Counter(str(r.get("error"))[:160] for r in measured if not r.get("ok"))
    return {
        "tool": "metralectl", "run": f"{run_dir.parent.name}/{run_dir.name}", "measured": len(measured),
        "ok": len(ok), "errors": dict(errors.most_common(3)),
        "finish_reasons": dict(Counter(str(r.get("finish_reason")) for r in ok)),
        "output_tokens": sorted(Counter(r.get("output_tokens") for r in ok).items(), key=lambda kv: str(kv[0]))[:6],
        "ttft_ms_p50": _p50([r["ttft_ms"] for r in ok if r.get("ttft_ms") is not None]),
        "tpot_ms_p50": _p50([r["tpot_ms"] for r in ok if r.get("tpot_ms") is not None]),
        "passed": bool(measured) and len(ok) == len(measured),
    }


def check_aiperf(export: Path, expect_osl: int | None) -> dict[str, Any]:
    d = json.loads(export.read_text())
    count = int((d.get("request_count") or {}).get("avg") or 0)
    errors = d.get("error_summary") or []
    osl = (d.get("output_sequence_length") or {}).get("avg")
    out = {
        "tool": "aiperf", "run": export.parent.name, "measured": count, "ok": count if not errors else None,
        "errors": errors[:3], "cancelled": bool(d.get("was_cancelled")), "output_tokens_avg": osl,
        "ttft_ms_p50": (d.get("time_to_first_token") or {}).get("p50"),
        "itl_ms_p50": (d.get("inter_token_latency") or {}).get("p50"),
        "output_tok_s": (d.get("output_token_throughput") or {}).get("avg"),
    }
    out["passed"] = count > 0 and not errors and not out["cancelled"]
    if expect_osl is not None and osl is not None and abs(osl - expect_osl) > 0.5:
        out["note"] = f"output length {osl} != {expect_osl} asked (EOS reached, or max_tokens not honoured)"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--expect-osl", type=int)
    args = ap.parse_args(argv)
    runs = [check_metralectl(p.parent) for p in sorted(args.results.glob("metrale/runs/*/*/requests.jsonl"))]
    runs += [check_aiperf(p, args.expect_osl) for p in sorted(args.results.glob("aiperf/*/profile_export_aiperf.json"))]
    (args.results / "check.json").write_text(json.dumps(runs, indent=1, default=str) + "\n")
    for r in runs:
        mark = "ok  " if r["passed"] else "FAIL"
        extra = {k: v for k, v in r.items() if k not in ("tool", "run", "passed", "measured", "ok")}
        print(f"{mark} {r['tool']:10} {r['run']:40} {r['ok']}/{r['measured']} ok  {json.dumps(extra, default=str)}")
    if not runs:
        print("FAIL no benchmark results found under", args.results, file=sys.stderr)
        return 1
    return 0 if all(r["passed"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
