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


def test_a_swap_in_the_middle_of_a_sweep_invalidates_it(box: Box) -> None:
    """Seen by a user: a swap during a concurrency sweep gave '✔ 27/1121 ok', verdict none, exit 0, and a record
    naming the old model for every stage. Now the run fails, says the model changed, and stops measuring."""
    import time
    from pathlib import Path

    first = box.recipe("sweep-a")
    second = box.recipe("sweep-b", extra="serve:\n  model-name: the-other-model\n")
    box.weights_complete()
    box.cli("run", first, check=True)
    try:
        sweep = box.popen("bench", "run", "concurrency-sweep", "-p", "concurrencies=2,2,2", "-p", "duration_s=8",
                          "-p", "warmup_s=0.5", "-p", "isls=16", "-p", "osl=16", "-p", "client_bound=warn",
                          "--format", "json")
        runs = Path(box.env["METRALE_HOME"]) / "runs" / "concurrency-sweep"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list(runs.glob("*/run.json")):
            time.sleep(0.1)
        time.sleep(2.0)  # the swap's outage and its new model land inside the sweep's three 8 s rungs
        swapped = box.cli("swap", second, timeout=180)
        assert swapped.returncode == 0, swapped.stderr
        out, err = sweep.communicate(timeout=180)
    finally:
        box.cli("stop", "--all")
    assert sweep.returncode == 1, err + "\nSWAP:\n" + swapped.stdout + swapped.stderr
    record = json.loads(out)
    assert record["status"] == "invalid" and "the served model changed" in record["error"], record["error"]
    changed_at = len(record["stages"])
    assert changed_at < 3 and f"at stage {changed_at}" in record["error"]  # nothing measured after the change
    assert "invalid: the served model changed" in err and "benchmark invalid" in err
