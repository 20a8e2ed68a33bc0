"""What benchmarks/aiperf_rate_side_by_side.py reads from each tool's records, and the agreement table it writes.

Both tools' per-request records are read, not only their headlines: the requests each counted (ok / failed / sent
again), the prompt tokens the server counted for each (usage.prompt_tokens), and one throughput computed the same
way for both — every measured request's output tokens over (last end − first send), AIPerf's own definition — next
to each tool's headline (metralectl: tokens that arrived inside its measured window, the load kept on around it).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any


def _q(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (k - lo)


def aiperf_result(out: Path) -> dict[str, Any]:
    doc = json.loads((out / "profile_export_aiperf.json").read_text())
    recs = [json.loads(x) for x in (out / "profile_export.jsonl").read_text().splitlines() if x.strip()]
    recs = [r for r in recs if (r.get("metadata") or {}).get("benchmark_phase", "profiling") == "profiling"]
    bad = [r for r in recs if r.get("error")]
    good = [r for r in recs if not r.get("error")]

    def metric(r: dict[str, Any], k: str) -> Any:
        return ((r.get("metrics") or {}).get(k) or {}).get("value")

    starts = [r["metadata"]["request_start_ns"] for r in good]
    ends = [r["metadata"]["request_end_ns"] for r in good]
    tokens = sum(metric(r, "output_sequence_length") or 0 for r in good)
    span_s = (max(ends) - min(starts)) / 1e9 if good else 0.0
    errors: dict[str, int] = {}
    for r in bad:
        e = r["error"]
        said = (e.get("type") or "") + ": " + str(e.get("message") or "")[:120] if isinstance(e, dict) else str(e)[:120]
        errors[said] = errors.get(said, 0) + 1
    for e in ([] if bad else doc.get("error_summary") or []):  # errors it counted without a per-request record
        d = e.get("error_details") or {}
        errors[f"{d.get('type') or ''}: {str(d.get('message') or '')[:120]}"] = int(e.get("count") or 0)
    ttft = [metric(r, "time_to_first_token") for r in good if metric(r, "time_to_first_token") is not None]
    itl = [metric(r, "inter_token_latency") for r in good if metric(r, "inter_token_latency") is not None]
    return {
        "tok_s": (doc.get("output_token_throughput") or {}).get("avg"),
        "same_def_tok_s": tokens / span_s if span_s > 0 else None,
        "ttft_p50": (doc.get("time_to_first_token") or {}).get("p50", _q(ttft, 0.5)),
        "ttft_p99": (doc.get("time_to_first_token") or {}).get("p99", _q(ttft, 0.99)),
        "itl_p50": (doc.get("inter_token_latency") or {}).get("p50", _q(itl, 0.5)),
        "requests": len(recs), "ok": len(good), "failed": len(bad) or sum(errors.values()), "retried": None,
        "error_kinds": errors, "prompt_tokens": [metric(r, "usage_prompt_tokens") or metric(r, "input_sequence_length")
                                                 for r in good],
        "send_span_s": (max(starts) - min(starts)) / 1e9 if len(starts) > 1 else None,
        # requests answered per second, failed ones included (an error is an answer too: saturation is about load)
        "output_tokens": tokens, "achieved_rps": len(recs) / span_s if span_s > 0 else None,
        "duration_s": (doc.get("benchmark_duration") or {}).get("avg"),
    }


def metralectl_result(doc: dict[str, Any], lines: list[dict[str, Any]], rc: int) -> dict[str, Any]:
    if doc.get("params", {}).get("rates") == "auto":
        return {"rates": [s["labels"]["rate"] for s in doc["stages"]], "saturation": doc["summary"].get("saturation"),
                "status": doc["status"], "rc": rc}
    s = doc["stages"][0]["summary"]
    measured = [r for r in lines if r.get("phase") == "measure"]
    good = [r for r in measured if r.get("ok")]
    span_s = ((max(r["t_send_us"] + r["e2e_ms"] * 1e3 for r in good) - min(r["t_send_us"] for r in good)) / 1e6
              if good else 0.0)
    tokens = sum(r["output_tokens"] or 0 for r in good)
    return {
        "tok_s": s.get("output_tok_s"), "same_def_tok_s": tokens / span_s if span_s > 0 else None,
        "ttft_p50": (s.get("ttft_ms") or {}).get("p50"), "ttft_p99": (s.get("ttft_ms") or {}).get("p99"),
        "itl_p50": (s.get("itl_ms") or {}).get("p50"),
        "requests": s.get("requests"), "ok": s.get("ok"), "failed": s.get("errors"), "retried": s.get("retried"),
        "error_kinds": s.get("error_kinds") or {}, "prompt_tokens": [r.get("prompt_tokens") for r in good],
        "output_tokens": tokens, "achieved_rps": len(measured) / span_s if span_s > 0 else None,
        "send_span_s": ((max(r["t_send_us"] for r in good) - min(r["t_send_us"] for r in good)) / 1e6
                        if len(good) > 1 else None),
        "status": doc.get("status"), "rc": rc, "error": doc.get("error"),
    }


def agreement(row: dict[str, Any], tol: float) -> dict[str, Any]:
    m, a, rate = row["metralectl"], row["aiperf"], row["rate"]
    if "run_failed" in m or "run_failed" in a:
        return {"complete": False, "ratio": None, "same_def_ratio": None, "agree": False,
                "why": "a tool did not run: " + "; ".join(x["run_failed"] for x in (m, a) if "run_failed" in x)[:300]}
    complete = (m["failed"] == 0 and a["failed"] == 0 and m["ok"] == m["requests"] > 0 and a["ok"] == a["requests"] > 0
                and m["rc"] == 0)
    ratio = m["tok_s"] / a["tok_s"] if m["tok_s"] and a["tok_s"] else None
    same = m["same_def_tok_s"] / a["same_def_tok_s"] if m["same_def_tok_s"] and a["same_def_tok_s"] else None
    agree = ratio is not None and abs(ratio - 1) <= tol
    why: list[str] = []
    if a["failed"]:
        kinds = "; ".join(f"{n}× {k}" for k, n in a["error_kinds"].items())
        why.append(f"AIPerf counted {a['failed']} of {a['requests']} requests failed ({kinds}) and leaves them out of "
                   f"its numbers")
    if m["failed"]:
        why.append(f"metralectl counted {m['failed']} failed ({m['error_kinds']})")
    if m.get("retried"):
        why.append(f"metralectl sent {m['retried']} again on a fresh connection after llama-server closed a kept-alive "
                   f"one, counted ok and said (AIPerf counts that close as an error)")
    mp, ap = sorted(set(m["prompt_tokens"])), sorted(set(a["prompt_tokens"]))
    if mp and ap and abs(statistics.median(mp) - statistics.median(ap)) > 1:
        why.append(f"the prompts differ on the server: {mp} vs {ap} tokens")
    late = []
    for name, t in (("metralectl", m), ("AIPerf", a)):
        asked = (t["ok"] - 1) / rate if t["ok"] > 1 else None
        if asked and t.get("send_span_s") and t["send_span_s"] > 1.15 * asked + 0.05:
            late.append(name)
            why.append(f"{name} sent late: its {t['ok']} requests went out over {t['send_span_s']:.2f} s where "
                       f"{rate:g}/s asks {asked:.2f} s (the client, not the server: a busy machine)")
    done_rps = min(x for x in (m["achieved_rps"], a["achieved_rps"]) if x) if m["achieved_rps"] and a["achieved_rps"] else None
    if done_rps and done_rps < 0.9 * rate and not late:
        why.append(f"past saturation (the server completed ~{done_rps:.2f} of the {rate:g}/s offered): AIPerf's "
                   f"throughput runs from its first send to its last answer, the queue's drain included with no load "
                   f"after it; metralectl counts the tokens that arrive inside its window with the load kept on")
    if not agree and same is not None and abs(same - 1) <= tol:
        why.append(f"computed the same way (output tokens / (last end − first send)) they agree ({same:.3f}): the gap "
                   f"is the definition, not the measurement")
    if not agree and not why:
        why.append("no cause found in the records: the server's own speed between the two tools' turns (a shared, "
                   "small machine) is the likeliest")
    return {"complete": complete, "ratio": ratio, "same_def_ratio": same, "agree": agree,
            "why": "; ".join(why)}


def _f(x: Any, nd: int = 1) -> str:
    return "–" if x is None else f"{x:.{nd}f}"


def row_line(r: dict[str, Any]) -> str:
    m, a = r["metralectl"], r["aiperf"]
    return (f"rate {r['rate']:g}/s: metralectl {_f(m.get('tok_s'))} tok/s, AIPerf {_f(a.get('tok_s'))} tok/s, "
            f"ratio {_f(r['ratio'], 3)}, {'agree' if r['agree'] else 'differ'}")


def _pt(xs: list[Any]) -> str:
    return ",".join(str(x) for x in sorted(set(xs))) if xs else "–"


def markdown(doc: dict[str, Any]) -> str:
    tol = doc["tolerance"]
    lines = [f"# metralectl `rate` vs AIPerf {doc.get('aiperf_version', '?')}: a rate sweep on one llama-server, one run", "",
             f"{doc['arrival']} arrivals, {doc['prompt_tokens']} prompt tokens as the server counts them (AIPerf "
             f"`--isl {doc.get('aiperf_isl', '?')}`, calibrated: {doc.get('calibration')}), {doc['osl']} output tokens, "
             f"{doc['duration_s']:g} s measured per rate after {doc['warmup_s']:g} s of warm-up; the tools take turns per rate "
             f"(ABBA). metralectl: {doc['metralectl']}.", "",
             "| rate /s | tok/s metralectl | tok/s AIPerf | ratio | same-definition ratio | TTFT p50 ms (m / A) | "
             "TTFT p99 ms (m / A) | ITL p50 ms (m / A) | requests ok / failed (m) | requests ok / failed (A) | "
             f"server prompt tokens (m / A) | within {tol:.0%} |", "|" + "---|" * 12]
    for r in doc["rows"]:
        m, a = r["metralectl"], r["aiperf"]
        if "run_failed" in m or "run_failed" in a:
            lines.append(f"| {r['rate']:g} | " + " | ".join(["–"] * 10) + f" | no: {r['why']} |")
            continue
        retried = f" ({m['retried']} re-sent)" if m.get("retried") else ""
        verdict = "yes" if r["agree"] else "no"
        if r["why"]:
            verdict += f": {r['why']}"
        lines.append(
            f"| {r['rate']:g} | {_f(m['tok_s'])} | {_f(a['tok_s'])} | {_f(r['ratio'], 3)} | {_f(r['same_def_ratio'], 3)} | "
            f"{_f(m['ttft_p50'], 2)} / {_f(a['ttft_p50'], 2)} | {_f(m['ttft_p99'], 2)} / {_f(a['ttft_p99'], 2)} | "
            f"{_f(m['itl_p50'], 3)} / {_f(a['itl_p50'], 3)} | {m['ok']} / {m['failed']}{retried} | {a['ok']} / {a['failed']} | "
            f"{_pt(m['prompt_tokens'])} / {_pt(a['prompt_tokens'])} | {verdict} |")
    if doc.get("auto"):
        lines += ["", f"Rates from metralectl's `rates=auto` sweep: {doc['auto']['rates']}; "
                      f"it stopped because: {(doc['auto']['saturation'] or {}).get('stopped')}"]
    lines += ["", "Commands (the last rate's):", "", "```", doc["server"]] + \
             [doc["commands"][k] for k in sorted(doc["commands"])] + ["```"]
    return "\n".join(lines) + "\n"
