"""`metralectl top --once --json` against the engine test double served by `metralectl run` in a real
container: the engine is found through the container's endpoint label, and the numbers are parsed from
the container's real /metrics — before any request, while one is in flight, after a few completions."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from tests.integration.conftest import Box

pytestmark = [pytest.mark.docker, pytest.mark.integration]


def top_engine(box: Box, name: str, *args: str) -> dict[str, Any]:
    """Our engine's entry in `top --once --json` (other tests' containers may share this daemon)."""
    out = box.cli("top", "--once", "--json", *args, check=True, timeout=60)
    data = json.loads(out.stdout)
    assert data["schema"] == 1
    ours = [e for e in data["engines"] if e["recipe"] == name]
    assert len(ours) == 1, data["engines"]
    return ours[0]


def chat(url: str, text: str, **extra: Any) -> dict[str, Any]:
    reply = httpx.post(f"{url}/chat/completions", timeout=60,
                       json={"model": "x", "messages": [{"role": "user", "content": text}], **extra})
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def test_top_reads_the_served_engines_metrics(box: Box) -> None:
    name = box.recipe("top")
    box.weights_complete()
    launched = box.cli("run", name, "--detach", check=True)
    url = launched.stdout.split("endpoint  ")[1].split()[0]  # …/v1
    base = url.removesuffix("/v1")

    idle = top_engine(box, name, "--interval", "0.3")
    assert idle["source"] == "container" and idle["url"] == base and idle["state"] == "ok"
    assert idle["name"].startswith("metralectl-") and idle["error"] is None
    assert idle["requests_active"] == 0
    assert idle["totals"]["requests"] == 0 and idle["totals"]["generation_tokens"] == 0
    assert idle["tokens_per_s"] == 0.0

    replies = [chat(url, f"hello number {i}", max_tokens=5) for i in range(3)]
    generated = sum(r["usage"]["completion_tokens"] for r in replies)
    after = top_engine(box, name, "--interval", "0.3")
    assert after["requests_active"] == 0
    assert after["totals"]["requests"] == 3 and after["totals"]["generation_tokens"] == generated > 0
    assert after["totals"]["prompt_tokens"] > 0
    assert after["lifetime"]["ttft_count"] == 3 and after["ttft_p50_s"] > 0
    assert after["ttft_scope"] == "lifetime"

    # one long request in flight while top looks: the gauge, not a counter, shows it
    long_reply: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: long_reply.update(chat(url, "a long one", max_tokens=1500,
                                                                    ignore_eos=True)))
    worker.start()
    try:
        deadline = time.monotonic() + 5
        busy = top_engine(box, name, "--interval", "0.2")
        while busy["requests_active"] == 0 and time.monotonic() < deadline and worker.is_alive():
            busy = top_engine(box, name, "--interval", "0.2")
        assert busy["requests_active"] == 1, busy
        assert busy["totals"]["requests"] == 3  # counted when it finishes
    finally:
        worker.join(60)
    assert long_reply["usage"]["completion_tokens"] == 1500

    # requests finishing during the interval: a token rate
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            chat(url, "keep going", max_tokens=10, ignore_eos=True)

    loader = threading.Thread(target=load)
    loader.start()
    try:
        loaded = top_engine(box, name, "--interval", "2")
    finally:
        stop.set()
        loader.join(30)
    assert loaded["tokens_per_s"] > 0 and loaded["window"]["requests_per_s"] > 0
    assert loaded["totals"]["generation_tokens"] >= generated + 1500
    assert loaded["window"]["counter_reset"] is False

    box.cli("stop", name, check=True)
    gone = json.loads(box.cli("top", "--once", "--json", "--interval", "0.1", check=True).stdout)
    assert all(e["recipe"] != name for e in gone["engines"])
