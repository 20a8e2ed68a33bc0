"""Every benchmark record is signed with the box's key; any change to it or its timings fails verification."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from metralectl.bench import signed
from metralectl.peers.store import known_keys
REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path) -> Path:
    directory = tmp_path / "runs" / "decode" / "r1"
    directory.mkdir(parents=True)
    record = {"run_id": "r1", "suite": "decode", "requests_file": "requests.jsonl",
              "target": {"recipe": "qwen3.5-35b-a3b", "spec_hash": "abc", "image_revision": "deadbeef"},
              "summary": {"headline": {"decode_tok_s": 131.0}}}
    (directory / "run.json").write_text(json.dumps(record))
    (directory / "requests.jsonl").write_text('{"ttft_ms": 42.0}\n')
    assert signed.sign_run(directory, record) is None
    return directory


def test_signed_record_verifies_and_names_what_it_covers(tmp_path: Path) -> None:
    verdict = signed.verify_run(_run(tmp_path), known_keys())
    assert verdict.ok, verdict.reason
    assert verdict.names["recipe"] == "qwen3.5-35b-a3b" and verdict.names["image_revision"] == "deadbeef"


def test_a_changed_byte_in_the_record_fails(tmp_path: Path) -> None:
    directory = _run(tmp_path)
    record = directory / "run.json"
    record.write_text(record.read_text().replace("131.0", "141.0"))
    assert not signed.verify_run(directory, known_keys()).ok


def test_changed_timings_fail(tmp_path: Path) -> None:
    directory = _run(tmp_path)
    (directory / "requests.jsonl").write_text('{"ttft_ms": 12.0}\n')
    verdict = signed.verify_run(directory, known_keys())
    assert not verdict.ok and "timings changed" in verdict.reason


def test_bench_verify_cli(tmp_path: Path) -> None:
    directory = _run(tmp_path)
    env = {**os.environ}
    ok = subprocess.run([sys.executable, "-m", "metralectl", "bench", "verify", str(directory / "run.json")],
                        capture_output=True, text=True, env=env, cwd=REPO)
    assert ok.returncode == 0 and "signed by" in ok.stdout
    (directory / "run.json").write_text((directory / "run.json").read_text() + " ")
    bad = subprocess.run([sys.executable, "-m", "metralectl", "bench", "verify", str(directory / "run.json")],
                         capture_output=True, text=True, env=env, cwd=REPO)
    assert bad.returncode == 1 and "NOT VERIFIED" in bad.stderr
