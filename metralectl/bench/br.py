"""A run in llm-d's benchmark report format, BR v0.2 (pure).

The format: llm-d-benchmark's `llmdbenchmark/analysis/benchmark_report` (schema_v0_2.py; its JSON schema
br_v0_2_json_schema.json, pinned at commit f0dd0ba6ad5c2e44b0e1e5952fa8673089601084 and kept in
tests/unit/data/llmd_br_v0_2_schema.json, which a test validates every export against). One report per workload
stage, as llm-d writes them: a metralectl stage (a sweep's rung, a rate) is one report, `load.standardized.stage`
its index.

What maps to what (docs/bench.md, "Reports and exports"): the statistics are computed over the stage's measured,
successful requests from requests.jsonl (time_to_first_token, inter_token_latency: every gap between token events
after the first; time_per_output_token: each request's TPOT; request_latency: E2E; input/output lengths: the
server's prompt_tokens and the counted output tokens), in llm-d's units (s, s/token, count); throughput is the
stage's aggregate over its measured window (output tok/s and requests/s: one value, so mean = that value).
`requests.failures` counts the measured requests that failed. The engine is one `generic` stack component
(metralectl does not know every field llm-d's `inference_engine` kind requires, e.g. the accelerator count and
parallelism, and does not invent them).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from metralectl.bench.report import ReportRun, itl_ms, measured
from metralectl.bench.stats import percentile

VERSION = "0.2"
SCHEMA_COMMIT = "f0dd0ba6ad5c2e44b0e1e5952fa8673089601084"  # llm-d/llm-d-benchmark, br_v0_2_json_schema.json
QUANTILES = (("p0p1", 0.1), ("p1", 1), ("p5", 5), ("p10", 10), ("p25", 25), ("p50", 50), ("p75", 75), ("p90", 90),
             ("p95", 95), ("p99", 99), ("p99p9", 99.9))


def statistics(values: Sequence[float], units: str) -> dict[str, Any] | None:
    """BR's Statistics: units, mean, stddev, min, the quantiles, max; None without data."""
    data = sorted(float(v) for v in values if isinstance(v, (int, float)) and not math.isnan(float(v)))
    if not data:
        return None
    mean = sum(data) / len(data)
    out: dict[str, Any] = {"units": units, "mean": mean, "min": data[0], "max": data[-1]}
    out["stddev"] = math.sqrt(sum((v - mean) ** 2 for v in data) / (len(data) - 1)) if len(data) > 1 else 0.0
    for key, q in QUANTILES:
        out[key] = percentile(data, q)
    return out


def _single(value: Any, units: str) -> dict[str, Any] | None:
    return {"units": units, "mean": float(value)} if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _iso(text: Any) -> str | None:
    """A record's time (strftime %Y-%m-%dT%H:%M:%S%z) as RFC 3339, or None."""
    if not isinstance(text, str) or not text:
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S.%f%z"):
        try:
            return datetime.strptime(text, fmt).isoformat()
        except ValueError:
            continue
    try:
        return datetime.fromisoformat(text).isoformat()
    except ValueError:
        return None


def _cfg_id(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _length(labels: Mapping[str, Any], key: str, observed: Sequence[float]) -> dict[str, Any] | None:
    """A SequenceLength: fixed at the stage's asked length, else the observed median (distribution other)."""
    asked = labels.get(key)
    if isinstance(asked, int) and not isinstance(asked, bool) and asked >= 0:
        return {"distribution": "fixed", "value": asked}
    if observed:
        return {"distribution": "other", "value": percentile(sorted(observed), 50),
                "min": int(min(observed)), "max": max(int(max(observed)), 1)}
    return None


def stage_report(run: ReportRun, index: int, version: str) -> dict[str, Any]:
    r = run.record
    target = r.get("target") or {}
    stage = (r.get("stages") or [])[index]
    name, labels, summary = str(stage.get("name")), stage.get("labels") or {}, stage.get("summary") or {}
    ok = measured(run.requests, name)
    sent = [x for x in run.requests if x.get("stage") == name and x.get("phase") == "measure"]
    prompt = [float(x["prompt_tokens"]) for x in ok if isinstance(x.get("prompt_tokens"), (int, float))]
    output = [float(x["output_tokens"]) for x in ok if isinstance(x.get("output_tokens"), (int, float))]
    engine: dict[str, Any] = target["engine"] if isinstance(target.get("engine"), dict) else {}
    load = stage.get("load") or {}
    input_len = _length(labels, "isl", prompt) or {"distribution": "other", "value": 0}
    standardized: dict[str, Any] = {"tool": "metralectl", "tool_version": version, "source": "random",
                                    "stage": index, "input_seq_len": input_len,
                                    "output_seq_len": _length(labels, "osl", output)}
    rate, concurrency = labels.get("rate"), labels.get("concurrency", load.get("concurrency"))
    if isinstance(rate, (int, float)) and rate > 0:
        standardized["rate_qps"] = float(rate)
    if isinstance(concurrency, int) and concurrency >= 1 and not rate:
        standardized["concurrency"] = concurrency
    params = r.get("params") or {}
    component = {"metadata": {"label": "engine-0", "cfg_id": _cfg_id(target.get("serve_flags") or target.get("url")),
                              "description": f"the served endpoint {target.get('url')}"},
                 "standardized": {"kind": "generic", "tool": str(engine.get("name") or "unknown"),
                                  "tool_version": str(engine.get("version") or target.get("engine_version")
                                                      or target.get("image_revision") or "unknown"),
                                  "model": target.get("model"), "recipe": target.get("recipe"),
                                  "image": target.get("image"), "hardware_class": target.get("hardware_class")},
                 "native": {"args": target.get("serve_flags") or None}}
    latency = {"time_to_first_token": statistics([x["ttft_ms"] / 1000 for x in ok
                                                  if isinstance(x.get("ttft_ms"), (int, float))], "s"),
               "inter_token_latency": statistics([g / 1000 for x in ok for g in itl_ms(x)], "s/token"),
               "time_per_output_token": statistics([x["tpot_ms"] / 1000 for x in ok
                                                    if isinstance(x.get("tpot_ms"), (int, float))], "s/token"),
               "request_latency": statistics([x["e2e_ms"] / 1000 for x in ok
                                              if isinstance(x.get("e2e_ms"), (int, float))], "s")}
    throughput = {"output_token_rate": _single(summary.get("output_tok_s"), "tokens/s"),
                  "request_rate": _single(summary.get("requests_per_s"), "queries/s")}
    total = summary.get("requests") if isinstance(summary.get("requests"), int) else len(sent)
    failures = summary.get("errors") if isinstance(summary.get("errors"), int) else len(sent) - len(ok)
    start = _iso(r.get("started_at"))
    return {
        "version": VERSION,
        "run": {"uid": f"{run.run_id}.{index}", "eid": run.run_id, "pid": str(r.get("host") or "") or None,
                "time": {"start": start, "end": _iso(r.get("finished_at"))},
                "description": f"metralectl bench run {r.get('suite')}, stage {name} (signed record {run.run_id}; "
                               f"{run.signature})",
                "keywords": ["metralectl", str(r.get("suite"))]},
        "scenario": {"stack": [component],
                     "load": {"metadata": {"cfg_id": _cfg_id({"params": params, "stage": name})},
                              "standardized": standardized,
                              "native": {"config": {"suite": r.get("suite"), "stage": name, "labels": labels,
                                                    "params": params}}}},
        "results": {"request_performance": {"aggregate": {
            "requests": {"total": total, "failures": failures,
                         "input_length": statistics(prompt, "count"), "output_length": statistics(output, "count")},
            "latency": latency, "throughput": throughput}}},
    }


def reports(runs: Sequence[ReportRun], version: str) -> list[dict[str, Any]]:
    """One BR v0.2 report per stage of every run (a comparison has no stages of its own: none)."""
    return [stage_report(run, i, version) for run in runs if not run.is_versus
            for i in range(len(run.record.get("stages") or []))]
