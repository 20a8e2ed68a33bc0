"""Text rendering of benchmark records for the terminal (stdout data; the CLI decides where it goes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from metralectl.present.table import render_table
from metralectl.wording import count


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}" if abs(value) >= 0.1 or value == 0 else f"{value:.3g}"
    return str(value)


def _p(agg: dict[str, Any], metric: str, q: str) -> object:
    return (agg.get(metric) or {}).get(q)


def stage_table(record: Mapping[str, Any]) -> str:
    headers = ["STAGE", "OK/REQ", "OUT TOK/S", "STREAM TOK/S p50", "TTFT p50", "p95", "p99", "TPOT p50", "p95",
               "ITL p50", "p95", "E2E p50", "J/TOK", "CLIENT"]
    rows = []
    for s in record.get("stages", []):
        a = s.get("summary") or {}
        energy = s.get("energy")
        jt = energy.get("j_per_output_token") if isinstance(energy, dict) else None
        mark = "" if s.get("ok", True) else " ✘"
        rows.append([s["name"] + mark, f"{a.get('ok', 0)}/{a.get('requests', 0)}", fmt(a.get("output_tok_s")),
                     fmt(_p(a, "stream_tok_s", "p50")), fmt(_p(a, "ttft_ms", "p50")), fmt(_p(a, "ttft_ms", "p95")),
                     fmt(_p(a, "ttft_ms", "p99")), fmt(_p(a, "tpot_ms", "p50"), 2), fmt(_p(a, "tpot_ms", "p95"), 2),
                     fmt(_p(a, "itl_ms", "p50"), 2), fmt(_p(a, "itl_ms", "p95"), 2), fmt(_p(a, "e2e_ms", "p50")),
                     fmt(jt, 3), "BOUND" if s.get("client_bound") else "ok"])
    return render_table(headers, rows, right=tuple(range(1, 13)))


def render_run(record: Mapping[str, Any]) -> str:
    from metralectl.bench import engine_id
    from metralectl.bench.outcome import FAILED_STATUSES, effective_status
    from metralectl.safetext import clean

    t = record.get("target") or {}
    status = effective_status(record)
    shown = f"FAILED: {status}" if status in FAILED_STATUSES else status
    lines = [f"run       {record.get('run_id')}  ({record.get('suite')}, {shown}, "
             f"source {record.get('source')})",
             f"target    {t.get('url')}  model {t.get('model') or '-'}  hardware {t.get('hardware_class') or '?'}"
             + (f"  recipe {t['recipe']}" if t.get("recipe") else ""),
             f"engine    {engine_id.describe(t.get('engine'))}",
             "times     ms; TPOT/ITL per output token; throughput counts tokens inside the measured window", ""]
    lines.append(stage_table(record))
    if record.get("error") and status in FAILED_STATUSES:
        lines += ["", f"error     {clean(str(record['error']), 400)}"]
    for kind in (record.get("errors") or [])[:5]:
        lines.append(f"          {kind['kind']} ×{kind['count']}: {clean(str(kind.get('example') or ''), 160)}")
    lines += _dialect_lines(record)
    headline = (record.get("summary") or {}).get("headline") or {}
    if record.get("suite") != "concurrency-sweep" and record.get("suite") != "rate":
        lines.append("")
        lines += [f"{k:<28} {fmt(v, 2)}" for k, v in headline.items()]
    for extra in ("malformed",):
        if (record.get("summary") or {}).get(extra):
            lines.append(f"{extra}: {record['summary'][extra]}")
    tele = record.get("telemetry") or {}
    energy = [s.get("energy") for s in record.get("stages", [])]
    if energy and all(isinstance(e, str) for e in energy):
        lines.append(f"energy    {energy[0]}")
    elif energy:
        e = next((x for x in energy if isinstance(x, dict)), {})
        lines.append(f"energy    method {e.get('method')}, scope {e.get('scope')}")
    thermal = tele.get("thermal") or {}
    lines.append(f"thermal   {thermal.get('state', 'unknown')}" + (f" ({thermal['reason']})" if thermal.get("reason") else ""))
    for g in record.get("gates", []):
        mark = {True: "PASS", False: "FAIL", None: "n/a "}[g.get("passed")]
        lines.append(f"gate      [{mark}] {g['metric']} {g['op']} {g['threshold']:g}: {fmt(g.get('value'), 2)} ({g['source']})"
                     + (f" {g['note']}" if g.get("note") else ""))
    for note in record.get("gate_notes") or []:
        lines.append(f"gate      {note}")
    lines.append(f"verdict   {record.get('verdict')}  exit {record.get('exit_code')}")
    return "\n".join(lines)


def _dialect_lines(record: Mapping[str, Any]) -> list[str]:
    """How the requests were shaped and counted, when that qualifies the numbers."""
    from metralectl.safetext import clean

    d = record.get("dialect") or {}
    out = []
    if d.get("refused"):
        out.append(f"requests  the server refused {', '.join(d['refused'])}; sent without them"
                   + (f" ({clean(str(d.get('refusal') or ''), 120)})" if d.get("refusal") else ""))
    if d and not d.get("output_length_forced", True):
        short = sum((s.get("summary") or {}).get("short_outputs") or 0 for s in record.get("stages") or [])
        ok = sum((s.get("summary") or {}).get("ok") or 0 for s in record.get("stages") or [])
        out.append(f"output    length not forced: {short} of {count(ok, 'output')} ended before the asked length; "
                   "tok/s is over the outputs as they came")
    methods: dict[str, int] = {}
    for s in record.get("stages") or []:
        for m, n in ((s.get("summary") or {}).get("count_methods") or {}).items():
            methods[m] = methods.get(m, 0) + n
    if methods and set(methods) <= {"events"}:
        out.append("tokens    counted one per stream event (the server reported no usage): a lower bound")
    elif any(m.startswith("tokenizer") for m in methods):
        out.append("tokens    counted with the tokenizer given (the server reported no usage)")
    retried = sum((s.get("summary") or {}).get("retried") or 0 for s in record.get("stages") or [])
    if retried:
        out.append(f"requests  {retried} sent again on a fresh connection: the server closed a kept-alive "
                   "connection before answering them (timed from the second send)")
    missing = sum((s.get("summary") or {}).get("done_marker_missing") or 0 for s in record.get("stages") or [])
    if missing:
        out.append(f"streams   {missing} ended without data: [DONE] after their finish chunk (counted complete)")
    return out


def history_table(runs: list[dict[str, Any]]) -> str:
    """One line per run; ENGINE is `?` when the run could not tell, `-` for a record from before engines were named."""
    from metralectl.bench import engine_id
    from metralectl.bench.outcome import FAILED_STATUSES, effective_status

    rows = []
    for r in runs:
        headline = (r.get("summary") or {}).get("headline") or {}
        key = next((k for k in ("decode_tok_s_p50", "prefix_speedup", "well_formed_frac") if k in headline), None)
        if key is None:
            key = next((k for k in headline if k.endswith("output_tok_s") or k.endswith("goodput_rps")), None)
        status = effective_status(r)
        if r.get("kind") == "metralectl-bench-versus":  # bench/versus.KIND: a comparison names its two recipes
            pair = f"{(r.get('a') or {}).get('recipe')} vs {(r.get('b') or {}).get('recipe')}"
            rows.append([r.get("run_id", "?"), f"versus {r.get('compared_suite')}", str(r.get("started_at", ""))[:19],
                         f"FAILED {status}" if status in FAILED_STATUSES else status, "-", "-", "-", pair])
            continue
        rows.append([r.get("run_id", "?"), r.get("suite", "?"), str(r.get("started_at", ""))[:19],
                     f"FAILED {status}" if status in FAILED_STATUSES else status,
                     r.get("verdict") or "-", engine_id.short((r.get("target") or {}).get("engine")),
                     (r.get("target") or {}).get("model") or "-", f"{key}={fmt(headline.get(key), 2)}" if key else "-"])
    return render_table(["RUN", "SUITE", "STARTED", "STATUS", "VERDICT", "ENGINE", "MODEL", "HEADLINE"], rows)


def compare_rows(a: dict[str, Any], b: dict[str, Any]) -> list[list[Any]]:
    from metralectl.bench.stats import relative_delta

    ha = (a.get("summary") or {}).get("headline") or {}
    hb = (b.get("summary") or {}).get("headline") or {}
    rows = []
    for key in list(dict.fromkeys([*ha, *hb])):
        va, vb = ha.get(key), hb.get(key)
        num = isinstance(va, (int, float)) and isinstance(vb, (int, float))
        delta = (vb - va) if num else None  # type: ignore[operator]
        rel = relative_delta(vb, va) if num else None
        rows.append([key, va, vb, delta, rel])
    return rows


def render_compare(a: dict[str, Any], b: dict[str, Any]) -> str:
    rows = [[k, fmt(va, 2), fmt(vb, 2), fmt(d, 2) if d is not None else "-", f"{rel:+.1%}" if rel is not None else "-"]
            for k, va, vb, d, rel in compare_rows(a, b)]
    from metralectl.bench.engine_id import short

    ea, eb = short((a.get("target") or {}).get("engine")), short((b.get("target") or {}).get("engine"))
    head = [f"{side} {r.get('run_id')}  {r.get('suite')}  {(r.get('target') or {}).get('model')}  engine {e}  "
            f"{r.get('started_at')}" for side, r, e in (("A", a, ea), ("B", b, eb))]
    if a.get("suite") != b.get("suite"):
        head.append("note: different suites; only shared metrics line up")
    if ea != eb and "-" not in (ea, eb):
        head.append(f"note: different engines ({ea}, {eb}): the numbers compare the engines as much as the settings")
    pa, pb = a.get("params") or {}, b.get("params") or {}
    differing = [k for k in sorted(set(pa) | set(pb)) if pa.get(k) != pb.get(k)]
    if differing:
        head.append("params differ: " + ", ".join(f"{k} {pa.get(k)} -> {pb.get(k)}" for k in differing))
    return "\n".join(head) + "\n\n" + render_table(["METRIC", "A", "B", "B-A", "DELTA"], rows, right=(1, 2, 3, 4))
