"""Boil down what run_llamacpp_cuda.sh collected into one small JSON document (stdout).

    python3 benchmarks/h200/summarize_llamacpp.py RESULTS_DIR > summary.json

Per bench stage: status, requests ok/measured, output tok/s, TTFT, ITL, TPOT, E2E, J per output token
(metralectl's own NVML energy window), prompt-length check and retries. For `top`: which of the
engine fields it showed had a value over the run (the rest stayed null), beside the `llamacpp:` series
the server's /metrics offered. Standard library only: it runs with the device's python3.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any


def _stat(summary: dict[str, Any], name: str, *quantiles: str) -> dict[str, Any]:
    block = summary.get(name) or {}
    return {q: block.get(q) for q in quantiles}


def bench_runs(res: Path) -> list[dict[str, Any]]:
    runs = []
    for out in sorted(res.glob("mctl-*.out")) + sorted(res.glob("load-for-top.out")):
        text = out.read_text().strip()
        if not text:
            runs.append({"file": out.name, "status": "no record on stdout"})
            continue
        record = json.loads(text)
        stages = []
        for stage in record.get("stages") or []:
            s = stage.get("summary") or {}
            energy = stage.get("energy")
            stages.append({
                "stage": stage.get("name"), "ok": s.get("ok"), "requests": s.get("requests"), "errors": s.get("errors"),
                "error_kinds": s.get("error_kinds"), "aborted": stage.get("aborted"),
                "output_tok_s": s.get("output_tok_s"), "requests_per_s": s.get("requests_per_s"),
                "stream_tok_s": _stat(s, "stream_tok_s", "p50"),
                "ttft_ms": _stat(s, "ttft_ms", "p50", "p95", "p99"),
                "itl_ms": _stat(s, "itl_ms", "p50", "p95", "p99"),
                "tpot_ms": _stat(s, "tpot_ms", "p50", "p95"),
                "e2e_ms": _stat(s, "e2e_ms", "p50", "p95"),
                "output_tokens": s.get("output_tokens"),
                "prompt_tokens_checked": s.get("prompt_tokens_checked"),
                "prompt_tokens_mismatch": s.get("prompt_tokens_mismatch"),
                "short_outputs": s.get("short_outputs"), "retried": s.get("retried"),
                "count_methods": s.get("count_methods"),
                "stamp_error_ms_p99": (s.get("stamp_error_ms") or {}).get("p99"),
                "client_bound": stage.get("client_bound"),
                "energy": ({k: energy.get(k) for k in ("j_per_output_token", "method", "scope", "joules", "mean_w",
                                                       "span_s", "flags") if k in energy}
                           if isinstance(energy, dict) else energy),
            })
        runs.append({"file": out.name, "suite": record.get("suite"), "run_id": record.get("run_id"),
                     "status": record.get("status"), "exit_code": record.get("exit_code"),
                     "prompt_sizing": record.get("prompt_sizing"), "headline": _headline(record),
                     "stages": stages})
    return runs


def _headline(record: dict[str, Any]) -> dict[str, Any]:
    head = (record.get("summary") or {}).get("headline") or {}
    if record.get("suite") == "concurrency-sweep":
        return {}  # the stages above say it all, per rung
    return head


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else k, v, out)
    else:
        out[prefix] = value


def top_fields(res: Path) -> dict[str, Any]:
    docs = []
    jsonl = res / "top.jsonl"
    if jsonl.exists():
        docs += [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    once = res / "top-once.out"
    if once.exists() and once.read_text().strip():
        docs.append(json.loads(once.read_text()))
    valued: dict[str, Any] = {}
    seen: set[str] = set()
    gpu_fields: dict[str, Any] = {}
    for doc in docs:
        for engine in doc.get("engines") or []:
            flat: dict[str, Any] = {}
            _flatten("", {k: v for k, v in engine.items() if k not in ("url", "source", "name", "recipe")}, flat)
            for key, value in flat.items():
                seen.add(key)
                if value not in (None, {}, []) and key not in ("state", "error"):
                    valued.setdefault(key, value)
        for gpu in doc.get("gpus") or []:
            for key in ("name", "power_w", "power_source", "energy_rate_w", "energy_rate_method", "util_gpu_pct",
                        "clock_sm_mhz", "temp_gpu_c", "memory_used_mib"):
                if gpu.get(key) is not None:
                    gpu_fields.setdefault(key, gpu[key])
    states = sorted({e.get("state") for d in docs for e in d.get("engines") or []} - {None})
    metrics = res / "metrics.txt"
    series = sorted(set(re.findall(r"^(llamacpp:[a-z_]+)", metrics.read_text(), re.M))) if metrics.exists() else []
    # a block that was null in one snapshot (`window` before the second scrape) and had values in another
    null = {k for k in seen - set(valued) - {"state", "error"} if not any(v.startswith(k + ".") for v in valued)}
    return {"snapshots": len(docs), "engine_states": states,
            "engine_fields_with_a_value": valued, "engine_fields_always_null": sorted(null),
            "gpu_fields_seen": gpu_fields, "server_llamacpp_series": series}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    res = Path(argv[0])
    summary: dict[str, Any] = {"bench": bench_runs(res), "top": top_fields(res)}
    for name in ("build-info.txt", "environment.txt", "server-command.txt", "metralectl-version.txt"):
        path = res / name
        if path.exists():
            summary[name.rsplit(".", 1)[0].replace("-", "_")] = path.read_text().strip().splitlines()
    model = res / "model.json"
    if model.exists():
        summary["model"] = {k: v for k, v in json.loads(model.read_text()).items() if k != "file"}
    check = res / "check.json"
    if check.exists():
        summary["check"] = [{k: r.get(k) for k in ("run", "measured", "ok", "passed", "errors")}
                            for r in json.loads(check.read_text())]
    print(json.dumps(summary, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
