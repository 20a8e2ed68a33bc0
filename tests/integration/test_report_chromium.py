"""`bench report --html` in a real browser (Debian's headless Chromium, driven by Selenium, as
test_page_chromium.py drives it): at a desktop and a phone width, nothing overflows its box — no element
sticks out of its parent (a scrolling table wrapper aside: its table may scroll inside it), no SVG mark or
label out of its plot, no page-wide horizontal scroll — every plot is drawn at a real size, and the page ran
no script and asked for nothing over the network.

Chromium, chromedriver or selenium missing: skipped with the reason, a failure under CI (test_page_chromium's
`unavailable`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from metralectl.bench import records
from metralectl.peers.store import known_keys
from metralectl.present import report_view as V

from tests.integration.test_page_chromium import browser  # noqa: F401 - the fixture, shared
from tests.unit.test_bench_report import HOSTILE, _signed_run

pytestmark = [pytest.mark.integration]

# Every element under <main> whose box is not inside its parent's (1 px for rounding), and every SVG descendant
# outside its <svg>. A parent that scrolls (overflow auto/scroll) may hold a wider child: that is what it is for.
OVERFLOWS = """
const out = [];
const inside = (c, p) => c.left >= p.left - 1 && c.right <= p.right + 1 && c.top >= p.top - 1 && c.bottom <= p.bottom + 1;
const scrolls = (el) => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
for (const el of document.querySelectorAll('main *')) {
  const parent = el.parentElement;
  if (el.closest('svg') || !parent) continue;
  let up = parent, scrolled = false;
  while (up && up.tagName !== 'MAIN') { if (scrolls(up)) { scrolled = true; break; } up = up.parentElement; }
  if (scrolled) continue;
  const r = el.getBoundingClientRect();
  if (r.width === 0 && r.height === 0) continue;
  if (!inside(r, parent.getBoundingClientRect())) out.push(el.tagName + '#' + el.id + '.' + el.className + ' in ' + parent.tagName);
}
for (const svg of document.querySelectorAll('svg')) {
  const box = svg.getBoundingClientRect();
  for (const mark of svg.querySelectorAll('text, circle, rect, polyline, line')) {
    if (mark.closest('clipPath')) continue;
    const r = mark.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    const clipped = mark.closest('g[clip-path]');
    if (clipped && mark.tagName === 'polyline') continue;  // a line drawn past the axes is clipped to them
    if (!inside(r, box)) out.push(svg.id + ': ' + mark.tagName + ' "' + (mark.textContent || '').slice(0, 40) + '"');
  }
}
if (document.documentElement.scrollWidth > window.innerWidth + 1) out.push('page scrolls sideways: ' + document.documentElement.scrollWidth + ' > ' + window.innerWidth);
return out;
"""


@pytest.mark.parametrize("width", [1280, 420])
def test_report_lays_out_inside_its_boxes(tmp_path: Path, browser: Any, width: int) -> None:  # noqa: F811
    sweep = _signed_run("concurrency-sweep", f"20261204-01000{width % 7}-aaaaaa",
                        [(f"c={c} {HOSTILE}", {"concurrency": c, "isl": 64, "osl": 8}, 100.0 * c, 10.0 * c, 2.0 + c)
                         for c in (1, 2, 4, 8)], model=HOSTILE * 3)
    depth = _signed_run("depth", f"20261204-01010{width % 7}-bbbbbb",
                        [(f"d={d}", {"depth": d, "isl": 64, "osl": 8}, 90.0, 5.0 + d / 100, 3.0 + d / 1000)
                         for d in (0, 4096, 16384, 32768)])
    from metralectl.bench import report as R

    loaded = R.load([sweep.name, depth.name], known_keys())
    page = tmp_path / "report.html"
    page.write_text(V.html(loaded, V.plots(loaded), "now", "0.1.0"), encoding="utf-8")
    assert records.find(sweep.name) == sweep
    browser.set_window_size(width, 1000)
    browser.get(page.as_uri())
    assert browser.execute_script(OVERFLOWS) == []
    sizes = browser.execute_script("return [...document.querySelectorAll('figure svg')].map(s => "
                                   "[s.id, s.getBoundingClientRect().width, s.getBoundingClientRect().height])")
    assert len(sizes) == 6 and all(w > 200 and h > 100 for _, w, h in sizes), sizes
    assert browser.execute_script("return document.scripts.length") == 0
    fetched = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert fetched == []


def test_png_plots_are_rasterised_at_their_svg_size(tmp_path: Path) -> None:
    """`bench report --png DIR` through the real CLI: one PNG per plot, at the plot's own size (IHDR)."""
    import os
    import struct
    import subprocess
    import sys

    from tests.integration.test_page_chromium import CHROMIUM, unavailable

    if not os.access(CHROMIUM, os.X_OK):
        unavailable(f"{CHROMIUM} missing: apt-get install chromium (scripts/bootstrap.sh does)")
    sweep = _signed_run("concurrency-sweep", "20261204-010300-dddddd",
                        [(f"c={c}", {"concurrency": c, "isl": 64, "osl": 8}, 100.0 * c, 10.0 * c, 2.0 + c)
                         for c in (1, 2)])
    out = tmp_path / "png"
    done = subprocess.run([sys.executable, "-m", "metralectl", "bench", "report", sweep.name, "--png", str(out),
                           "--svg", str(tmp_path / "svg")], capture_output=True, text=True, timeout=180,
                          cwd=Path(__file__).resolve().parents[2], env={**os.environ, "METRALE_CHROMIUM": str(CHROMIUM)})
    assert done.returncode == 0, done.stderr
    pngs = sorted(p.name for p in out.iterdir())
    assert pngs == ["itl-cdf.png", "throughput-itl.png", "throughput-ttft.png", "ttft-cdf.png"]
    for name in pngs:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
        width, height = struct.unpack(">II", data[16:24])
        svg = (tmp_path / "svg" / name.replace(".png", ".svg")).read_text()
        assert f'width="{width}" height="{height}"' in svg, (name, width, height)
