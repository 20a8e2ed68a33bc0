"""`metralectl bench report RUN… [--html FILE] [--svg DIR] [--png DIR] [--csv FILE] [--br DIR]`: signed runs as a
one-file HTML report, plots (SVG, PNG), CSV and llm-d's benchmark report format (docs/bench.md, "Reports").

Each RUN is verified before it is read (bench/report.load): a missing run exits 64, one that is unsigned or changed
since it was signed exits 1, and nothing is written. Without an output option the runs' stages are printed as a
table (what the report would hold).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import typer

from metralectl.cli.state import note, style


def _dir(path: Path, option: str) -> Path:
    from metralectl.errors import UsageError

    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path}: not a directory", f"give a directory for {option}")
    if not path.parent.is_dir():
        raise UsageError(f"{option} {path}: no directory {path.parent}")
    return path  # made once every run has verified: a refused report leaves nothing behind


def _file(path: Path, option: str) -> Path:
    from metralectl.errors import UsageError

    if path.is_dir() or not path.parent.is_dir():
        raise UsageError(f"{option} {path}: not a file in an existing directory")
    return path


WRITTEN: list[str] = []  # this command's files, in order (--json lists them)


def _write(path: Path, text: str) -> None:
    from metralectl.atomicfile import write_atomic

    write_atomic(path, text)
    WRITTEN.append(str(path))
    note(style(f"wrote {path}", "2", sys.stderr))


def report(
    runs: list[str] = typer.Argument(..., metavar="RUN…", help="Run ids as `bench history` shows them (or a unique "
                                     "prefix/suffix); a `bench versus` comparison's id adds its chart."),
    html_file: Path = typer.Option(None, "--html", metavar="FILE", help="One self-contained HTML file (inline SVG, "
                                   "no script, nothing fetched)."),
    svg_dir: Path = typer.Option(None, "--svg", metavar="DIR", help="Each plot as an SVG file in DIR."),
    png_dir: Path = typer.Option(None, "--png", metavar="DIR", help="Each plot as a PNG file in DIR (rasterised by "
                                 "a headless Chromium on this machine)."),
    csv_file: Path = typer.Option(None, "--csv", metavar="FILE", help="One row per stage in FILE, one row per "
                                  "request in FILE's name with .requests.csv."),
    br_dir: Path = typer.Option(None, "--br", metavar="DIR", help="llm-d benchmark report v0.2 JSON files in DIR, "
                                "one per stage."),
    as_json: bool = typer.Option(False, "--json", help="On stdout: the runs (each with its signature), the plots, "
                                 "the stages and the files written, as JSON."),
) -> None:
    """Report on signed runs: an HTML page, plots (throughput vs latency, TTFT/ITL distributions, depth curves,
    versus), CSV and llm-d's benchmark report (BR v0.2)."""
    import json

    from metralectl import __version__
    from metralectl.bench import br
    from metralectl.bench import report as R
    from metralectl.peers.store import known_keys
    from metralectl.present import report_view as V
    from metralectl.safetext import clean

    WRITTEN.clear()
    paths = {"html": html_file and _file(html_file, "--html"), "csv": csv_file and _file(csv_file, "--csv"),
             "svg": svg_dir and _dir(svg_dir, "--svg"), "png": png_dir and _dir(png_dir, "--png"),
             "br": br_dir and _dir(br_dir, "--br")}
    loaded = R.load(runs, known_keys())
    svgs = V.plots(loaded)
    if html_file is not None:
        generated = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        _write(html_file, V.html(loaded, svgs, generated, __version__))
    for directory in (svg_dir, png_dir, br_dir):
        if directory is not None:
            directory.mkdir(exist_ok=True)
    if svg_dir is not None:
        for stem, svg in svgs.items():
            _write(svg_dir / f"{_safe(stem)}.svg", svg)
    if png_dir is not None:
        _pngs(svgs, png_dir)
    if csv_file is not None:
        _write(csv_file, R.stages_csv(loaded))
        _write(csv_file.with_name(csv_file.stem + ".requests.csv"), R.requests_csv(loaded))
    if br_dir is not None:
        for doc in br.reports(loaded, __version__):
            _write(br_dir / f"{_safe(doc['run']['uid'])}.br.json", json.dumps(doc, indent=2, default=str) + "\n")
    if as_json:
        print(json.dumps({"runs": [{"run_id": run.run_id, "suite": run.record.get("suite"),
                                    "status": run.record.get("status"), "signer": run.signer,
                                    "signature": run.signature} for run in loaded],
                          "plots": list(svgs), "written": WRITTEN,
                          "stages": [dict(row) for row in _csv_rows(R.stages_csv(loaded))]}, indent=2, default=str))
    elif not any(paths.values()):
        from metralectl.present.table import render_table

        rows = [[clean(run.run_id), clean(str(s.get("name"))), str((s.get("summary") or {}).get("output_tok_s")),
                 str(((s.get("summary") or {}).get("ttft_ms") or {}).get("p50"))]
                for run in loaded if not run.is_versus for s in run.record.get("stages") or []]
        for run in loaded:
            print(f"{clean(run.run_id)}: {clean(run.signature)}")
        if rows:
            print(render_table(["RUN", "STAGE", "OUT TOK/S", "TTFT P50 MS"], rows, right=(2, 3)))
        note(f"plots: {', '.join(svgs) or 'none'}; write them with --html FILE, --svg DIR or --png DIR")


def _csv_rows(text: str) -> list[dict[str, str]]:
    import csv
    import io

    return list(csv.DictReader(io.StringIO(text)))


def _safe(stem: str) -> str:
    """A file name from a plot's or report's name (run ids are plain; this keeps any other text to one name)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in stem).lstrip(".") or "plot"


def _pngs(svgs: dict[str, str], out: Path) -> None:
    import re

    from metralectl.seams import browser

    with tempfile.TemporaryDirectory(prefix="metrale-report-") as tmp:
        for stem, svg in svgs.items():
            size = re.search(r'width="(\d+)" height="(\d+)"', svg)
            width, height = (int(size.group(1)), int(size.group(2))) if size else (720, 400)
            page = Path(tmp) / f"{_safe(stem)}.html"  # a page around the SVG: no margin, exactly its size
            page.write_text(f'<!DOCTYPE html><html><head><meta charset="utf-8"><style>html,body{{margin:0;'
                            f'background:#fff}}</style></head><body>{svg}</body></html>', encoding="utf-8")
            target = out / f"{_safe(stem)}.png"
            browser.screenshot(page, target, width, height)
            WRITTEN.append(str(target))
            note(style(f"wrote {target}", "2", sys.stderr))
