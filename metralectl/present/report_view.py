"""`bench report` shown: the plots (SVG, written by hand: no plotting dependency) and the one-file HTML report.

Every text that came from a record (run ids, stage names, recipes, models, URLs, error examples) is escaped
(html.escape, quotes too) before it is written into SVG or HTML; the HTML holds no script and loads nothing: its
plots are inline SVG, its style one <style> block.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from metralectl.bench import report as R
from metralectl.present import versus_view
from metralectl.wording import count

COLOURS = ("#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb", "#222222")
WIDTH, HEIGHT = 720, 400
LEFT, RIGHT, TOP, BOTTOM = 70, 40, 40, 60
LEGEND_ROW = 16


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{value:.3g}"


def ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    out = [round(math.floor(lo / step) * step, 10)]
    while out[-1] < hi - step * 1e-9:  # up to the first tick at or past hi: every value inside the axes
        out.append(round(out[-1] + step, 10))
    return out


def chart(title: str, xlabel: str, ylabel: str, series: Sequence[tuple[str, Sequence[tuple[float, float]]]], *,
          point_labels: Sequence[Sequence[str]] | None = None, step: bool = False, ymax: float | None = None,
          xmax: float | None = None, plot_id: str = "") -> str:
    """A line chart: one polyline per series (a step line for a CDF), its points as dots, a legend below."""
    legend_h = LEGEND_ROW * ((len(series) + 1) // 2)
    height = HEIGHT + legend_h
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    xs = [x for _, pts in series for x, _ in pts] or [0.0, 1.0]
    ys = [y for _, pts in series for _, y in pts] or [0.0, 1.0]
    xt = ticks(min(0.0, min(xs)), xmax if xmax is not None else max(xs))
    yt = ticks(min(0.0, min(ys)), ymax if ymax is not None else max(ys) * 1.08)  # headroom for point labels
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]

    def sx(x: float) -> float:
        return LEFT + (x - x0) / ((x1 - x0) or 1.0) * pw

    def sy(y: float) -> float:
        return TOP + ph - (y - y0) / ((y1 - y0) or 1.0) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" id="{_e(plot_id)}" width="{WIDTH}" '
           f'height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{_e(title)}</text>']
    for v in xt:
        out.append(f'<line x1="{sx(v):.1f}" y1="{TOP}" x2="{sx(v):.1f}" y2="{TOP + ph}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{sx(v):.1f}" y="{TOP + ph + 16}" text-anchor="middle">{_fmt(v)}</text>')
    for v in yt:
        out.append(f'<line x1="{LEFT}" y1="{sy(v):.1f}" x2="{LEFT + pw}" y2="{sy(v):.1f}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{LEFT - 6}" y="{sy(v) + 4:.1f}" text-anchor="end">{_fmt(v)}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>')
    out.append(f'<text x="{LEFT + pw / 2:.0f}" y="{TOP + ph + 36}" text-anchor="middle">{_e(xlabel)}</text>')
    out.append(f'<text x="16" y="{TOP + ph / 2:.0f}" text-anchor="middle" '
               f'transform="rotate(-90 16 {TOP + ph / 2:.0f})">{_e(ylabel)}</text>')
    clip = f"clip-{_e(plot_id) or 'plot'}"
    out.append(f'<clipPath id="{clip}"><rect x="{LEFT - 5}" y="{TOP - 5}" width="{pw + 10}" height="{ph + 10}"/>'
               f'</clipPath><g clip-path="url(#{clip})">')
    legend: list[str] = []
    if not series:
        out.append(f'<text x="{LEFT + 20}" y="{TOP + 30}">nothing to plot</text>')
    for i, (name, pts) in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        coords: list[str] = []
        for j, (x, y) in enumerate(pts):
            if step and j:
                coords.append(f"{sx(x):.1f},{sy(pts[j - 1][1]):.1f}")
            coords.append(f"{sx(x):.1f},{sy(y):.1f}")
        out.append(f'<polyline points="{" ".join(coords)}" fill="none" stroke="{colour}" stroke-width="2"/>')
        if not step:
            labels = point_labels[i] if point_labels else [""] * len(pts)
            for (x, y), label in zip(pts, labels):
                out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{colour}">'
                           f'<title>{_e(label)}: {_fmt(x)}, {_fmt(y)}</title></circle>')
                if label and len(pts) <= 12:
                    right = sx(x) > LEFT + pw - 90  # near the right edge: the label ends at the point
                    anchor = ' text-anchor="end"' if right else ""
                    out.append(f'<text x="{sx(x) + (-5 if right else 5):.1f}" y="{sy(y) - 6:.1f}" font-size="10" '
                               f'fill="#444"{anchor}>{_e(_short(label, 18))}</text>')
        lx = LEFT + (i % 2) * (pw / 2)
        ly = HEIGHT - 8 + (i // 2) * LEGEND_ROW
        legend.append(f'<rect x="{lx:.0f}" y="{ly - 9}" width="12" height="10" fill="{colour}"/>')
        legend.append(f'<text x="{lx + 16:.0f}" y="{ly}">{_e(_short(name, 48))}</text>')
    out.append("</g>")
    out.extend(legend)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def stacked(title: str, xlabel: str, rows: Sequence[tuple[str, Sequence[tuple[str, float]]]], *,
            plot_id: str = "") -> str:
    """Horizontal stacked bars: one bar per row (a start), its segments (phases) in order, a legend of them."""
    names = list(dict.fromkeys(name for _, segments in rows for name, _ in segments))
    bar_h, gap, label_w = 22, 10, 150
    pw = WIDTH - label_w - RIGHT
    height = TOP + len(rows) * (bar_h + gap) + 70
    xt = ticks(0.0, (max(sum(v for _, v in segments) for _, segments in rows) or 1.0) * 1.12)  # room for totals
    scale = pw / (xt[-1] or 1.0)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" id="{_e(plot_id)}" width="{WIDTH}" '
           f'height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
           f'<text x="{label_w}" y="22" font-size="15" font-weight="bold">{_e(title)}</text>']
    axis_y = TOP + len(rows) * (bar_h + gap)
    for v in xt:
        x = label_w + v * scale
        out.append(f'<line x1="{x:.1f}" y1="{TOP - 4}" x2="{x:.1f}" y2="{axis_y}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{x:.1f}" y="{axis_y + 14}" text-anchor="middle">{_fmt(v)}</text>')
    out.append(f'<text x="{label_w + pw / 2:.0f}" y="{axis_y + 32}" text-anchor="middle">{_e(xlabel)}</text>')
    for i, (label, segments) in enumerate(rows):
        y = TOP + i * (bar_h + gap)
        out.append(f'<text x="{label_w - 8}" y="{y + 15}" text-anchor="end">{_e(_short(label, 30))}</text>')
        x = float(label_w)
        for name, value in segments:
            colour = COLOURS[names.index(name) % len(COLOURS)]
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{max(value * scale, 0.5):.1f}" height="{bar_h}" '
                       f'fill="{colour}"><title>{_e(name)}: {value:.3f} s</title></rect>')
            x += value * scale
        total = sum(v for _, v in segments)
        out.append(f'<text x="{x + 4:.1f}" y="{y + 15}" font-size="11">{total:.2f} s</text>')
    for j, name in enumerate(names):
        lx = label_w + j * 100
        out.append(f'<rect x="{lx}" y="{height - 16}" width="12" height="10" fill="{COLOURS[j % len(COLOURS)]}"/>')
        out.append(f'<text x="{lx + 16}" y="{height - 7}">{_e(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def plots(runs: Sequence[R.ReportRun]) -> dict[str, str]:
    """Every plot the runs can make, by file name stem; a plot with nothing to show is left out."""
    out: dict[str, str] = {}
    tl = R.throughput_latency(runs)
    for key, metric in (("ttft", "TTFT p50 (ms)"), ("itl", "ITL p50 (ms)")):
        if tl[key]:
            out[f"throughput-{key}"] = chart(
                f"Throughput vs {metric.split()[0]} (one point per stage)", "aggregate output tok/s", metric,
                [(name, [(x, y) for x, y, _ in pts]) for name, pts in tl[key]],
                point_labels=[[label for _, _, label in pts] for _, pts in tl[key]], plot_id=f"throughput-{key}")
    dist = R.distributions(runs)
    for key, metric in (("ttft", "TTFT (ms)"), ("itl", "inter-token latency (ms)")):
        if dist[key]:
            p99 = max(next((x for x, f in pts if f >= 0.99), pts[-1][0]) for _, pts in dist[key])
            out[f"{key}-cdf"] = chart(f"{metric.split(' (')[0]} distribution (CDF of measured requests)",
                                      f"{metric}; the axis ends at the largest p99", "fraction at or below",
                                      dist[key], step=True, ymax=1.0, xmax=p99, plot_id=f"{key}-cdf")
    depth = R.depth_curves(runs)
    for key, metric in (("pp", "prefill (pp) tok/s"), ("tg", "decode (tg) tok/s")):
        if depth[key]:
            out[f"depth-{key}"] = chart(f"{metric.split(' tok')[0]} against context depth", "context depth (tokens)",
                                        metric, [(name, [(x, y) for x, y, _ in pts]) for name, pts in depth[key]],
                                        point_labels=[[label for _, _, label in pts] for _, pts in depth[key]],
                                        plot_id=f"depth-{key}")
    bars = R.startup_bars(runs)
    if bars:
        out["startup"] = stacked("Time from `run` to the first token, by phase", "seconds after `run`", bars,
                                 plot_id="startup")
    for run in runs:
        if run.is_versus and run.record.get("rows"):
            out[f"versus-{run.run_id}"] = versus_view.svg(run.record)
    return out


STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;background:#f6f7f9;color:#1d2125}
main{max-width:1100px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px}
.meta{color:#5b6470;font-size:13px;margin:0 0 16px}
.card{background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:12px 16px;margin:0 0 12px;overflow:hidden}
.card h3{font-size:15px;margin:0 0 6px;overflow-wrap:anywhere}
dl{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:2px 12px;margin:0;font-size:13px}
dt{color:#5b6470} dd{margin:0;overflow-wrap:anywhere}
.ok{color:#1a7f37;font-weight:600} .bad{color:#c62828;font-weight:600}
.table-wrap{overflow-x:auto;background:#fff;border:1px solid #dde1e6;border-radius:6px}
table{border-collapse:collapse;font-size:12.5px;width:100%}
th,td{padding:4px 6px;border-bottom:1px solid #eef0f2;text-align:right;white-space:nowrap}
td.run{white-space:nowrap;font-family:ui-monospace,monospace;font-size:12px} td.l{white-space:nowrap}
th{background:#f0f2f5;position:sticky;top:0} td.l,th.l{text-align:left}
figure{margin:0 0 16px;background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:8px;overflow:hidden}
figure svg{display:block;width:100%;height:auto}
footer{color:#5b6470;font-size:12px;margin-top:24px}
"""


def _fmt_cell(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "–" if value is None else str(value)
    if isinstance(value, (int, float)):
        return _fmt(float(value)) if isinstance(value, float) else str(value)
    return str(value)


def _run_card(run: R.ReportRun) -> str:
    facts = R.describe(run)
    status = str(facts.get("status"))
    signed_ok = run.signature.startswith("good signature")
    rows = [f'<dt>status</dt><dd class="{"ok" if status == "completed" else "bad"}">{_e(status)}</dd>',
            f'<dt>signature</dt><dd class="{"ok" if signed_ok else "bad"}">{_e(run.signature)}</dd>']
    for key in ("what", "started", "model", "recipe", "engine", "hardware", "url", "version"):
        if facts.get(key) not in (None, ""):
            rows.append(f"<dt>{_e(key)}</dt><dd>{_e(facts[key])}</dd>")
    return f'<div class="card" id="run-{_e(run.run_id)}"><h3>{_e(run.run_id)}</h3><dl>{"".join(rows)}</dl></div>'


STAGE_HEAD = ("run", "stage", "ok / sent", "out tok/s", "req/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99",
              "E2E p50", "tok/s/stream p50")


def _stage_table(runs: Sequence[R.ReportRun]) -> str:
    body = []
    for run in runs:
        if run.is_versus:
            continue
        for stage in run.record.get("stages") or []:
            s = stage.get("summary") or {}

            def p(metric: str, q: str = "p50", s: Mapping[str, Any] = s) -> float | None:
                v = s.get(metric)
                value = v.get(q) if isinstance(v, dict) else None
                return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

            cells = [run.run_id, stage.get("name"), f"{s.get('ok', '–')} / {s.get('requests', '–')}",
                     s.get("output_tok_s"), s.get("requests_per_s"), p("ttft_ms"), p("ttft_ms", "p99"), p("itl_ms"),
                     p("itl_ms", "p99"), p("e2e_ms"), p("stream_tok_s")]
            body.append("<tr>" + "".join(f'<td class="{"run" if i == 0 else "l"}">{_e(_fmt_cell(c))}</td>' if i < 2 else
                                         f"<td>{_e(_fmt_cell(c))}</td>" for i, c in enumerate(cells)) + "</tr>")
    if not body:
        return ""
    head = "".join(f'<th class="l">{h}</th>' if i < 2 else f"<th>{h}</th>" for i, h in enumerate(STAGE_HEAD))
    return (f'<h2>Stages</h2><p class="meta">latencies in ms; out tok/s and req/s over each stage\'s measured '
            f'window</p><div class="table-wrap"><table id="stages"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


CAPTIONS = {
    "throughput-ttft": "Aggregate output tok/s against TTFT p50, one point per stage (a sweep's rung, a rate).",
    "throughput-itl": "Aggregate output tok/s against inter-token latency p50, one point per stage.",
    "ttft-cdf": "Time to first token of every measured, successful request: the fraction at or below each value.",
    "itl-cdf": "Every gap between token events after the first, over the measured, successful requests.",
    "depth-pp": "Prefill tok/s at each context depth (llama-benchy's pp).",
    "depth-tg": "Decode tok/s at each context depth (llama-benchy's tg).",
    "startup": "Each cold start's phases from the lifecycle's own events: preflight, pull (staging), create, load "
               "(to ready), warm-up (ready to the first token of the first request).",
}


def html(runs: Sequence[R.ReportRun], svgs: Mapping[str, str], generated: str, version: str) -> str:
    """The whole report: one file, inline SVG, no script, nothing fetched."""
    names = ", ".join(r.run_id for r in runs)
    figures = []
    for stem, svg in svgs.items():
        caption = CAPTIONS.get(stem) or ("bench versus: each side's runs as dots, median bar, min–max whisker."
                                         if stem.startswith("versus-") else "")
        figures.append(f'<figure id="fig-{_e(stem)}">{svg}<figcaption class="meta">{_e(caption)}</figcaption>'
                       f"</figure>")
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>metralectl benchmark report: {_e(names)}</title><style>{STYLE}</style></head><body><main>",
             "<h1>Benchmark report</h1>",
             f'<p class="meta">{count(len(runs), "signed run")}; made {_e(generated)} by '
             f"metralectl {_e(version)} from the records as signed (each verified before it was read)</p>",
             '<h2>Runs</h2>', *(_run_card(r) for r in runs), _stage_table(runs),
             "<h2>Plots</h2>" if figures else "", *figures,
             "<footer>Made offline from the signed records under $METRALE_HOME/runs; `metralectl bench verify RUN` "
             "checks a record again.</footer></main></body></html>"]
    return "\n".join(p for p in parts if p) + "\n"
