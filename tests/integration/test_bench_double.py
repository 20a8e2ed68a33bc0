"""`metralectl bench run decode` against the engine double served by `metralectl run` in a real container,
and `--self-start`, which serves a recipe, benchmarks it and tears it down."""

from __future__ import annotations

import json

import pytest

from tests.integration.conftest import Box

pytestmark = [pytest.mark.docker, pytest.mark.integration]


def test_bench_decode_against_the_served_double(box: Box) -> None:
    name = box.recipe("bench")
    box.weights_complete()
    box.cli("run", name, check=True)
    try:
        out = box.cli("bench", "run", "decode", "-p", "repeats=3", "-p", "max_tokens=32", "--format", "json")
        assert out.returncode == 0, out.stderr
        record = json.loads(out.stdout)
        target = record["target"]
        assert target["recipe"] == name and target["spec_hash"] and target["image_revision"].startswith("test-double-")
        assert target["hardware_class"] == "test-double" and target["serve_config_digests"]["args_sha256"]
        measured = record["stages"][0]["summary"]
        assert measured["ok"] == 3 and measured["errors"] == 0
        # the double: ~5 ms per token (its writes are not NODELAY, so not exact); reasoning counts as generated
        headline = record["summary"]["headline"]
        assert 120 < headline["decode_tok_s_p50"] < 300 and headline["output_tokens_p50"] == 32
        assert record["gate_notes"] and record["verdict"] == "none"  # no validated number to gate on here
    finally:
        box.cli("stop", name)
    started = box.cli("bench", "run", "decode", "--self-start", name, "-p", "repeats=2", "-p", "max_tokens=8",
                      "--format", "json", timeout=180)
    assert started.returncode == 0, started.stderr
    record = json.loads(started.stdout)
    assert record["self_started"]["recipe"] == name and record["target"]["recipe"] == name
    assert box.containers() == []  # torn down
