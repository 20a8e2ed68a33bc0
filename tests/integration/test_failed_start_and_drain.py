"""Issue 19 items 11-12 against a real Docker daemon and the engine double: a failed start says the engine's
own last error line and its kept log is reachable through `logs`; a swap's drain is shown as draining, with
the requests in flight."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

from tests.integration.conftest import Box


def test_a_failed_start_quotes_the_engine_and_its_log_stays_reachable(box: Box) -> None:
    name = box.recipe("crash", image="exit-at-start")
    box.weights_complete()
    out = box.cli("run", name, timeout=60)
    assert out.returncode == 1 and "start failed (exited)" in out.stderr, out.stderr
    # the engine's own words, not just "exited with code 1"
    assert "failed to start: DOUBLE_FAULT=exit-at-start" in out.stderr.split("start failed (exited)")[1], out.stderr
    assert box.containers() == []

    logs = box.cli("logs", name)
    assert logs.returncode == 0, logs.stderr
    assert "failed to start: DOUBLE_FAULT=exit-at-start" in logs.stdout
    assert f"no container serves {name}; this is the log of its failed start" in logs.stderr
    last = box.cli("logs", "--last-failed")
    assert last.returncode == 0 and last.stdout == logs.stdout
    never = box.cli("logs", box.recipe("never-ran"))  # a recipe that never ran: nothing served, nothing kept
    assert never.returncode == 1 and "is not being served" in never.stderr and "no failed start of" in never.stderr, never.stderr
    unknown = box.cli("logs", f"{box.prefix}-no-such-recipe")  # no recipe at all: the catalog's answer
    assert unknown.returncode == 64 and "no recipe named" in unknown.stderr, unknown.stderr


def test_logs_of_the_one_kept_container_needs_no_name(box: Box) -> None:
    name = box.recipe("kept", image="exit-at-start")
    box.weights_complete()
    assert box.cli("run", name, "--keep-failed", timeout=60).returncode == 1
    assert len(box.containers()) == 1
    out = box.cli("logs")
    assert out.returncode == 0 and "DOUBLE_FAULT=exit-at-start" in out.stdout, out.stderr
    assert "several metralectl containers" not in out.stderr


def _slow_token_image(box: Box) -> str:
    """The double with 150 ms between tokens (a variant image, like conftest's), registered in this box."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docker_image"))
    import bundle

    tag = bundle.build_variant(bundle.variant_tag("itl150"), {"DOUBLE_ITL_MS": "150"})
    (box.config / "images" / "double-itl150.yaml").write_text(
        f"schema: 1\nid: double-itl150\nref: {tag}\nengine: metrale\nhardware: [hopper]\n"
        "platform: linux/amd64\nrevision-label: org.opencontainers.image.revision\n")
    return "itl150"


def test_a_swap_drains_in_view_with_the_requests_in_flight(box: Box) -> None:
    old = box.recipe("old", image=_slow_token_image(box))
    new = box.recipe("new")
    box.weights_complete()
    run = box.cli("run", old, check=True, timeout=120)
    url = run.stdout.split("endpoint  ")[1].split()[0].removesuffix("/v1")
    finished: list[int] = []

    def slow_request() -> None:
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}).encode()
        request = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            finished.append(answer.status)

    worker = threading.Thread(target=slow_request)
    worker.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the request is in flight once the engine counts it
        metrics = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
        if "metrale_requests_active 1" in metrics:
            break
        time.sleep(0.05)
    swap = box.cli("swap", new, timeout=180)
    worker.join(timeout=60)
    assert swap.returncode == 0, swap.stderr
    assert "draining" in swap.stderr and "1 request in flight" in swap.stderr, swap.stderr
    assert finished == [200]  # the in-flight request finished before the old engine went
