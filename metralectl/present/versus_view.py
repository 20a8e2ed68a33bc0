"""`bench versus` shown: the side-by-side table (text) and the plot (SVG, written by hand: no plotting dependency)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from xml.sax.saxutils import escape

from metralectl.present.table import render_table
from metralectl.safetext import clean


def _num(value: Any) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "–"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= 1 else f"{value:.3g}"


def _cell(spread: Mapping[str, Any]) -> str:
    if not spread.get("n"):
        return "–"
    median, lo, hi = spread.get("median"), spread.get("min"), spread.get("max")
    return f"{_num(median)} ({_num(lo)}–{_num(hi)})" if spread["n"] > 1 else _num(median)


def verdict(row: Mapping[str, Any]) -> str:
    if row.get("missing"):
        return f"– {clean(str(row['missing']), 80)}"
    if not row.get("beyond_noise"):
        return "within noise"
    return f"beyond noise, {row.get('better')} better (chance {row.get('p_chance', 0):.0%})"


def render_versus(doc: Mapping[str, Any]) -> str:
    a, b = doc.get("a") or {}, doc.get("b") or {}
    head = [f"{side} {clean(str(s.get('recipe')))}  engine {clean(str(s.get('engine') or '?'))}  "
            f"model {clean(str(s.get('model') or '?'))}  runs {', '.join(str(r.get('run_id')) for r in s.get('runs') or [])}"
            for side, s in (("A", a), ("B", b))]
    head.append(f"suite {doc.get('compared_suite')}, {doc.get('repeats')} runs per side: median (min–max); "
                f"{doc.get('rule')}")
    stages = {r.get("stage") for r in doc.get("rows") or []}
    rows = []
    for r in doc.get("rows") or []:
        label = (r["label"] if r["unit"] in r["label"] else f"{r['label']} ({r['unit']})") + (f" [{r['stage']}]" if len(stages) > 1 else "")
        delta = "–" if r.get("relative") is None else f"{r['relative']:+.1%}"
        rows.append([label, _cell(r.get("a") or {}), _cell(r.get("b") or {}), delta, verdict(r)])
    return "\n".join(head) + "\n\n" + render_table(["METRIC", "A", "B", "B vs A", "DIFFERENCE"], rows, right=(1, 2, 3))


def svg(doc: Mapping[str, Any]) -> str:
    """One panel per metric measured on both sides: each side's runs as dots, its median as a bar, its range as a
    whisker; the panel's title says whether the difference is beyond noise."""
    panels = [r for r in doc.get("rows") or [] if not r.get("missing")]
    width, panel_h, top = 640, 90, 40
    height = top + panel_h * max(len(panels), 1) + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="20" font-size="14">{escape(_title(doc))}</text>']
    if not panels:
        out.append(f'<text x="10" y="{top + 20}">nothing measured on both sides</text>')
    for i, row in enumerate(panels):
        y0 = top + i * panel_h
        values = [*row["a_values"], *row["b_values"], 0.0]
        scale = (width - 220) / (max(values) or 1.0)
        out.append(f'<text x="10" y="{y0 + 14}">{escape(row["label"])} ({escape(row["unit"])}) — '
                   f'{escape(verdict(row))}</text>')
        for j, (side, colour) in enumerate((("a", "#4477aa"), ("b", "#ee6677"))):
            y = y0 + 28 + j * 26
            spread = row[side]
            name = escape(str((doc.get(side) or {}).get("recipe") or side.upper())[:24])  # cut, then escape
            out.append(f'<text x="10" y="{y + 12}">{side.upper()} {name}</text>')
            out.append(f'<rect x="200" y="{y}" width="{spread["median"] * scale:.1f}" height="16" fill="{colour}" '
                       f'fill-opacity="0.5"><title>{side.upper()} median {spread["median"]}</title></rect>')
            lo, hi = 200 + spread["min"] * scale, 200 + spread["max"] * scale
            out.append(f'<line x1="{lo:.1f}" y1="{y + 8}" x2="{hi:.1f}" y2="{y + 8}" stroke="black"/>')
            for v in row[f"{side}_values"]:
                out.append(f'<circle cx="{200 + v * scale:.1f}" cy="{y + 8}" r="3" fill="black"/>')
            out.append(f'<text x="{hi + 6:.1f}" y="{y + 12}">{_num(spread["median"])}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _title(doc: Mapping[str, Any]) -> str:
    a, b = doc.get("a") or {}, doc.get("b") or {}
    return (f"{a.get('recipe')} ({a.get('engine') or '?'}) vs {b.get('recipe')} ({b.get('engine') or '?'}): "
            f"{doc.get('compared_suite')}, {doc.get('repeats')} runs each")
