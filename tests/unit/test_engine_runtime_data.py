"""What the engine files drive at run time: log prefixes and failure signatures, the metrics mapping, the
readiness style's extra condition (through the one waiting loop), and prompt sizing on an engine whose
/tokenize reads no `messages`.
The llama.cpp lines and series are the real server's (tests/real_llamacpp/README.md); the HTTP server
here is ours, a fake for the unit level."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dataclasses
import pytest

from metralectl.core.catalog import load_catalog
from metralectl.core.contract import EngineContract
from metralectl.core.render import ContainerSpec
from metralectl.lifecycle.boot import BootLog
from metralectl.lifecycle.events import Event, LogLine
from metralectl.lifecycle.logfollow import Watched
from metralectl.lifecycle.readiness import BootClock, wait_ready
from metralectl.seams.endpoint import EngineClient, requests_active
from metralectl.telemetry.engine_metrics import engine_rates, mapping_for, parse_metrics
from tests.fakes.runtime import Boot, FakeRuntime, Listen, Log, image
from tests.ports import own_port

LLAMA_LOAD_FAILURE = """\
0.00.006.672 I srv    load_model: loading model 'metralectl-test/damaged-llama-gguf:Q8_0'
0.00.006.761 E gguf_init_from_reader: invalid magic characters: 'not ', expected 'GGUF'
0.00.006.857 E llama_model_load: error loading model: llama_model_loader: failed to load model from /x.gguf
0.00.006.892 E common_fit_params: encountered an error while trying to fit params to free device memory: failed to load model
0.00.007.755 E srv  llama_server: exiting due to model loading error"""

LLAMA_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total {prompt}
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total {predicted}
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 812.5
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing {active}
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total {drafted}
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total {accepted}
"""


@pytest.fixture(scope="module")
def engines() -> dict[str, EngineContract]:
    return load_catalog(use_cache=False, include_user=False).engines


def _llama_text(prompt: int = 100, predicted: int = 400, active: int = 2, drafted: int = 0, accepted: int = 0) -> str:
    return LLAMA_METRICS.format(prompt=prompt, predicted=predicted, active=active, drafted=drafted, accepted=accepted)


def test_llama_log_lines_give_phases_and_the_most_specific_failure(engines: dict[str, EngineContract]) -> None:
    log = BootLog(engines["llama-cpp"], "127.0.0.1", 8080)
    phases = [log.feed(line) for line in LLAMA_LOAD_FAILURE.splitlines()]
    assert phases[0] == "loading"
    assert log.failure is not None and log.failure.cause == "corrupt-weights"  # not the generic line after it
    assert log.failure.message.startswith("gguf_init_from_reader: invalid magic")  # the prefix is cut off


def test_llama_ready_line_counts_only_for_our_port(engines: dict[str, EngineContract]) -> None:
    log = BootLog(engines["llama-cpp"], "127.0.0.1", 8080)
    assert log.feed("0.00.481.567 I srv  llama_server: listening on http://127.0.0.1:9999") is None
    assert log.feed("0.00.481.567 I srv  llama_server: listening on http://127.0.0.1:8080") == "ready"
    assert log.ready_line_seen


def test_llama_metrics_read_through_its_mapping(engines: dict[str, EngineContract]) -> None:
    maps = [c.metrics for c in engines.values()]
    snap = parse_metrics(_llama_text(), t=0.0, candidates=maps)
    assert snap.engine == "llama-cpp"
    assert (snap.requests_active, snap.requests_waiting, snap.generation_tokens_total) == (2, 1, 400)
    assert snap.stream_tokens_per_s == 812.5 and snap.prompt_tokens_total == 100
    later = parse_metrics(_llama_text(prompt=300, predicted=1400, drafted=100, accepted=60), t=2.0, candidates=maps)
    rates = engine_rates(snap, later)
    assert rates.generation_tokens_per_s == 500 and rates.prompt_tokens_per_s == 100
    assert rates.spec_acceptance == pytest.approx(0.6)


def test_a_caller_that_names_no_engine_reads_through_every_catalog_engine(engines: dict[str, EngineContract],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """No candidates given: every catalog engine's mapping is tried (a vLLM scrape reads as vLLM's); a catalog that
    cannot be read leaves the scrape an unknown engine's, never another engine's."""
    from metralectl.errors import MetralError
    from metralectl.telemetry import engine_metrics

    vllm = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"
    assert engine_metrics.parse_metrics(vllm).engine == "vllm"

    def broken() -> None:
        raise MetralError("the catalog cannot be read")

    monkeypatch.setattr("metralectl.core.catalog.load_catalog", broken)
    assert engine_metrics.parse_metrics(vllm).engine == "unknown"


def test_metrale_text_still_reads_as_metrale(engines: dict[str, EngineContract]) -> None:
    text = "metrale_requests_active 3\nmetrale_generation_tokens_total 10\n"
    maps = [c.metrics for c in engines.values()]
    assert mapping_for(["metrale_requests_active"], maps) == engines["metrale"].metrics
    snap = parse_metrics(text, candidates=maps)
    assert snap.engine == "metrale" and snap.requests_active == 3
    assert parse_metrics(text).requests_active == 3  # no candidates: Metrale's names, as before


def test_swap_drain_reads_the_engines_own_active_series(engines: dict[str, EngineContract]) -> None:
    names = engines["llama-cpp"].metrics.names("requests-active")
    assert requests_active(_llama_text(active=4), names) == 4
    assert requests_active(_llama_text(active=4), engines["metrale"].metrics.names("requests-active")) is None


def _wait(contract: EngineContract, url: str, boot: Boot, port: int, tmp_path: Path, events: list[Event]) -> None:
    """A container running `boot`, waited for by the one readiness loop (lifecycle/readiness.py) on `url`."""
    runtime = FakeRuntime(images=[image("img")])
    runtime.script("c", boot)
    container = runtime.create_and_start(ContainerSpec(name="c", image="img", command=(), port=port))
    watched = Watched(0, runtime, container.id, BootLog(contract, "127.0.0.1", port), tmp_path / "boot.log")
    wait_ready([watched], url, contract.readiness, BootClock(time.monotonic(), 30.0, 30.0), events.append)


def test_warm_up_marker_style_waits_for_its_line(engines: dict[str, EngineContract], tmp_path: Path) -> None:
    base = engines["metrale"]
    marker = re.compile(r"The server is fired up and ready to roll!")
    contract = dataclasses.replace(base, readiness=dataclasses.replace(base.readiness, style="warm-up-marker",
                                                                        marker=marker))
    events: list[Event] = []
    port = own_port()
    boot = Boot((Listen(200, {"status": "ready"}), Log("2026-08-26T05:35:05Z  INFO Server live and ready at "
                                                       "127.0.0.1:{port} running m", after_s=0.1),
                 Log("2026-08-26T05:35:06Z  INFO The server is fired up and ready to roll!", after_s=0.8)))
    _wait(contract, f"http://127.0.0.1:{port}", boot, port, tmp_path, events)
    lines = [e.line for e in events if isinstance(e, LogLine)]
    assert "fired up" in lines[-1]  # healthy and its ready line logged: still not ready until the marker
    assert sum(1 for e in events if "warm-up" in str(e)) == 1


FIRED_UP = "The server is fired up and ready to roll!"


@pytest.mark.parametrize(("style", "waits_for_the_line", "asks_for_an_answer"), [
    ("health-when-loaded", False, False), ("warm-up-marker", True, False), ("lazy-load", False, True)])
def test_each_readiness_style_waits_its_own_way(engines: dict[str, EngineContract], tmp_path: Path, style: str,
                                                waits_for_the_line: bool, asks_for_an_answer: bool) -> None:
    """One boot (health ready at once, the warm-up line 2 s later), waited for in each style: health-when-loaded
    is ready on the health answer, warm-up-marker only after the line, lazy-load once one real request is answered."""
    base = engines["metrale"]
    marker = re.compile(re.escape(FIRED_UP)) if style == "warm-up-marker" else None
    contract = dataclasses.replace(base, readiness=dataclasses.replace(base.readiness, style=style, marker=marker))
    events: list[Event] = []
    port = own_port()
    boot = Boot((Listen(200, {"status": "ready", "model": "m"}), Log("2026-08-26T05:35:06Z  INFO " + FIRED_UP,
                                                                     after_s=2.0)))
    _wait(contract, f"http://127.0.0.1:{port}", boot, port, tmp_path, events)
    said = [str(e) for e in events]
    assert any(FIRED_UP in e.line for e in events if isinstance(e, LogLine)) == waits_for_the_line
    assert sum("waiting for the engine's warm-up line" in e for e in said) == (1 if waits_for_the_line else 0)
    assert sum("asking for one answer" in e for e in said) == (1 if asks_for_an_answer else 0)


class _Engine(BaseHTTPRequestHandler):
    """Answers like llama-server: /tokenize reads `content` only; /apply-template renders ChatML."""

    answered = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._send(200 if self.path == "/health" else 404, {"status": "ok"})

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        if self.path == "/tokenize":
            content = body.get("content", "")
            self._send(200, {"tokens": list(range(len(content.split())))})  # one token per word here
        elif self.path == "/apply-template":
            chat = " ".join(f"<|im_start|> {m['role']} {m['content']} <|im_end|>" for m in body["messages"])
            self._send(200, {"prompt": chat + " <|im_start|> assistant"})
        elif self.path == "/v1/chat/completions":
            type(self).answered += 1
            self._send(200, {"choices": [{"message": {"content": "x"}}]})
        else:
            self._send(404, {})

    def _send(self, status: int, data: Any) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture()
def fake_engine() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_prompt_sizing_uses_the_engines_template_when_tokenize_ignores_messages(fake_engine: str) -> None:
    with EngineClient(fake_engine) as client:
        count = client.tokenize_messages("m", [{"role": "user", "content": "three little words"}])
    assert count == 8  # <|im_start|> user three little words <|im_end|> <|im_start|> assistant: 8 words


def test_lazy_load_style_asks_for_one_answer(engines: dict[str, EngineContract], fake_engine: str,
                                             tmp_path: Path) -> None:
    base = engines["llama-cpp"]
    contract = dataclasses.replace(base, readiness=dataclasses.replace(base.readiness, style="lazy-load"))
    before = _Engine.answered
    _wait(contract, fake_engine, Boot(), own_port(), tmp_path, [])
    assert _Engine.answered == before + 1  # asked once, remembered
