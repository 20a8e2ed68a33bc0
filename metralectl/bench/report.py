"""`bench report`: signed runs read back, and what the report's tables, plots and exports are made of (pure but for
reading the records).

A report is only made from the signed history: each run is found by its id (as `bench history` shows it), its
record and per-request timings verified with the one verifier (bench/signed.verify_record), and a run that is
missing, unsigned or changed since it was signed is an error, never a plot. What is plotted:

- throughput vs latency: one point per stage (a sweep's rung, a rate), aggregate output tok/s against TTFT p50
  and ITL p50, one line per run;
- TTFT and ITL distributions: the empirical CDF over the measured, successful requests of each stage (from
  requests.jsonl: `ttft_ms`, and the gaps between `token_us` after the first token event);
- depth curves: stages labelled with a context `depth` (tokens already in the context before the prompt, as a
  depth sweep records them), prefill (pp) and decode (tg) tok/s against depth — `summary.pp_tok_s` and
  `summary.tg_tok_s` where the stage records them, else tg = per-stream decode tok/s p50 and pp = (depth +
  prompt tokens) / TTFT p50;
- a versus chart: a `bench versus` comparison among the runs (present/versus_view.svg).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metralectl.bench import records, signed
from metralectl.bench.stats import percentile
from metralectl.bench.versus import KIND as VERSUS_KIND
from metralectl.errors import NotFound
from metralectl.seams.signing import SignatureInvalid


@dataclass
class ReportRun:
    """One verified run (or comparison) and its measured requests."""

    record: dict[str, Any]
    directory: Path
    signer: str | None
    signature: str  # what the verifier said, shown in the report
    requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return str(self.record.get("run_id") or self.directory.name)

    @property
    def is_versus(self) -> bool:
        return self.record.get("kind") == VERSUS_KIND


def load(run_ids: Sequence[str], known_keys: Mapping[str, bytes]) -> list[ReportRun]:
    """Each run by id, verified; raises NotFound for a missing run, SignatureInvalid for one that does not verify
    (unsigned, a changed record or timings, an unknown signer)."""
    out: list[ReportRun] = []
    for run in run_ids:
        directory = records.find(run)
        if not (directory / "run.json.sig").is_file():
            raise SignatureInvalid(f"run {directory.name} is not signed (no run.json.sig): a report is made from "
                                   "signed records only", "`metralectl bench verify RUN` says more")
        verdict = signed.verify_record(directory, known_keys)
        if not verdict.ok:
            raise SignatureInvalid(f"run {directory.name} does not verify: {verdict.reason}",
                                   "a report is made from signed records only; `metralectl bench verify RUN`")
        record = records.load(directory)
        if record is None:
            raise NotFound(f"run {directory.name}: its run.json is not a record")
        lines = [] if record.get("kind") == VERSUS_KIND else records.requests(directory)
        timings = {"checked": "timings checked", "none": "no timings"}.get(str(verdict.timings), str(verdict.timings))
        out.append(ReportRun(record, directory, verdict.signer, f"good signature by {verdict.signer} ({timings})",
                             lines))
    return out


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _p(summary: Mapping[str, Any], metric: str, q: str = "p50") -> float | None:
    return _num((summary.get(metric) or {}).get(q)) if isinstance(summary.get(metric), dict) else None


def measured(lines: Sequence[Mapping[str, Any]], stage: str) -> list[Mapping[str, Any]]:
    """The measured, successful requests of one stage."""
    return [r for r in lines if r.get("stage") == stage and r.get("phase") == "measure" and r.get("ok")]


def itl_ms(line: Mapping[str, Any]) -> list[float]:
    """The gaps between token events after the first (the first event may carry several tokens), in ms."""
    times = [t for t in line.get("token_us") or [] if isinstance(t, (int, float))]
    first_n = line.get("first_n") or 1
    times = times[max(int(first_n) - 1, 0):]
    return [(b - a) / 1000.0 for a, b in zip(times, times[1:])]


def stage_names(run: ReportRun) -> list[str]:
    return [str(s.get("name")) for s in run.record.get("stages") or []]


# -- plot data --------------------------------------------------------------------------------------------------

Point = tuple[float, float, str]  # x, y, label


def throughput_latency(runs: Sequence[ReportRun]) -> dict[str, list[tuple[str, list[Point]]]]:
    """{"ttft": [(run, points)], "itl": [...]}: per run, one point per stage with an aggregate throughput."""
    out: dict[str, list[tuple[str, list[Point]]]] = {"ttft": [], "itl": []}
    for run in runs:
        if run.is_versus:
            continue
        for key, metric in (("ttft", "ttft_ms"), ("itl", "itl_ms")):
            points = []
            stages = run.record.get("stages") or []
            for stage, label in zip(stages, point_labels(stages)):
                summary = stage.get("summary") or {}
                x, y = _num(summary.get("output_tok_s")), _p(summary, metric)
                if x is not None and y is not None:
                    points.append((x, y, label))
            if points:
                out[key].append((run.run_id, points))
    return out


SHORT_LABELS = {"concurrency": "c", "depth": "d"}


def point_labels(stages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each stage's name on a plot: the labels that differ between the run's stages ("c=4"), else its name."""
    labels: list[dict[str, Any]] = [dict(s["labels"]) if isinstance(s.get("labels"), dict) else {} for s in stages]
    keys = [k for k in dict.fromkeys(k for lab in labels for k in lab)
            if len({str(lab.get(k)) for lab in labels}) > 1]
    if not keys:
        return [str(s.get("name")) for s in stages]
    return [" ".join(f"{SHORT_LABELS.get(k, k)}={lab.get(k)}" for k in keys) for lab in labels]


def cdf(values: Sequence[float]) -> list[tuple[float, float]]:
    """The empirical CDF as (value, fraction at or below it), thinned to at most 400 points."""
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return []
    step = max(1, n // 400)
    points = [(ordered[i], (i + 1) / n) for i in range(0, n, step)]
    if points[-1][1] != 1.0:
        points.append((ordered[-1], 1.0))
    return points


def distributions(runs: Sequence[ReportRun]) -> dict[str, list[tuple[str, list[tuple[float, float]]]]]:
    """{"ttft": [(run · stage, cdf)], "itl": [...]}: every stage with measured successful requests."""
    out: dict[str, list[tuple[str, list[tuple[float, float]]]]] = {"ttft": [], "itl": []}
    for run in runs:
        if run.is_versus:
            continue
        names = stage_names(run)
        for name, short in zip(names, point_labels(run.record.get("stages") or [])):
            ok = measured(run.requests, name)
            label = run.run_id if len(names) == 1 else f"{run.run_id} · {short}"
            ttft = [float(r["ttft_ms"]) for r in ok if _num(r.get("ttft_ms")) is not None]
            itl = [gap for r in ok for gap in itl_ms(r)]
            if ttft:
                out["ttft"].append((label, cdf(ttft)))
            if itl:
                out["itl"].append((label, cdf(itl)))
    return out


def depth_curves(runs: Sequence[ReportRun]) -> dict[str, list[tuple[str, list[Point]]]]:
    """{"pp": [(run, points)], "tg": [...]}: stages labelled with a context depth, tok/s against depth."""
    out: dict[str, list[tuple[str, list[Point]]]] = {"pp": [], "tg": []}
    for run in runs:
        if run.is_versus:
            continue
        pp, tg = [], []
        for stage in run.record.get("stages") or []:
            labels, summary = stage.get("labels") or {}, stage.get("summary") or {}
            depth = _num(labels.get("depth"))
            if depth is None:
                continue
            name = str(stage.get("name"))
            tg_v = _num(summary.get("tg_tok_s"))
            tg_v = tg_v if tg_v is not None else _p(summary, "stream_tok_s")
            pp_v = _num(summary.get("pp_tok_s"))
            if pp_v is None:
                ttft = _p(summary, "ttft_ms")
                prompt = _num(labels.get("isl")) or _median_prompt(run.requests, name)
                pp_v = (depth + prompt) / (ttft / 1000.0) if ttft and prompt is not None else None
            if pp_v is not None:
                pp.append((depth, pp_v, name))
            if tg_v is not None:
                tg.append((depth, tg_v, name))
        for key, points in (("pp", pp), ("tg", tg)):
            if points:
                out[key].append((run.run_id, sorted(points)))
    return out


def startup_bars(runs: Sequence[ReportRun]) -> list[tuple[str, list[tuple[str, float]]]]:
    """Startup runs (suite startup): per start, its phases in order and their seconds (bench/startup.py)."""
    from metralectl.bench.startup import PHASES, SUITE

    out = []
    chosen = [run for run in runs if run.record.get("suite") == SUITE]
    for run in chosen:
        order = [str(p) for p in run.record.get("phases") or PHASES]  # the record's JSON keys are sorted: not the order
        for stage in run.record.get("stages") or []:
            split = (stage.get("summary") or {}).get("phases") or {}
            bars = [(name, float(split[name])) for name in order if _num(split.get(name)) is not None]
            if bars:
                name = str(stage.get("name"))
                out.append((name if len(chosen) == 1 else f"{run.run_id[-6:]} {name}", bars))
    return out


def _median_prompt(lines: Sequence[Mapping[str, Any]], stage: str) -> float | None:
    tokens = [float(r["prompt_tokens"]) for r in measured(lines, stage) if _num(r.get("prompt_tokens")) is not None]
    return percentile(tokens, 50) if tokens else None


# -- CSV --------------------------------------------------------------------------------------------------------

STAGE_LABEL_KEYS = ("concurrency", "rate", "arrival", "isl", "osl", "depth")
STAGE_COLUMNS = ("run_id", "suite", "status", "signer", "model", "recipe", "engine", "stage", "stage_index",
                 *(f"label_{k}" for k in STAGE_LABEL_KEYS), "requests", "ok", "errors", "window_s", "output_tok_s",
                 "requests_per_s", "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99",
                 "tpot_ms_p50", "e2e_ms_p50", "e2e_ms_p99", "stream_tok_s_p50", "goodput_rps", "slo_attainment")
REQUEST_COLUMNS = ("run_id", "suite", "stage", "index", "worker", "phase", "tag", "ok", "status", "error_kind",
                   "error", "t_send_us", "t_sched_us", "ttft_ms", "ttft_content_ms", "tpot_ms", "itl_ms_p50",
                   "itl_ms_max", "e2e_ms", "decode_tok_s", "output_tokens", "asked_tokens", "prompt_tokens",
                   "expected_prompt_tokens", "count_method", "finish_reason", "retried", "retry_ms")


def _engine(record: Mapping[str, Any]) -> str | None:
    engine = (record.get("target") or {}).get("engine")
    name = engine.get("name") if isinstance(engine, dict) else None
    return None if name is None else str(name)


def stages_csv(runs: Sequence[ReportRun]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(STAGE_COLUMNS)
    for run in runs:
        if run.is_versus:
            continue
        r, target = run.record, run.record.get("target") or {}
        for i, stage in enumerate(r.get("stages") or []):
            s, labels = stage.get("summary") or {}, stage.get("labels") or {}
            writer.writerow([run.run_id, r.get("suite"), r.get("status"), run.signer, target.get("model"),
                             target.get("recipe"), _engine(r), stage.get("name"), i,
                             *(labels.get(k) for k in STAGE_LABEL_KEYS), s.get("requests"), s.get("ok"),
                             s.get("errors"), s.get("window_s"), s.get("output_tok_s"), s.get("requests_per_s"),
                             _p(s, "ttft_ms"), _p(s, "ttft_ms", "p90"), _p(s, "ttft_ms", "p99"), _p(s, "itl_ms"),
                             _p(s, "itl_ms", "p99"), _p(s, "tpot_ms"), _p(s, "e2e_ms"), _p(s, "e2e_ms", "p99"),
                             _p(s, "stream_tok_s"), s.get("goodput_rps"), s.get("slo_attainment")])
    return buf.getvalue()


def requests_csv(runs: Sequence[ReportRun]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(REQUEST_COLUMNS)
    for run in runs:
        for line in run.requests:
            gaps = itl_ms(line)
            extra = {"run_id": run.run_id, "suite": run.record.get("suite"),
                     "itl_ms_p50": None if not gaps else round(percentile(gaps, 50) or 0.0, 4),
                     "itl_ms_max": None if not gaps else round(max(gaps), 4)}
            writer.writerow([extra[c] if c in extra else line.get(c) for c in REQUEST_COLUMNS])
    return buf.getvalue()


def describe(run: ReportRun) -> dict[str, Any]:
    """The facts the report's header shows for one run (unescaped: the view escapes)."""
    r, target = run.record, run.record.get("target") or {}
    if run.is_versus:
        return {"run": run.run_id, "what": f"bench versus: {(r.get('a') or {}).get('recipe')} vs "
                f"{(r.get('b') or {}).get('recipe')}, suite {r.get('compared_suite')}", "status": r.get("status"),
                "signature": run.signature, "started": r.get("started_at")}
    return {"run": run.run_id, "what": f"suite {r.get('suite')}", "status": r.get("status"),
            "signature": run.signature, "started": r.get("started_at"), "model": target.get("model"),
            "recipe": target.get("recipe"), "engine": _engine(r), "url": target.get("url"),
            "hardware": target.get("hardware_class"), "version": r.get("metralectl_version")}


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str) + "\n"

