"""`bench report`: made from signed runs only (a missing, unsigned or changed one is an error and nothing is
written), one self-contained HTML file whose every plot is there and whose text from records is escaped, the
plots as SVG, CSV with the documented columns, and llm-d's benchmark report (BR v0.2) valid against llm-d's own
JSON schema (pinned copy in tests/unit/data). One test runs the real CLI end to end: a real `bench run` against the
truth server, then `bench report` on its record."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from metralectl.bench import br, records, signed
from metralectl.bench import report as R
from metralectl.errors import ExitCode, NotFound
from metralectl.peers.store import known_keys
from metralectl.present import report_view as V
from metralectl.seams.signing import SignatureInvalid

from tests.bench_truth.helpers import REPO, truth_server
from tests.unit.jsonschema_lite import validate

SCHEMA = json.loads((REPO / "tests/unit/data/llmd_br_v0_2_schema.json").read_text())
HOSTILE = '<script>alert("x")</script>&<img src=x onerror=alert(1)>'
VOID = {"meta", "br", "img", "input", "link", "hr", "col", "area", "base", "wbr", "source"}


def _stats(values: list[float]) -> dict[str, Any]:
    from metralectl.bench.stats import summarize

    return summarize(values)


def _request(stage: str, i: int, ttft: float, gap_ms: float, n: int = 8) -> dict[str, Any]:
    tokens = [int(ttft * 1000 + k * gap_ms * 1000) for k in range(n)]
    return {"stage": stage, "index": i, "worker": 0, "phase": "measure", "ok": True, "status": 200, "ttft_ms": ttft,
            "tpot_ms": gap_ms, "e2e_ms": tokens[-1] / 1000, "output_tokens": n, "asked_tokens": n,
            "prompt_tokens": 64, "expected_prompt_tokens": 64, "count_method": "continuous-usage", "first_n": 1,
            "finish_reason": "length", "token_us": tokens, "t_send_us": i * 1000, "retried": False}


def _stage(name: str, labels: dict[str, Any], lines: list[dict[str, Any]], tok_s: float) -> dict[str, Any]:
    ttft = [x["ttft_ms"] for x in lines]
    gaps = [g for x in lines for g in R.itl_ms(x)]
    return {"name": name, "labels": labels, "load": {"concurrency": labels.get("concurrency", 1)}, "workers": 1,
            "summary": {"requests": len(lines), "ok": len(lines), "errors": 0, "window_s": 2.0,
                        "output_tok_s": tok_s, "requests_per_s": tok_s / 8, "ttft_ms": _stats(ttft),
                        "itl_ms": _stats(gaps), "tpot_ms": _stats([x["tpot_ms"] for x in lines]),
                        "e2e_ms": _stats([x["e2e_ms"] for x in lines]),
                        "stream_tok_s": _stats([1000 / x["tpot_ms"] for x in lines])}}


def _signed_run(suite: str, run_id: str, stages: list[tuple[str, dict[str, Any], float, float, float]],
                model: str = "tiny-model") -> Path:
    """A finished, signed run: stages of (name, labels, throughput, ttft, itl)."""
    directory = records.run_dir(suite, run_id)
    directory.mkdir(parents=True)
    lines, stage_records = [], []
    for name, labels, tok_s, ttft, gap in stages:
        mine = [_request(name, i, ttft + i * 0.5, gap) for i in range(12)]
        lines += mine
        stage_records.append(_stage(name, labels, mine, tok_s))
    record = {**records.header(suite, run_id), "status": "completed", "started_at": "2026-12-04T01:00:00+0000",
              "finished_at": "2026-12-04T01:01:00+0000", "params": {"seed": 0}, "metralectl_version": "0.1.0",
              "target": {"url": "http://127.0.0.1:8888", "model": model, "recipe": HOSTILE,
                         "engine": {"name": "llama-cpp", "source": "detected", "version": "b1"},
                         "hardware_class": "cpu"},
              "stages": stage_records, "summary": {"headline": {}}}
    (directory / "run.json").write_text(json.dumps(record))
    records.append_requests(directory, lines)
    assert signed.sign_run(directory, record) is None
    return directory


@pytest.fixture
def runs() -> dict[str, Path]:
    sweep = _signed_run("concurrency-sweep", "20261204-010000-aaaaaa",
                        [(f"c={c} {HOSTILE}", {"concurrency": c, "isl": 64, "osl": 8}, 100.0 * c, 10.0 * c, 2.0 + c)
                         for c in (1, 2, 4)], model=HOSTILE)
    depth = _signed_run("depth", "20261204-010100-bbbbbb",
                        [(f"d={d}", {"depth": d, "isl": 64, "osl": 8}, 90.0, 5.0 + d / 100, 3.0 + d / 1000)
                         for d in (0, 4096, 16384)])
    versus = records.run_dir("versus", "20261204-010200-cccccc")
    versus.mkdir(parents=True)
    from metralectl.bench import versus as VS

    sweep_record = json.loads((sweep / "run.json").read_text())
    doc = {"schema": 1, "kind": VS.KIND, "run_id": versus.name, "suite": "versus", "compared_suite": "decode",
           "status": "completed", "repeats": 2, "a": {"recipe": HOSTILE, "runs": [VS.reference(sweep_record, sweep)]},
           "b": {"recipe": "b-recipe", "runs": []},
           "rows": VS.rows([sweep_record, sweep_record], [sweep_record, sweep_record], [100.0, 110.0], [90.0, 95.0])}
    (versus / "run.json").write_text(json.dumps(doc))
    assert signed.sign_run(versus, doc) is None
    return {"sweep": sweep, "depth": depth, "versus": versus}


def _load(*dirs: Path) -> list[R.ReportRun]:
    return R.load([d.name for d in dirs], known_keys())


class _Strict(HTMLParser):
    """Every element closed in order (void elements aside); the tags and ids seen."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: list[str] = []
        self.ids: set[str] = set()
        self.problems: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.ids.update(v for k, v in attrs if k == "id" and v)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.ids.update(v for k, v in attrs if k == "id" and v)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()


def test_a_report_is_made_from_signed_runs_only(runs: dict[str, Path]) -> None:
    with pytest.raises(NotFound):
        R.load(["20991231-000000-ffffff"], known_keys())
    (runs["depth"] / "run.json.sig").unlink()
    with pytest.raises(SignatureInvalid, match="not signed"):
        _load(runs["depth"])
    with (runs["sweep"] / "requests.jsonl").open("a") as f:
        f.write(json.dumps(_request("c=1", 99, 1.0, 1.0)) + "\n")
    with pytest.raises(SignatureInvalid, match="timings changed"):
        _load(runs["sweep"])


def test_html_is_one_file_with_every_plot_and_the_signature_state(runs: dict[str, Path]) -> None:
    loaded = _load(runs["sweep"], runs["depth"], runs["versus"])
    svgs = V.plots(loaded)
    assert set(svgs) == {"throughput-ttft", "throughput-itl", "ttft-cdf", "itl-cdf", "depth-pp", "depth-tg",
                         f"versus-{runs['versus'].name}"}
    page = V.html(loaded, svgs, "now", "0.1.0")
    parser = _Strict()
    parser.feed(page)
    parser.close()
    assert not parser.problems and parser.stack == [], (parser.problems, parser.stack)
    assert {f"fig-{stem}" for stem in svgs} <= parser.ids and "stages" in parser.ids
    assert "script" not in parser.tags and "img" not in parser.tags  # nothing run, nothing fetched
    assert "http" not in page.replace("http://www.w3.org/2000/svg", "").replace("http://127.0.0.1:8888", "")
    assert page.count("good signature by") == 3 and "timings checked" in page
    for svg in svgs.values():
        ET.fromstring(svg)  # each plot is well-formed XML (so also as a .svg file)


def test_text_from_records_is_escaped_everywhere(runs: dict[str, Path]) -> None:
    loaded = _load(runs["sweep"], runs["versus"])
    svgs = V.plots(loaded)
    page = V.html(loaded, svgs, "now", "0.1.0")
    for text in (page, *svgs.values()):
        assert "<script" not in text and "<img" not in text
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&lt;img" in page


def test_depth_curves_follow_the_depth_records_shape(runs: dict[str, Path]) -> None:
    """pp/tg per depth: the stage's own pp_tok_s/tg_tok_s when it records them, else derived (module doc)."""
    loaded = _load(runs["depth"])
    curves = R.depth_curves(loaded)
    (name, tg), = curves["tg"]
    assert [x for x, _, _ in tg] == [0.0, 4096.0, 16384.0] and name == runs["depth"].name
    (_, pp), = curves["pp"]
    stage = loaded[0].record["stages"][1]
    assert pp[1][1] == pytest.approx((4096 + 64) / (stage["summary"]["ttft_ms"]["p50"] / 1000))
    stage["summary"].update({"pp_tok_s": 1234.0, "tg_tok_s": 56.0})
    curves = R.depth_curves(loaded)
    assert curves["pp"][0][1][1][1] == 1234.0 and curves["tg"][0][1][1][1] == 56.0


def test_csv_has_the_documented_columns(runs: dict[str, Path]) -> None:
    loaded = _load(runs["sweep"], runs["depth"])
    stages = list(csv.DictReader(io.StringIO(R.stages_csv(loaded))))
    assert tuple(stages[0]) == R.STAGE_COLUMNS and len(stages) == 6
    assert stages[2]["label_concurrency"] == "4" and stages[3]["label_depth"] == "0"
    assert float(stages[0]["ttft_ms_p50"]) == loaded[0].record["stages"][0]["summary"]["ttft_ms"]["p50"]
    rows = list(csv.DictReader(io.StringIO(R.requests_csv(loaded))))
    assert tuple(rows[0]) == R.REQUEST_COLUMNS and len(rows) == 6 * 12
    assert float(rows[0]["itl_ms_p50"]) == pytest.approx(3.0)  # c=1: token gaps of 3 ms
    docs = (REPO / "docs/bench.md").read_text()
    for column in (*R.STAGE_COLUMNS, *R.REQUEST_COLUMNS):
        assert f"`{column}`" in docs, column


def test_br_v0_2_export_is_valid_against_llm_d_schema(runs: dict[str, Path]) -> None:
    loaded = _load(runs["sweep"], runs["depth"], runs["versus"])
    docs = br.reports(loaded, "0.1.0")
    assert len(docs) == 6  # one per stage; the comparison has none of its own
    for doc in docs:
        assert validate(doc, SCHEMA) == []
        assert doc["version"] == "0.2"
    first = docs[0]["results"]["request_performance"]["aggregate"]
    assert first["requests"] == {**first["requests"], "total": 12, "failures": 0}
    assert first["latency"]["time_to_first_token"]["units"] == "s"
    assert first["latency"]["time_to_first_token"]["p50"] == pytest.approx(
        loaded[0].record["stages"][0]["summary"]["ttft_ms"]["p50"] / 1000)
    assert docs[0]["scenario"]["load"]["standardized"]["concurrency"] == 1
    broken = json.loads(json.dumps(docs[0]))
    broken["results"]["request_performance"]["aggregate"]["latency"]["time_to_first_token"]["units"] = "hours"
    assert validate(broken, SCHEMA)  # the validator does say no


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ), timeout=180)


def test_cli_end_to_end_on_a_real_run(tmp_path: Path) -> None:
    with truth_server("--ttft-ms", "5", "--itl-ms", "2") as url:
        run = _cli("bench", "run", "concurrency-sweep", "--url", url, "-p", "concurrencies=1,2", "-p", "isls=32",
                   "-p", "osl=16", "-p", "duration_s=1", "-p", "warmup_s=0.2", "-p", "client_bound=warn", "--json")
    assert run.returncode == 0, run.stderr
    run_id = json.loads(run.stdout)["run_id"]
    out = tmp_path / "out"
    out.mkdir()
    done = _cli("bench", "report", run_id, "--html", str(out / "r.html"), "--svg", str(out / "svg"),
                "--csv", str(out / "r.csv"), "--br", str(out / "br"), "--json")
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["runs"][0]["run_id"] == run_id and said["runs"][0]["signature"].startswith("good signature")
    assert len(said["stages"]) == 2 and str(out / "r.html") in said["written"] and len(said["written"]) == 9
    assert {p.name for p in (out / "svg").iterdir()} == {"throughput-ttft.svg", "throughput-itl.svg",
                                                         "ttft-cdf.svg", "itl-cdf.svg"}
    brs = sorted((out / "br").iterdir())
    assert len(brs) == 2 and all(validate(json.loads(p.read_text()), SCHEMA) == [] for p in brs)
    requests = list(csv.DictReader((out / "r.requests.csv").open()))
    measured = [r for r in requests if r["phase"] == "measure"]
    total = json.loads(run.stdout)["stages"]
    assert len(measured) == sum(s["summary"]["requests"] for s in total)  # every request counted
    # a changed record: exit 1, and nothing written
    directory = records.find(run_id)
    (directory / "requests.jsonl").write_text("")
    again = _cli("bench", "report", run_id, "--html", str(tmp_path / "again.html"))
    assert again.returncode == ExitCode.FAILED and "does not verify" in again.stderr
    assert not (tmp_path / "again.html").exists()
    missing = _cli("bench", "report", "20991231-000000-ffffff", "--html", str(tmp_path / "none.html"))
    assert missing.returncode == ExitCode.USAGE and "no benchmark run" in missing.stderr


def test_png_without_a_browser_says_so_and_exits_69(runs: dict[str, Path], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METRALE_CHROMIUM", str(tmp_path / "no-chromium"))
    out = _cli("bench", "report", runs["sweep"].name, "--png", str(tmp_path / "png"))
    assert out.returncode == ExitCode.UNAVAILABLE and "headless Chromium" in out.stderr and "--svg" in out.stderr
