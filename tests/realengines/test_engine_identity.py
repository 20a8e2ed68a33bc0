"""`metralectl bench` names the engine it measured, against the real `transformers serve` (which metralectl does
not serve, so the engine is what the server's answers show: bench/engine_id.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.realengines.transformers_serve import TfServe, _version_tuple

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_a_bench_record_names_transformers_serve_from_its_own_routes(tfserve: TfServe) -> None:
    run = subprocess.run([sys.executable, "-m", "metralectl", "bench", "run", "decode", "--url", tfserve.url,
                          "-p", "repeats=1", "-p", "warmup=0", "-p", "max_tokens=8", "--format", "json"],
                         capture_output=True, text=True, cwd=REPO, env=dict(os.environ), timeout=600)
    assert run.returncode == 0, run.stderr
    engine = json.loads(run.stdout)["target"]["engine"]
    if _version_tuple(tfserve.versions["transformers"]) < (5, 5):
        # before 5.5 `serve` had other routes: unknown is an honest answer there, another engine's name is not
        assert engine["name"] in (None, "transformers") and engine["detected"] in (None, "transformers"), engine
        return
    assert (engine["name"], engine["source"], engine["detected"]) == ("transformers", "detected", "transformers")
    assert engine["evidence"] == "GET /openapi.json: transformers serve's routes /load_model, /reset", engine
    shown = subprocess.run([sys.executable, "-m", "metralectl", "bench", "show", json.loads(run.stdout)["run_id"]],
                           capture_output=True, text=True, cwd=REPO, env=dict(os.environ), timeout=120)
    assert "\nengine    transformers (detected: GET /openapi.json" in shown.stdout, shown.stdout
